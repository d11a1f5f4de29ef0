#!/usr/bin/env python3
"""PyTorch DDP (gloo, CPU) peer of bench_dp: the same MLP shape, batch, loss
and bucket cap, measured the same way.  Four phases, INTERLEAVED (measured
iteration k runs phase k mod 4, a barrier before each), each the median over
its iterations of the slowest rank's time:

  step        forward + backward of the DDP module (the reduction overlapped
              by DDP's autograd hooks)
  compute     the same under ddp.no_sync() (hooks fire, nothing reduced)
  comm        DDP's buckets alone: an async gloo all-reduce per bucket, with
              the sizes DDP itself uses (after its bucket rebuild), then wait
  sequential  compute, then comm

  overlap ratio = (compute + comm - step) / min(compute, comm)

Run under mpiexec (rank/size from OpenMPI's environment); MASTER_ADDR (rank
0's address, default 127.0.0.1) and MASTER_PORT must be reachable from every
rank; on the netns rig GLOO_SUBNET names the cluster's subnet.  Prints one
JSON object on rank 0.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

PHASES = ("step", "compute", "comm", "sequential")


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def pick_gloo_interface():
    """On the netns rig each host's interface has its own name: gloo would
    resolve the namespace's hostname to loopback, so name the interface that
    holds an address in GLOO_SUBNET (e.g. "10.213.0.")."""
    subnet = os.environ.get("GLOO_SUBNET")
    if not subnet or "GLOO_SOCKET_IFNAME" in os.environ:
        return
    import subprocess
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], stdout=subprocess.PIPE,
                         text=True, check=True).stdout
    for line in out.splitlines():
        f = line.split()
        if len(f) > 3 and f[3].startswith(subnet):
            os.environ["GLOO_SOCKET_IFNAME"] = f[1]
            return
    raise SystemExit("ddp_peer: no interface with an address in %s" % subnet)


def ddp_bucket_numels(model, cap_mb):
    """The element counts of DDP's buckets after its rebuild: its own
    assignment function on the gradients in ready order (last layer first),
    first bucket 1 MiB, then the cap."""
    params = list(reversed(list(model.parameters())))
    limits = [getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1048576), int(cap_mb * 1048576)]
    assign = getattr(dist, "_compute_bucket_assignment_by_size", None)
    if assign is not None:
        result = assign(params, limits)
        indices = result[0] if isinstance(result, tuple) else result
    else:  # a PyTorch without the private function: its rule, restated
        indices, cur, size = [], [], 0
        for i, q in enumerate(params):
            cur.append(i)
            size += q.numel() * q.element_size()
            if size >= limits[min(len(indices), 1)]:  # add, then close at >= limit
                indices.append(cur)
                cur, size = [], 0
        if cur:
            indices.append(cur)
    return [sum(params[i].numel() for i in b) for b in indices]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--widths", default="512,1024,1024,1024,1024,512,16")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--cap-mb", type=float, default=25)
    p.add_argument("--first-mb", type=float, default=1)  # DDP's own: 1 MiB, fixed
    p.add_argument("--bucket-view", type=int, default=0)  # gradient_as_bucket_view
    a = p.parse_args()
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.set_num_threads(1)
    pick_gloo_interface()
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
    ddp = DDP(model, bucket_cap_mb=a.cap_mb, gradient_as_bucket_view=bool(a.bucket_view))
    grad_numel = sum(q.numel() for q in model.parameters())

    def backward():
        loss = 0.5 * ((ddp(x) - y) ** 2).sum() * scale
        loss.backward()

    flats = []  # DDP's buckets, filled after the warm-up (its rebuild)

    def comm():
        works = [dist.all_reduce(f, async_op=True) for f in flats]
        for w in works:
            w.wait()

    def run(phase):
        if phase == "step":
            backward()
        elif phase == "compute":
            with ddp.no_sync():
                backward()
        elif phase == "comm":
            comm()
        else:
            with ddp.no_sync():
                backward()
            comm()

    times = {ph: [] for ph in PHASES}
    cpu = {ph: [] for ph in PHASES}
    for it in range(len(PHASES) * (a.warmup + a.steps)):
        phase = PHASES[it % len(PHASES)]
        if not flats and phase == "comm":
            flats[:] = [torch.zeros(n) for n in ddp_bucket_numels(model, a.cap_mb)]
        dist.barrier()
        model.zero_grad(set_to_none=False)
        c0 = cpu_seconds()
        t0 = time.perf_counter()
        run(phase)
        dt = time.perf_counter() - t0
        if it >= len(PHASES) * a.warmup:
            times[phase].append(dt)
            cpu[phase].append(cpu_seconds() - c0)
    flat = torch.tensor([t for ph in PHASES for t in times[ph]], dtype=torch.float64)
    dist.all_reduce(flat, op=dist.ReduceOp.MAX)
    med = {ph: statistics.median(flat[i * a.steps:(i + 1) * a.steps].tolist())
           for i, ph in enumerate(PHASES)}
    hidden = med["compute"] + med["comm"] - med["step"]
    if rank == 0:
        print(json.dumps({
            "impl": "torch-ddp-gloo", "torch": torch.__version__,
            "bucket_view": bool(a.bucket_view), "ranks": size,
            "widths": a.widths, "batch_per_rank": a.batch,
            "grad_mb": round(grad_numel * 4 / 1048576, 3), "buckets": len(flats),
            "bucket_bytes": [f.numel() * 4 for f in flats], "cap_mb": a.cap_mb,
            "steps": a.steps,
            "compute_ms": round(med["compute"] * 1e3, 3), "comm_ms": round(med["comm"] * 1e3, 3),
            "sequential_ms": round(med["sequential"] * 1e3, 3),
            "step_ms": round(med["step"] * 1e3, 3), "hidden_ms": round(hidden * 1e3, 3),
            "overlap_ratio": round(hidden / min(med["compute"], med["comm"]), 3),
            "cpu_ms": {ph: round(statistics.median(cpu[ph]) * 1e3, 1)
                       for ph in ("step", "compute", "comm")},
            "samples_per_s": round(size * a.batch / med["step"], 1)}))
    dist.barrier()
    # gloo's teardown can hang at interpreter exit under mpiexec; the
    # result is printed, so leave at once.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
