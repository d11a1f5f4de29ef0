"""Dense peer for bench_tp_mlp: the same MLP block (Linear H->F, Linear F->H,
no activation, float32) forward + backward in PyTorch on the CPU, one
thread, timed like the C++ benchmark (mean after two warm-up steps).

    /opt/tutti-venv/bin/python bench/tensor_parallel/torch_peer.py \
        [--hidden 512] [--ffn 2048] [--rows 16,128,512] [--iters 10]
"""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--rows", default="16,128,512")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    h, f = a.hidden, a.ffn
    fc1 = torch.nn.Linear(h, f)
    fc2 = torch.nn.Linear(f, h)
    print(f"# torch {torch.__version__} dense MLP H={h} F={f}, {a.threads} thread(s)")
    print(f"{'rows':>8} {'time_ms':>10} {'GFLOP/s':>9}")
    for rows in [int(r) for r in a.rows.split(",")]:
        x = torch.randn(rows, h, requires_grad=True)
        dy = torch.randn(rows, h)

        def step():
            y = fc2(fc1(x))
            y.backward(dy)

        for _ in range(2):
            step()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            step()
        t = (time.perf_counter() - t0) / a.iters
        print(f"{rows:>8} {t * 1e3:>10.3f} {12.0 * rows * h * f / t / 1e9:>9.2f}")


if __name__ == "__main__":
    main()
