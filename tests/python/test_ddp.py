"""tutti.torch.DistributedDataParallel: construction broadcast, gradients
averaged when backward() returns (full-batch equivalence), no_sync()
accumulation, buffers, unused parameters, and mismatched models."""
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tutti  # noqa: E402
import tutti.torch as hvd  # noqa: E402

import horovod_mlp  # noqa: E402


def shard(x, rank, size):
    n = x.shape[0] // size
    return x[rank * n:(rank + 1) * n]


def test_gradients_match_full_batch(rank, size):
    x, y = horovod_mlp.dataset()
    ddp = hvd.DistributedDataParallel(horovod_mlp.make_model(100 + rank))
    ref = horovod_mlp.make_model(100)  # rank 0's initial model
    for p, q in zip(ddp.parameters(), ref.parameters()):
        assert torch.equal(p, q), "construction broadcast from rank 0"
    opt = torch.optim.SGD(ddp.parameters(), lr=0.2)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.2)
    for step in range(3):
        xb, yb = x[step * 12:(step + 1) * 12], y[step * 12:(step + 1) * 12]
        opt.zero_grad()
        F.mse_loss(ddp(shard(xb, rank, size)), shard(yb, rank, size)).backward()
        ref_opt.zero_grad()
        F.mse_loss(ref(xb), yb).backward()
        # Already averaged when backward() returns, as with torch DDP.
        for p, q in zip(ddp.parameters(), ref.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-10, atol=1e-13)
        opt.step()
        ref_opt.step()
    assert ddp.reducer.stats()["steps"] == 3
    assert list(ddp.state_dict())[0].startswith("module.")


def test_no_sync_accumulates_then_reduces(rank, size):
    torch.manual_seed(0)
    ddp = hvd.DistributedDataParallel(torch.nn.Linear(4, 1, bias=False))
    w = lambda r, k: torch.full((1, 4), float(r + 10 * k))  # noqa: E731
    with ddp.no_sync():
        for k in range(2):
            ddp(w(rank, k)).sum().backward()
    assert torch.equal(ddp.module.weight.grad, w(rank, 0) + w(rank, 1)), "local only"
    ddp(w(rank, 2)).sum().backward()
    expect = sum(w(r, k) for r in range(size) for k in range(3)) / size
    assert torch.allclose(ddp.module.weight.grad, expect)
    s = ddp.reducer.stats()
    assert s["accumulation_passes"] == 2 and s["steps"] == 1


def test_buffers_and_unused_parameters(rank, size):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)
            self.bn = torch.nn.BatchNorm1d(3)
            self.spare = torch.nn.Linear(3, 3)  # never used

        def forward(self, x):
            return self.bn(self.fc(x))

    net = Net()
    net.bn.running_mean.fill_(float(rank))
    ddp = hvd.DistributedDataParallel(net)
    assert torch.equal(net.bn.running_mean, torch.zeros(3)), "buffers from rank 0"
    net.bn.running_mean.fill_(float(rank + 5))
    torch.manual_seed(1)
    x = torch.randn(4, 3)  # the same batch everywhere
    ddp(x).sum().backward()  # the forward re-broadcasts rank 0's buffers first
    # Without that broadcast the running means would still differ by rank.
    running = hvd.allgather(net.bn.running_mean[None])
    assert all(torch.equal(running[0], running[r]) for r in range(size))
    assert torch.equal(net.spare.weight.grad, torch.zeros(3, 3))


def test_mismatched_models_fail_on_every_rank(rank, size):
    if size == 1:
        pytest.skip("needs two ranks")
    width = 5 if rank == size - 1 else 4
    model = torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.Linear(width, 1))
    with pytest.raises(tutti.MismatchError, match="'0.weight'"):
        hvd.DistributedDataParallel(model)
    hvd.barrier()
