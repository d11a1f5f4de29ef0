"""hvd.SyncBatchNorm against torch's BatchNorm on the concatenated global
batch: rank r holds r + 2 samples (uneven), the global loss is the sum of
the ranks' losses, and the forward output, the input gradient, the weight
and bias gradients (summed over ranks, as the gradient reduction does) and
the running statistics must match."""
import pytest
import torch

import tutti
import tutti.torch as hvd


def global_batch(size, shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    counts = [r + 2 for r in range(size)]
    x = torch.randn((sum(counts),) + shape, generator=g, dtype=torch.float64) * 3 + 5
    c = torch.randn((sum(counts),) + shape, generator=g, dtype=torch.float64)
    return x.to(dtype), c.to(dtype), counts


def mine(t, rank, counts):
    start = sum(counts[:rank])
    return t[start:start + counts[rank]]


def sum_over_ranks(t):
    t = t.detach().clone()
    tutti.world().allreduce(t, op="sum")
    return t


@pytest.mark.parametrize("shape,dense_cls,dtype,tol,momentum", [
    ((3,), torch.nn.BatchNorm1d, torch.float64, 1e-12, 0.1),
    ((3, 5), torch.nn.BatchNorm1d, torch.float32, 2e-5, None),
    ((2, 3, 4), torch.nn.BatchNorm2d, torch.float64, 1e-12, None),
    ((2, 3, 4), torch.nn.BatchNorm2d, torch.float32, 2e-5, 0.1),
])
def test_matches_batchnorm_on_the_global_batch(rank, size, shape, dense_cls, dtype, tol,
                                               momentum):
    x, c, counts = global_batch(size, shape, dtype)
    channels = shape[0]
    dense = dense_cls(channels, momentum=momentum).to(dtype)
    sync = hvd.SyncBatchNorm(channels, momentum=momentum).to(dtype)
    with torch.no_grad():
        for bn in (dense, sync):
            bn.weight.copy_(torch.arange(1, channels + 1, dtype=dtype) * 0.5)
            bn.bias.copy_(torch.arange(channels, dtype=dtype) - 1)
    for step in range(2):  # two steps: the running statistics accumulate
        xs = x * (step + 1)
        xd = xs.clone().requires_grad_()
        yd = dense(xd)
        (yd * c).sum().backward()
        xl = mine(xs, rank, counts).clone().requires_grad_()
        yl = sync(xl)
        (yl * mine(c, rank, counts)).sum().backward()
        close = dict(rtol=tol, atol=tol)
        torch.testing.assert_close(yl, mine(yd, rank, counts), **close)
        torch.testing.assert_close(xl.grad, mine(xd.grad, rank, counts), **close)
        torch.testing.assert_close(sum_over_ranks(sync.weight.grad), dense.weight.grad, **close)
        torch.testing.assert_close(sum_over_ranks(sync.bias.grad), dense.bias.grad, **close)
        torch.testing.assert_close(sync.running_mean, dense.running_mean, **close)
        torch.testing.assert_close(sync.running_var, dense.running_var, **close)
        assert int(sync.num_batches_tracked) == int(dense.num_batches_tracked) == step + 1
    # Eval: running statistics, no communication (one rank alone may call it).
    sync.eval(), dense.eval()
    if rank == 0:
        torch.testing.assert_close(sync(x[:3]), dense(x[:3]), rtol=tol, atol=tol)


def test_a_rank_with_an_empty_batch(rank, size):
    # Rank 0 holds no samples: the others' statistics are the batch's.
    x, c, counts = global_batch(size, (4,), torch.float64)
    counts = [0] + [4] * (size - 1) if size > 1 else [6]
    x, c = x[:sum(counts)], c[:sum(counts)]
    dense, sync = torch.nn.BatchNorm1d(4).double(), hvd.SyncBatchNorm(4).double()
    xd = x.clone().requires_grad_()
    (dense(xd) * c).sum().backward()
    xl = mine(x, rank, counts).clone().requires_grad_()
    (sync(xl) * mine(c, rank, counts)).sum().backward()
    torch.testing.assert_close(xl.grad, mine(xd.grad, rank, counts))
    torch.testing.assert_close(sum_over_ranks(sync.weight.grad), dense.weight.grad)
    torch.testing.assert_close(sync.running_var, dense.running_var)


def test_convert_and_train_with_ddp(rank, size):
    # convert_sync_batchnorm swaps the layers, sharing parameters and
    # buffers; under DistributedDataParallel (op Sum) the weight gradient is
    # the global batch's.
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).double()
    w = net[1].weight
    conv = hvd.SyncBatchNorm.convert_sync_batchnorm(net)
    assert isinstance(conv[1], hvd.SyncBatchNorm) and conv[1].weight is w
    assert hvd.convert_sync_batchnorm is not None
    dense = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).double()
    dense.load_state_dict(conv.state_dict())
    ddp = hvd.DistributedDataParallel(conv, op=hvd.Sum)
    x, c, counts = global_batch(size, (3,), torch.float64, seed=1)
    c = c[:, :1].expand(-1, 4)
    (dense(x) * c).sum().backward()
    (ddp(mine(x, rank, counts)) * mine(c, rank, counts)).sum().backward()
    for p, q in zip(conv.parameters(), dense.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-10)


def test_one_value_per_channel_raises(rank, size):
    sync = hvd.SyncBatchNorm(2)
    x = torch.ones(1 if rank == 0 else 0, 2)
    with pytest.raises(tutti.InvalidArgumentError, match="more than 1 value"):
        sync(x)
