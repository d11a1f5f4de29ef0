"""Horovod's metric-averaging pattern (its MNIST example's test loop),
written for tutti's tests: the only tutti-specific line is the import.

Each rank evaluates its shard of the test set (DistributedSampler), divides
its summed loss and correct count by its shard's size, and averages the two
numbers over the ranks with hvd.allreduce:

    def metric_average(val, name):
        tensor = torch.tensor(val)
        avg_tensor = hvd.allreduce(tensor, name=name)
        return avg_tensor.item()

The script checks itself against one process evaluating the whole set
(the shards are equal, so the average of the ranks' means is the global
mean), and that the summed counts (op=hvd.Sum) are exact.

    mpirun -np 2 python metric_average.py
"""
import sys

import torch
import torch.nn.functional as F
import torch.utils.data

import tutti.torch as hvd  # was: import horovod.torch as hvd

FEATURES, CLASSES, ROWS = 10, 5, 120  # 120 splits evenly over 1-6 ranks


def test_set():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(ROWS, FEATURES, generator=g, dtype=torch.float64)
    y = torch.randint(0, CLASSES, (ROWS,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def make_model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, CLASSES)).double()


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


def evaluate(model, loader, sampler_size):
    model.eval()
    test_loss, test_accuracy = 0.0, 0.0
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            test_loss += F.cross_entropy(output, target, reduction="sum").item()
            pred = output.argmax(dim=1)
            test_accuracy += pred.eq(target).sum().item()
    return test_loss / sampler_size, test_accuracy / sampler_size, test_accuracy


def main():
    hvd.init()
    dataset = test_set()
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=7, sampler=sampler)
    model = make_model()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    loss, accuracy, correct = evaluate(model, loader, len(sampler))
    avg_loss = metric_average(loss, "avg_loss")
    avg_accuracy = metric_average(accuracy, "avg_accuracy")
    total_correct = hvd.allreduce(torch.tensor(correct), op=hvd.Sum, name="correct").item()

    # One process over the whole set.
    whole = torch.utils.data.DataLoader(dataset, batch_size=ROWS)
    ref_loss, ref_accuracy, ref_correct = evaluate(model, whole, ROWS)
    # torch.tensor(float) is float32: the average is exact to float32.
    if abs(avg_loss - ref_loss) > 1e-6 * max(1.0, abs(ref_loss)):
        sys.exit(f"rank {hvd.rank()}: average loss {avg_loss!r} != {ref_loss!r}")
    if abs(avg_accuracy - ref_accuracy) > 1e-6:
        sys.exit(f"rank {hvd.rank()}: average accuracy {avg_accuracy!r} != {ref_accuracy!r}")
    if total_correct != ref_correct:
        sys.exit(f"rank {hvd.rank()}: summed correct {total_correct} != {ref_correct}")
    if hvd.rank() == 0:
        print(f"metric_average: OK ranks={hvd.size()} "
              f"Test set: Average loss: {avg_loss:.4f}, Accuracy: {100.0 * avg_accuracy:.2f}%")


if __name__ == "__main__":
    main()
