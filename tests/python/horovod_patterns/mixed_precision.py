"""Horovod's mixed-precision pattern, written for tutti's tests: the only
tutti-specific line is the import.

    scaler.scale(loss).backward()
    optimizer.synchronize()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    with optimizer.skip_synchronize():
        scaler.step(optimizer)
    scaler.update()

On a machine without CUDA, torch.cuda.amp.GradScaler disables itself, so
the CPU run uses hvd.LossScaler (GradScaler's interface), in float32
(``--cpu-autocast``: bfloat16 autocast, a looser check).  The script checks
itself: every rank ends with the same weights, which equal single-process
training on the whole batch without loss scaling (to float rounding; some
steps clipped, some not, so a missing unscale_ shows), and a step where one
rank's gradients overflow is skipped on every rank with the scale backed
off.

    mpirun -np 2 python mixed_precision.py
"""
import argparse
import sys

import torch
import torch.nn.functional as F

import tutti.torch as hvd  # was: import horovod.torch as hvd

FEATURES, CLASSES, ROWS_PER_RANK = 8, 4, 16


def data(size, step):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(ROWS_PER_RANK * size, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (ROWS_PER_RANK * size,), generator=g)
    return x, y


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, CLASSES))


def autocast(cpu_autocast):
    if torch.cuda.is_available():
        return torch.cuda.amp.autocast()
    return torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=cpu_autocast)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--overflow-step", type=int, default=3)
    parser.add_argument("--max-norm", type=float, default=0.35)
    parser.add_argument("--cpu-autocast", action="store_true")
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * size, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    scaler = (torch.cuda.amp.GradScaler() if torch.cuda.is_available()
              else hvd.LossScaler(init_scale=2.0 ** 10))

    # The reference: one process, the whole batch, no loss scaling, and the
    # same steps skipped.
    reference = make_model()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1 * size, momentum=0.9)

    norms = []
    for step in range(args.steps):
        x, y = data(size, step)
        mine = slice(rank * ROWS_PER_RANK, (rank + 1) * ROWS_PER_RANK)
        optimizer.zero_grad()
        with autocast(args.cpu_autocast):
            output = model(x[mine])
        loss = F.cross_entropy(output.float(), y[mine])
        if step == args.overflow_step and rank == size - 1:
            loss = loss * float("inf")  # this rank's gradients overflow
        scale_before = scaler.get_scale()
        scaler.scale(loss).backward()
        optimizer.synchronize()
        scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
        if step != args.overflow_step:
            norms.append(float(norm))
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
        scaler.update()

        if step == args.overflow_step:
            if scaler.get_scale() != scale_before / 2:
                sys.exit(f"rank {rank}: the overflow step did not back off the scale "
                         f"({scale_before} -> {scaler.get_scale()})")
            continue  # skipped everywhere, and by the reference
        ref_opt.zero_grad()
        with autocast(args.cpu_autocast):
            ref_out = reference(x)
        # The mean over the whole batch = the average of the ranks' means.
        F.cross_entropy(ref_out.float(), y).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), args.max_norm)
        ref_opt.step()

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather(flat.unsqueeze(0))
    if not all(torch.equal(everyone[0], row) for row in everyone):
        sys.exit(f"rank {rank}: the ranks' weights differ")
    ref_flat = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
    err = (flat - ref_flat).abs().max().item()
    # Both clipped and unclipped steps, so a missing unscale_ would show.
    if not (min(norms) < args.max_norm < max(norms)):
        sys.exit(f"rank {rank}: gradient norms {norms} do not straddle max_norm")
    low = args.cpu_autocast or torch.cuda.is_available()
    if err > (1e-2 if low else 1e-5):  # the batches split differently
        sys.exit(f"rank {rank}: weights differ from single-process training by {err}")
    if rank == 0:
        print(f"mixed_precision: OK ranks={size} steps={args.steps} "
              f"skipped={scaler.skipped_steps if hasattr(scaler, 'skipped_steps') else '?'} "
              f"scale={scaler.get_scale()} max_weight_error={err:.2e} "
              f"grad_norms={[round(n, 3) for n in norms]}")


if __name__ == "__main__":
    main()
