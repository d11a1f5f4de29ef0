"""A Horovod PyTorch training script, written for tutti's tests.  It uses
only Horovod's API; the import line is the one change from Horovod.

    mpirun -np 2 python horovod_mlp.py --steps 5
"""
import argparse

import torch
import torch.nn.functional as F

import tutti.torch as hvd  # was: import horovod.torch as hvd

FEATURES, CLASSES, ROWS = 6, 3, 96


def dataset():
    """The same regression data on every rank."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(ROWS, FEATURES, generator=g, dtype=torch.float64)
    w = torch.randn(FEATURES, CLASSES, generator=g, dtype=torch.float64)
    return x, torch.tanh(x @ w)


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, CLASSES)).double()


def train(steps=5, batch=12, lr=0.1, momentum=0.9, backward_passes_per_step=1,
          op="average", compression="none", optimizer="sgd"):
    """Trains on this rank's share of each global batch of `batch` rows and
    returns (model, per-step average loss)."""
    hvd.init()
    model = make_model(1234 + hvd.rank())  # differs per rank until broadcast
    scale = 1.0 if op == "average" else 1.0 / hvd.size()
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr * scale, momentum=momentum)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=lr * scale)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=getattr(hvd.Compression, compression),
                                   backward_passes_per_step=backward_passes_per_step,
                                   op=hvd.Average if op == "average" else hvd.Sum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    x_all, y_all = dataset()
    share = batch // hvd.size()
    micro = share // backward_passes_per_step
    losses = []
    for step in range(steps):
        begin = (step * batch) % ROWS + hvd.rank() * share
        x, y = x_all[begin:begin + share], y_all[begin:begin + share]
        opt.zero_grad()
        total = 0.0
        for m in range(backward_passes_per_step):
            xm, ym = x[m * micro:(m + 1) * micro], y[m * micro:(m + 1) * micro]
            loss = F.mse_loss(model(xm), ym) / backward_passes_per_step
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(hvd.allreduce(torch.tensor(total, dtype=torch.float64), name="loss").item())
    return model, losses


def train_single_process(steps=5, batch=12, lr=0.1, momentum=0.9, optimizer="sgd"):
    """The reference: one process, the full batch, plain PyTorch."""
    model = make_model(1234)
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=lr)
    x_all, y_all = dataset()
    losses = []
    for step in range(steps):
        begin = (step * batch) % ROWS
        opt.zero_grad()
        loss = F.mse_loss(model(x_all[begin:begin + batch]), y_all[begin:begin + batch])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--compression", default="none")
    args = ap.parse_args()
    _, losses = train(steps=args.steps, compression=args.compression)
    if hvd.rank() == 0:
        print("losses:", " ".join(f"{v:.6f}" for v in losses))
