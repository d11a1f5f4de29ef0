"""A Horovod elastic PyTorch script, on tutti.

The only change from Horovod is the import (``import tutti.torch as hvd``).
Horovod re-forms the job in-process; tutti commits the state as a
checkpoint and tutti-run starts the job again (docs/python_checkpoint.md,
"Elastic (Horovod-compatible)"):

    # a fixed size, restarted after failures and preemption notices:
    TUTTI_CKPT_DIR=/tmp/ck tutti-run -np 2 python examples/python/torch_elastic.py
    # elastic: between 2 and 8 ranks on the hosts a discovery script prints
    TUTTI_CKPT_DIR=/tmp/ck tutti-run --min-np 2 --max-np 8 \\
        --host-discovery-script ./discover.sh python examples/python/torch_elastic.py

Without TUTTI_CKPT_DIR, --ckpt-dir names the directory commits go to.
Exits non-zero if the replicas differ or the model did not learn.
"""
import argparse
import sys

import torch
import torch.nn.functional as F

import tutti.torch as hvd


def dataset(n=4096, seed=0):
    """Points in a square, labelled inside/outside a circle."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g) * 2 - 1
    return torch.utils.data.TensorDataset(x, (x.pow(2).sum(1) < 0.5).long())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05, help="per rank (scaled by the size)")
    ap.add_argument("--batches-per-commit", type=int, default=20)
    ap.add_argument("--batches-per-host-check", type=int, default=5)
    ap.add_argument("--ckpt-dir", default="", help="default: TUTTI_CKPT_DIR")
    args = ap.parse_args()

    hvd.init()
    if args.ckpt_dir:
        hvd.elastic.configure(ckpt_dir=args.ckpt_dir)
    torch.manual_seed(hvd.rank())          # different on every rank until sync()

    data = dataset()
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, sampler=sampler)
    model = torch.nn.Sequential(torch.nn.Linear(2, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    def on_state_reset():
        # After a restart at another size: the learning rate follows it.
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler,
                                   epoch=0, batch=0, losses=[])
    state.register_reset_callbacks([on_state_reset])

    @hvd.elastic.run
    def train(state):
        if hvd.rank() == 0:
            print(f"size {hvd.size()}: epoch {state.epoch}, batch {state.batch}, "
                  f"{sampler.processed()} samples of this epoch done", flush=True)
        while state.epoch < args.epochs:
            batch_offset, total, count = state.batch, 0.0, 0
            for idx, (x, y) in enumerate(loader):
                state.batch = batch_offset + idx
                if idx > 0 and state.batch % args.batches_per_commit == 0:
                    state.commit()                 # a checkpoint, then the host check
                elif idx > 0 and state.batch % args.batches_per_host_check == 0:
                    state.check_host_updates()
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                sampler.record_batch(idx, args.batch)
                total, count = total + loss.item(), count + 1
            mean = hvd.allreduce(torch.tensor(total / max(count, 1)), name="loss").item()
            if hvd.rank() == 0:
                print(f"epoch {state.epoch}: loss {mean:.4f} on {hvd.size()} ranks", flush=True)
            state.losses.append(mean)
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    if not torch.equal(hvd.broadcast(flat, 0, name="final"), flat):
        sys.exit(f"rank {hvd.rank()}: the replicas differ")
    x, y = data.tensors
    accuracy = (model(x).argmax(1) == y).float().mean().item()
    if hvd.rank() == 0:
        print(f"done: losses {[round(v, 4) for v in state.losses]}, accuracy {accuracy:.3f}")
    if accuracy < 0.9:
        sys.exit(f"rank {hvd.rank()}: accuracy {accuracy:.3f} after {args.epochs} epochs")


if __name__ == "__main__":
    main()
