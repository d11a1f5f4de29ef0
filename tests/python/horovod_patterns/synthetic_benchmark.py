"""Horovod's synthetic-benchmark usage pattern for PyTorch, written for
tutti's tests (not Horovod's file): a model on random images, the
DistributedOptimizer, parameters and optimizer state broadcast from rank 0,
timed iterations and an images/second report.  Only the import line is
tutti-specific.

    mpirun -np 2 python synthetic_benchmark.py [--fp16-allreduce] [--use-adasum]
        [--batches-per-allreduce N] [--check]

--check (for the test suite) exits non-zero unless the training loss fell
and every rank ends with the same parameters.
"""
import argparse
import sys
import timeit

import torch
import torch.nn as nn
import torch.nn.functional as F

import tutti.torch as hvd  # was: import horovod.torch as hvd


def parse_args():
    p = argparse.ArgumentParser(description="synthetic PyTorch benchmark")
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="compress the gradients (or Adasum updates) to fp16 on the wire")
    p.add_argument("--use-adasum", action="store_true", help="reduce with Adasum")
    p.add_argument("--batches-per-allreduce", type=int, default=1,
                   help="backward passes accumulated locally per allreduce")
    p.add_argument("--batch-size", type=int, default=8, help="images per backward pass")
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--num-warmup-batches", type=int, default=1)
    p.add_argument("--num-batches-per-iter", type=int, default=2)
    p.add_argument("--num-iters", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--check", action="store_true",
                   help="fail unless the loss fell and the ranks agree")
    return p.parse_args()


class SmallConvNet(nn.Module):
    def __init__(self, classes, size):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * (size // 4) ** 2, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(1234 + hvd.rank())  # different initial weights: the broadcast fixes them

    model = SmallConvNet(args.num_classes, args.image_size)
    # Average: scale the learning rate by the number of gradients averaged.
    # Adasum combines updates adaptively: keep the single-worker rate.
    lr_scaler = 1 if args.use_adasum else args.batches_per_allreduce * hvd.size()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression,
        backward_passes_per_step=args.batches_per_allreduce,
        op=hvd.Adasum if args.use_adasum else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Fixed synthetic data: each rank its own images, labels from the data.
    g = torch.Generator().manual_seed(99 + hvd.rank())
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=g)
    target = (data.mean(dim=(1, 2, 3)) * 1e3).long().remainder(args.num_classes)
    losses = []

    def benchmark_step():
        optimizer.zero_grad()
        for _ in range(args.batches_per_allreduce):
            loss = F.cross_entropy(model(data), target)
            (loss / args.batches_per_allreduce).backward()
        optimizer.step()
        losses.append(loss.item())

    def log(text):
        if hvd.rank() == 0:
            print(text, flush=True)

    log(f"Model: SmallConvNet, batch size {args.batch_size}, {hvd.size()} CPU rank(s), "
        f"{'Adasum' if args.use_adasum else 'Average'}"
        f"{', fp16 allreduce' if args.fp16_allreduce else ''}, "
        f"{args.batches_per_allreduce} batch(es) per allreduce")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    img_secs = []
    images = args.batch_size * args.batches_per_allreduce * args.num_batches_per_iter
    for it in range(args.num_iters):
        t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_secs.append(images / t)
        log(f"Iter #{it}: {images / t:.1f} img/sec per rank")
    mean = sum(img_secs) / len(img_secs)
    conf = 1.96 * (sum((x - mean) ** 2 for x in img_secs) / len(img_secs)) ** 0.5
    log(f"Img/sec per rank: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} rank(s): {hvd.size() * mean:.1f} "
        f"+-{hvd.size() * conf:.1f}")

    if args.check:
        first = hvd.allreduce(torch.tensor(losses[0]), name="first loss")
        last = hvd.allreduce(torch.tensor(losses[-1]), name="last loss")
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        same = bool(torch.equal(hvd.broadcast(flat, root_rank=0), flat))
        agree = bool(hvd.allreduce(torch.tensor(int(same)), op=hvd.Min, name="agree"))
        log(f"CHECK mean loss {first.item():.4f} -> {last.item():.4f}, "
            f"parameters identical on all ranks: {agree}")
        if not (last < first and agree):
            print(f"rank {hvd.rank()}: CHECK FAILED", file=sys.stderr, flush=True)
            return 1
        log("CHECK OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
