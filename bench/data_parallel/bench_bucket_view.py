"""tutti.torch DistributedDataParallel step time with and without
gradient_as_bucket_view, in the same run (CPU, float32 MLP).

    mpirun -np 2 python bench/data_parallel/bench_bucket_view.py \
        [--width 1024] [--layers 8] [--batch 32] [--steps 15]

Per mode and zero_grad(set_to_none=...) choice: the median over steps of the
slowest rank's step time (forward + backward with the overlapped reduction +
SGD step) and the reducer's copy counters per step.  One JSON line per
configuration on rank 0.  Runs alternate between modes so that machine load
hits both alike.
"""
import argparse
import json
import time

import torch

import tutti
import tutti.torch as hvd


def make(width, layers):
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*mods)


def run(args, view, set_to_none, x):
    ddp = hvd.DistributedDataParallel(make(args.width, args.layers),
                                      gradient_as_bucket_view=view)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    times = []
    for step in range(args.warmup + args.steps):
        hvd.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=set_to_none)
        ddp(x).square().mean().backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    slowest = hvd.allreduce(torch.tensor(times, dtype=torch.float64), op=hvd.Max)
    s = ddp.reducer.stats()
    steps = s["steps"]
    return {"view": view, "set_to_none": set_to_none,
            "step_ms": round(float(slowest.median()) * 1e3, 2),
            "copied_in_mb_per_step": round(s["bytes_copied_in"] / steps / 2**20, 2),
            "copied_out_mb_per_step": round(s["bytes_copied_out"] / steps / 2**20, 2)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    hvd.init()
    torch.manual_seed(1 + hvd.rank())
    x = torch.randn(args.batch, args.width)
    grad_mb = args.layers * (args.width + 1) * args.width * 4 / 2**20
    for rnd in range(args.rounds):
        for set_to_none in (False, True):
            for view in (False, True):
                r = run(args, view, set_to_none, x)
                r.update(round=rnd, ranks=hvd.size(), grad_mb=round(grad_mb, 1),
                         torch_threads=torch.get_num_threads())
                if hvd.rank() == 0:
                    print(json.dumps(r), flush=True)
    tutti.shutdown()


if __name__ == "__main__":
    main()
