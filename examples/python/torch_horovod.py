"""A PyTorch training script in Horovod style, on tutti, safe on spot machines.

Replace ``import horovod.torch as hvd`` with ``import tutti.torch as hvd``
and a Horovod script runs unchanged; this one also uses what Horovod lacks:
tutti's loss scaler (overflow agreed across ranks), PowerSGD with error
feedback, and spot-safe checkpoints with preemption notices
(docs/python.md, "From a DDP or Horovod script to a spot-safe one").

    mpirun -np 4 python examples/python/torch_horovod.py --epochs 3
    TUTTI_CKPT_DIR=/tmp/ck tutti-run -np 4 python examples/python/torch_horovod.py

With a checkpoint directory (``--ckpt-dir``, default ``TUTTI_CKPT_DIR``) it
saves every ``--ckpt-every`` steps; on a spot notice every rank saves at the
same step and exits with 75, and under tutti-run the next run resumes from
the newest checkpoint, data position included.

Exits non-zero if the replicas differ or the model did not learn.  The
replica check compares every rank with every other (an all-reduce of each
parameter's max and min), so all ranks print the same verdict;
``--perturb-rank R`` nudges rank R's parameters just before it, to watch it
fail.
"""
import argparse
import math
import os
import sys

import tutti

# First, before the slow imports (torch takes seconds): until the monitor has
# installed its handlers, a SIGUSR1 -- how tutti-run and mpirun deliver a spot
# notice -- ends the process.  Sources: TUTTI_PREEMPT_SOURCES (signals and the
# trigger file by default; add aws, gcp or azure on those clouds).
monitor = tutti.PreemptionMonitor()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tutti.torch as hvd  # noqa: E402
import tutti.torch.checkpoint as tckpt  # noqa: E402


def dataset(n=4096, seed=0):
    """Points in a square, labelled inside/outside a circle: a task a small
    MLP learns in a few epochs (the same data on every rank; each rank
    trains on its own slice of every batch)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g) * 2 - 1
    label = (x.pow(2).sum(1) < 0.5).long()
    return x, label


def replicas_max_difference(model):
    """Collective: the largest difference between any two ranks' values of
    any parameter, the same number on every rank (0.0 exactly when the
    replicas are identical; inf when a rank holds a NaN or an infinity).

    Not ``torch.equal(hvd.broadcast(flat, root_rank=0), flat)``: on rank 0
    that compares rank 0 with itself and is True however far the others
    drifted."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    finite = torch.tensor([1.0 if bool(torch.isfinite(flat).all()) else 0.0])
    if hvd.allreduce(finite, op=hvd.Min, name="replicas.finite").item() < 1.0:
        return math.inf
    hi = hvd.allreduce(flat, op=hvd.Max, name="replicas.max")
    lo = hvd.allreduce(flat, op=hvd.Min, name="replicas.min")
    return (hi - lo).max().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--compression", default="powersgd",
                    choices=["none", "fp16", "bf16", "topk", "powersgd", "onebit", "auto"])
    ap.add_argument("--ckpt-dir", default=os.environ.get("TUTTI_CKPT_DIR", ""),
                    help="checkpoint directory (default: TUTTI_CKPT_DIR; none: no checkpoints)")
    ap.add_argument("--ckpt-every", type=int, default=40)
    ap.add_argument("--perturb-rank", type=int, default=-1,
                    help="this rank adds 1e-3 to a weight before the replica check "
                         "(to see the check fail)")
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(2, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 2))
    # Horovod's recipe: scale the learning rate by the number of workers.
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=getattr(hvd.Compression, args.compression))
    scaler = hvd.LossScaler(init_scale=2.0 ** 12, growth_interval=50)

    x, y = dataset()
    per_epoch = len(x) // (args.batch * hvd.size())
    start = 0
    mgr = None
    if args.ckpt_dir:
        mgr = tutti.CheckpointManager(tutti.world(), args.ckpt_dir, keep_last=2)
        res = tckpt.load(mgr, model=model, optimizer=opt, scaler=scaler)  # None: fresh start
        if res is not None:
            start = res["data_position"]["step"]
            if hvd.rank() == 0:
                print(f"resumed from checkpoint step {start}")
    if start == 0:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)

    def save(step):
        tckpt.save(mgr, step, model=model, optimizer=opt, scaler=scaler,
                   data_position={"step": step})

    total = args.epochs * per_epoch
    first = last = None
    for step in range(start, total):
        epoch, i = divmod(step, per_epoch)
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        lo = (i * hvd.size() + hvd.rank()) * args.batch
        idx = perm[lo:lo + args.batch]
        opt.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        scaler.scale(loss).backward()
        scaler.step(opt)  # waits for the all-reduce; skipped everywhere on overflow
        scaler.update()
        avg = hvd.allreduce(loss.detach(), name="loss").item()
        first = avg if first is None else first
        last = avg
        if hvd.rank() == 0 and (step + 1) % per_epoch == 0:
            print(f"epoch {epoch + 1}/{args.epochs} | loss {avg:.4f} | "
                  f"scale {scaler.get_scale():g} | skipped {scaler.skipped_steps}")
        # Collective, every step: the same answer on every rank.
        action = monitor.decide()
        if action == tutti.checkpoint.PreemptionAction.STOP:
            if mgr:
                save(step + 1)
                mgr.wait()  # committed on every rank
            elif hvd.rank() == 0:
                print("stop notice: nothing saved (no checkpoint directory)")
            tutti.exit_preempted()  # exit code 75: tutti-run restarts the job
        if mgr and (action == tutti.checkpoint.PreemptionAction.SAVE_NOW
                    or (step + 1) % args.ckpt_every == 0):
            save(step + 1)  # async: training goes on while it is written
    if mgr:
        mgr.wait()
        mgr.close()

    if hvd.rank() == args.perturb_rank:
        with torch.no_grad():
            next(model.parameters()).view(-1)[0] += 1e-3
    diff = replicas_max_difference(model)
    same = diff == 0.0
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    learned = start > 0 or (last < 0.8 * first and acc > 0.7)
    st = opt.compressor.stats() if opt.compressor is not None else None
    ratio = (f", gradient bytes x{st['uncompressed_bytes'] / max(st['wire_bytes'], 1):.1f} smaller"
             if st and st["wire_bytes"] else "")
    if hvd.rank() == 0:
        verdict = "identical" if same else f"DIFFER (max difference {diff:.3g})"
        losses = f"loss {first:.4f} -> {last:.4f}" if first is not None else "no steps left"
        print(f"{losses}, accuracy {acc:.3f}, replicas {verdict}{ratio}")
    hvd.shutdown()
    return 0 if same and learned else 1


if __name__ == "__main__":
    sys.exit(main())
