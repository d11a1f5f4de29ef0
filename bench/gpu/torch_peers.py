#!/usr/bin/env python3
"""PyTorch (CUDA) peers of tutti's GPU benchmarks, in the same gpu_check.sh
run, with the ratio column filled from tutti's figures:

  unscale   torch._amp_foreach_non_finite_check_and_unscale_ (what
            torch.amp.GradScaler runs) on one tensor of n elements, kernel
            only and with found_inf.item() (tutti's unscale_and_check
            returns the flag to the host, so that is the like-for-like
            figure); ratio = torch time / tutti time, read from
            bench_gpu_kernels --tsv (> 1: tutti is faster)
  linear    the MLP block of bench_tp_mlp (Linear H->F, Linear F->H, no
            activation, float32) forward + backward with torch.nn.Linear;
            ratio = torch time / tutti's TP layers at TP 1 on the same GPU,
            read from `bench_tp_mlp --device cuda` output

    python3 bench/gpu/torch_peers.py [--tutti-tsv kernels.tsv]
        [--tp-out tp_mlp.txt] [--sizes 1M,16M,64M] [--rows 16,128,512,2048]

Times: CUDA events, median of --reps samples of --iters calls after three
warm-up calls.  Prints markdown.  Exits 77 without torch or a CUDA device.
"""
import argparse
import statistics
import sys


def parse_sizes(s):
    out = []
    for item in s.split(","):
        mult = {"K": 1024, "M": 1024 * 1024}.get(item[-1], 1)
        out.append(int(item.rstrip("KM")) * mult)
    return out


def median_ms(torch, fn, iters, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) / iters)
    return statistics.median(samples)


def read_tsv(path):
    """{(operation, elements): microseconds} from bench_gpu_kernels --tsv."""
    rows = {}
    if path:
        with open(path) as f:
            for line in f:
                op, n, us = line.rstrip("\n").split("\t")[:3]
                rows[(op, int(n))] = float(us)
    return rows


def read_tp(path):
    """{rows: ms} from bench_tp_mlp's table (lines starting with a number)."""
    out = {}
    if path:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0].isdigit():
                    out[int(parts[0])] = float(parts[1])
    return out


def ratio(peer, ours):
    return f"{peer / ours:.2f}" if ours else "n/a"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tutti-tsv")
    ap.add_argument("--tp-out")
    ap.add_argument("--sizes", default="1M,16M,64M")
    ap.add_argument("--rows", default="16,128,512,2048")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("no torch: skipped")
        return 77
    if not torch.cuda.is_available():
        print(f"torch {torch.__version__} sees no CUDA device: skipped")
        return 77
    dev = torch.device("cuda", 0)
    print(f"## torch peers: torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{torch.cuda.get_device_name(dev)}")
    tutti = read_tsv(a.tutti_tsv)

    print("\n### unscale + non-finite check: torch vs tutti\n")
    print("| dtype | elements | torch kernel µs | torch + .item() µs | tutti µs "
          "| ratio (torch+item / tutti) |")
    print("|---|---:|---:|---:|---:|---:|")
    for n in parse_sizes(a.sizes):
        for dtype, name in ((torch.float32, "float32"), (torch.float16, "float16"),
                            (torch.bfloat16, "bfloat16")):
            g = (torch.rand(n, device=dev) * 200 - 100).to(dtype)
            found = torch.zeros(1, device=dev)
            inv = [torch.full((1,), 0.5, device=dev), torch.full((1,), 2.0, device=dev)]
            k = [0]

            def kernel():
                torch._amp_foreach_non_finite_check_and_unscale_([g], found, inv[k[0] & 1])
                k[0] += 1

            def with_item():
                kernel()
                found.item()

            ours = tutti.get((f"unscale+check {name}, in place", n))
            try:
                t_kernel = median_ms(torch, kernel, a.iters, a.reps) * 1e3
            except (NotImplementedError, RuntimeError) as e:
                # torch 2.11's kernel has no bfloat16 case (GradScaler keeps
                # bf16 training unscaled): a row without a peer.
                print(f"| {name} | {n} | torch lacks it ({type(e).__name__}) | - | "
                      f"{'%.1f' % ours if ours else 'not run'} | - |")
                del g
                continue
            t_item = median_ms(torch, with_item, a.iters, a.reps) * 1e3
            print(f"| {name} | {n} | {t_kernel:.1f} | {t_item:.1f} | "
                  f"{'%.1f' % ours if ours else 'not run'} | {ratio(t_item, ours)} |")
            del g

    print("\n### MLP block forward + backward: torch.nn.Linear vs tutti TP layers (TP 1)\n")
    tp = read_tp(a.tp_out)
    h, f = a.hidden, a.ffn
    fc1 = torch.nn.Linear(h, f).to(dev)
    fc2 = torch.nn.Linear(f, h).to(dev)
    print(f"H={h} F={f}, float32, TF32 matmul "
          f"{'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}\n")
    print("| rows | torch ms | tutti ms | ratio (torch / tutti) |")
    print("|---:|---:|---:|---:|")
    for rows in [int(r) for r in a.rows.split(",")]:
        x = torch.randn(rows, h, device=dev, requires_grad=True)
        dy = torch.randn(rows, h, device=dev)

        def step():
            fc2(fc1(x)).backward(dy)

        t = median_ms(torch, step, a.iters, a.reps)
        ours = tp.get(rows)
        print(f"| {rows} | {t:.3f} | {'%.3f' % ours if ours else 'not run'} | "
              f"{ratio(t, ours)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
