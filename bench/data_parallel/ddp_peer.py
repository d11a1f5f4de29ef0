#!/usr/bin/env python3
"""PyTorch DDP (gloo, CPU) peer of bench_dp: the same MLP shape, batch and
bucket cap, measured the same way (median over steps of the slowest rank).

  compute   forward + backward of the plain module (no DDP)
  comm      all-reduce of the gradient volume in bucket-cap chunks (async
            launch, then wait): DDP's bucket traffic without compute
  step      forward + backward of the DDP module (reduction overlapped by
            DDP's autograd hooks)

Run under mpiexec (rank/size from OpenMPI's environment); MASTER_PORT must be
free on 127.0.0.1.  Prints one JSON object on rank 0.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--widths", default="512,1024,1024,1024,1024,512,16")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--cap-mb", type=float, default=25)
    a = p.parse_args()
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=size)
    widths = [int(w) for w in a.widths.split(",")]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.Tanh())
    torch.manual_seed(42)
    model = nn.Sequential(*layers)
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.rand(a.batch, widths[0], generator=gen) * 2 - 1
    y = (torch.rand(a.batch, widths[-1], generator=gen) * 2 - 1) * 0.5
    scale = 1.0 / a.batch
    ddp = DDP(model, bucket_cap_mb=a.cap_mb)
    grad_numel = sum(q.numel() for q in model.parameters())

    def run(step):
        times = []
        for s in range(a.warmup + a.steps):
            dist.barrier()
            model.zero_grad(set_to_none=False)
            t0 = time.perf_counter()
            step()
            dt = time.perf_counter() - t0
            if s >= a.warmup:
                times.append(dt)
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return statistics.median(t.tolist())

    def compute():
        loss = 0.5 * ((model(x) - y) ** 2).sum() * scale
        loss.backward()

    flat = torch.zeros(grad_numel)
    chunk = max(1, int(a.cap_mb * 1024 * 1024 / 4))

    def comm():
        works = [dist.all_reduce(flat[i:i + chunk], async_op=True)
                 for i in range(0, grad_numel, chunk)]
        for w in works:
            w.wait()

    def step():
        loss = 0.5 * ((ddp(x) - y) ** 2).sum() * scale
        loss.backward()

    t_compute = run(compute)
    t_comm = run(comm)
    t_step = run(step)
    if rank == 0:
        print(json.dumps({
            "impl": "torch-ddp-gloo", "torch": torch.__version__, "ranks": size,
            "widths": a.widths, "batch_per_rank": a.batch,
            "grad_mb": round(grad_numel * 4 / 1048576, 3), "cap_mb": a.cap_mb,
            "compute_ms": round(t_compute * 1e3, 3), "comm_ms": round(t_comm * 1e3, 3),
            "step_ms": round(t_step * 1e3, 3),
            "overlap_ratio": round((t_compute + t_comm - t_step) / min(t_compute, t_comm), 3),
            "samples_per_s": round(size * a.batch / t_step, 1)}))
    dist.barrier()
    # gloo's teardown can hang at interpreter exit under mpiexec; the
    # result is printed, so leave at once.
    import sys
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
