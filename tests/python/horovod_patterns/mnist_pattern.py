"""Horovod's MNIST training pattern for PyTorch, written for tutti's tests
(not Horovod's file), on synthetic MNIST-shaped data (1x28x28 images, ten
classes: where a bright patch lies) so it needs no download: a
DistributedSampler shards the data by rank, the learning rate is scaled by
the number of ranks, gradients are averaged with an optional
--gradient-predivide-factor, and the test metrics are averaged over the
ranks with hvd.allreduce at the end.  Only the import line is
tutti-specific.

    mpirun -np 2 python mnist_pattern.py [--epochs 2] [--gradient-predivide-factor 2]
        [--fp16-allreduce] [--use-adasum] [--check]

--check (for the test suite) exits non-zero unless the test loss fell and
the averaged metrics and the parameters are identical on every rank.
"""
import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import tutti.torch as hvd  # was: import horovod.torch as hvd


def parse_args():
    p = argparse.ArgumentParser(description="MNIST-shaped training")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--test-batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--log-interval", type=int, default=4)
    p.add_argument("--train-size", type=int, default=256)
    p.add_argument("--test-size", type=int, default=128)
    p.add_argument("--fp16-allreduce", action="store_true")
    p.add_argument("--use-adasum", action="store_true")
    p.add_argument("--gradient-predivide-factor", type=float, default=1.0,
                   help="divide gradients by this before the sum, the rest after")
    p.add_argument("--check", action="store_true")
    return p.parse_args()


def synthetic_mnist(n, seed):
    """MNIST-shaped images: noise plus a bright 6x6 patch whose place (one
    of ten) is the label.  Learnable in a few steps, identical on every
    rank."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = 0.3 * torch.rand(n, 1, 28, 28, generator=g)
    for i, c in enumerate(labels.tolist()):
        row, col = 2 + 12 * (c // 5), 2 + 5 * (c % 5)
        images[i, 0, row:row + 6, col:col + 6] += 1.0
    return TensorDataset((images - 0.1307) / 0.3081, labels)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, kernel_size=5)
        self.conv2 = nn.Conv2d(6, 12, kernel_size=5)
        self.fc1 = nn.Linear(12 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main():
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    train_set = synthetic_mnist(args.train_size, 1)
    test_set = synthetic_mnist(args.test_size, 2)
    # Each rank takes its own 1/size of the data.
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                      shuffle=False)
    test_loader = DataLoader(test_set, batch_size=args.test_batch_size, sampler=test_sampler)

    model = Net()
    lr_scaler = 1 if args.use_adasum else hvd.size()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * lr_scaler,
                                momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
        gradient_predivide_factor=args.gradient_predivide_factor)

    def train(epoch):
        model.train()
        train_sampler.set_epoch(epoch)  # a new shard order every epoch
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_sampler)}]"
                      f"\tLoss: {loss.item():.6f}", flush=True)

    def test():
        model.eval()
        test_loss, correct = 0.0, 0.0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                correct += output.argmax(dim=1).eq(target).sum().item()
        test_loss /= len(test_sampler)
        accuracy = correct / len(test_sampler)
        # Average the metrics over the ranks (each saw its own shard).
        test_loss = metric_average(test_loss, "avg_loss")
        accuracy = metric_average(accuracy, "avg_accuracy")
        if hvd.rank() == 0:
            print(f"\nTest set: Average loss: {test_loss:.4f}, "
                  f"Accuracy: {100.0 * accuracy:.2f}%\n", flush=True)
        return test_loss, accuracy

    before, _ = test()
    for epoch in range(1, args.epochs + 1):
        train(epoch)
    after, accuracy = test()

    if args.check:
        metrics = torch.tensor([after, accuracy], dtype=torch.float64)
        same_metrics = torch.equal(hvd.broadcast(metrics, root_rank=0), metrics)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        same_params = torch.equal(hvd.broadcast(flat, root_rank=0), flat)
        ok = int(same_metrics and same_params and after < before)
        ok = int(hvd.allreduce(torch.tensor(ok), op=hvd.Min, name="check"))
        if hvd.rank() == 0:
            print(f"CHECK test loss {before:.4f} -> {after:.4f}, metrics identical on all "
                  f"ranks: {same_metrics}, parameters identical: {same_params}", flush=True)
        if not ok:
            print(f"rank {hvd.rank()}: CHECK FAILED", file=sys.stderr, flush=True)
            return 1
        if hvd.rank() == 0:
            print("CHECK OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
