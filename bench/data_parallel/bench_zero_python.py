"""tutti.torch.ZeroRedundancyOptimizer against the unsharded optimizer
behind tutti.torch DistributedDataParallel (CPU, float32 MLP, Adam).

    mpirun -np 2 python bench/data_parallel/bench_zero_python.py \
        [--width 512] [--layers 8] [--batch 32] [--steps 10] [--rounds 2]

Per configuration (unsharded Adam; ZeRO one broadcast per parameter; ZeRO
with parameters_as_bucket_view) one JSON line on rank 0: Adam state bytes
on each rank, the median over steps of the slowest rank's step time
(forward + backward with the overlapped all-reduce + optimizer step) and of
its optimizer step alone (for ZeRO: local step + broadcasts).  Rounds
alternate the configurations so that machine load hits them alike.
"""
import argparse
import json
import statistics
import time

import torch

import tutti.torch as hvd
from bench_bucket_view import make  # the same MLP (this script's directory is on sys.path)


def state_bytes(optimizer):
    return sum(v.numel() * v.element_size() for s in optimizer.state.values()
               for v in s.values() if torch.is_tensor(v))


def slowest(seconds):
    return max(hvd.allgather(torch.tensor([seconds], dtype=torch.float64)).tolist())


def run(args, mode, x):
    ddp = hvd.DistributedDataParallel(make(args.width, args.layers))
    if mode == "unsharded":
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-4)
        local = opt
    else:
        opt = hvd.ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.Adam, lr=1e-4,
                                          parameters_as_bucket_view=mode == "zero_bucket_view")
        local = opt.optim
    steps, opt_steps = [], []
    for step in range(args.warmup + args.steps):
        hvd.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        ddp(x).square().mean().backward()
        t1 = time.perf_counter()
        opt.step()
        t2 = time.perf_counter()
        if step >= args.warmup:
            steps.append(slowest(t2 - t0))
            opt_steps.append(slowest(t2 - t1))
    every = hvd.allgather(torch.tensor([state_bytes(local)], dtype=torch.int64)).tolist()
    params = sum(p.numel() for p in ddp.parameters())
    return {"mode": mode, "ranks": hvd.size(), "parameters": params,
            "state_bytes_per_rank": every, "step_ms": round(1e3 * statistics.median(steps), 2),
            "optimizer_step_ms": round(1e3 * statistics.median(opt_steps), 2)}


def main():
    ap = argparse.ArgumentParser()
    for name, default in dict(width=512, layers=8, batch=32, steps=10, warmup=2,
                              rounds=2).items():
        ap.add_argument(f"--{name}", type=int, default=default)
    args = ap.parse_args()
    hvd.init()
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(hvd.rank()))
    for r in range(args.rounds):
        for mode in ("unsharded", "zero_per_param", "zero_bucket_view"):
            out = run(args, mode, x)
            if hvd.rank() == 0:
                print(json.dumps(dict(out, round=r)), flush=True)


if __name__ == "__main__":
    main()
