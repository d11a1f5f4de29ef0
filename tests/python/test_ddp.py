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


class _Branchy(torch.nn.Module):
    """fc always; `side` only when asked (per rank); `spare` never."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4).double()
        self.side = torch.nn.Linear(4, 4).double()
        self.spare = torch.nn.Linear(4, 4).double()
        self.head = torch.nn.Linear(4, 1).double()

    def forward(self, x, use_side):
        h = torch.tanh(self.fc(x))
        if use_side:
            h = h + self.side(h)
        return self.head(h)


def _run_branchy(rank, steps=3, **kwargs):
    torch.manual_seed(3)
    ddp = hvd.DistributedDataParallel(_Branchy(), bucket_cap_mb=64 / 2**20, **kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    grads, early = [], []
    for step in range(steps):
        opt.zero_grad(set_to_none=step % 2 == 1)
        torch.manual_seed(10 * step + rank)
        before = ddp.reducer.stats()
        ddp(torch.randn(3, 4, dtype=torch.float64), use_side=rank != 1).sum().backward()
        after = ddp.reducer.stats()
        early.append((after["buckets_launched_early"] - before["buckets_launched_early"],
                      after["buckets_reduced"] - before["buckets_reduced"]))
        grads.append([p.grad.clone() for p in ddp.parameters()])
        opt.step()
    return ddp, grads, early


def test_unused_parameters_found_or_static(rank, size):
    """find_unused_parameters (graph search each forward) and static_graph
    (the first step's unused set) give the same bits as the default path
    (unused slots filled at the end of backward), and launch every bucket
    during backward from the second step on."""
    plain, ref, plain_early = _run_branchy(rank)
    for kwargs in ({"find_unused_parameters": True}, {"static_graph": True}):
        ddp, grads, early = _run_branchy(rank, **kwargs)
        for step, (a, b) in enumerate(zip(grads, ref)):
            for p, q in zip(a, b):
                assert torch.equal(p, q), f"{kwargs} step {step}"
        for launched, reduced in early[1:]:
            assert launched == reduced, f"{kwargs}: a bucket waited for synchronize()"
        unused = 2 if rank == 1 else 1  # spare (w, b) ... and side on rank 1
        marked = ddp.reducer.stats()["marked_unused"]
        steps_marking = 3 if "find_unused_parameters" in kwargs else 2
        assert marked == 2 * unused * steps_marking, (kwargs, marked)
    # spare's gradient is zero; side's counts only the ranks that used it.
    assert torch.equal(ref[0][4], torch.zeros(4, 4, dtype=torch.float64))
    assert plain.reducer.stats()["bucket_rebuilds"] == 1
    # No pool without a ZeRO-2 bucket collective: every bucket keeps its
    # buffer, at least the bytes of its gradients (padding to the group size).
    st = plain.reducer.stats()
    grad_bytes = sum(p.numel() * p.element_size() for p in plain.module.parameters())
    assert st["bucket_bytes"] >= grad_bytes and st["pool_waits"] == st["pool_growths"] == 0, st
    assert any(launched < reduced for launched, reduced in plain_early[1:]), \
        "without help the unused parameters' bucket waits for the end"


def test_static_graph_refuses_a_changed_graph(rank, size):
    torch.manual_seed(3)
    ddp = hvd.DistributedDataParallel(_Branchy(), static_graph=True)
    x = torch.ones(2, 4, dtype=torch.float64)
    ddp(x, use_side=False).sum().backward()
    with pytest.raises(tutti.InvalidArgumentError, match="static_graph"):
        ddp(x, use_side=True).sum().backward()


def _bucket_ptrs(reducer, n):
    return [torch.from_dlpack(reducer.gradient(i)).data_ptr() for i in range(n)]


@pytest.mark.parametrize("wrapper", ["ddp", "optimizer"])
def test_gradient_as_bucket_view(rank, size, wrapper):
    """.grad is the bucket (data_ptr inside it, no copies counted), with
    zero_grad(set_to_none=True) re-pointed at the next backward, and the
    training matches the copying path bit for bit."""
    x, y = horovod_mlp.dataset()

    def train(view):
        model = horovod_mlp.make_model(100)
        if wrapper == "ddp":
            net = hvd.DistributedDataParallel(model, gradient_as_bucket_view=view)
            opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.5)
            reducer = net.reducer
        else:
            net = model
            opt = hvd.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5),
                named_parameters=model.named_parameters(), gradient_as_bucket_view=view)
            reducer = opt.reducer
        params = list(model.parameters())
        out = []
        for step in range(4):
            opt.zero_grad(set_to_none=step >= 2)
            xb, yb = x[step * 12:(step + 1) * 12], y[step * 12:(step + 1) * 12]
            F.mse_loss(net(shard(xb, rank, size)), shard(yb, rank, size)).backward()
            if wrapper == "optimizer":
                opt.synchronize()
            if view:
                ptrs = _bucket_ptrs(reducer, len(params))
                assert [p.grad.data_ptr() for p in params] == ptrs, f"step {step}"
            out.append([p.grad.clone() for p in params])
            if wrapper == "optimizer":
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.step()
        out.append([p.detach().clone() for p in params])
        return out, reducer.stats()

    copied, cs = train(False)
    viewed, vs = train(True)
    for step, (a, b) in enumerate(zip(copied, viewed)):
        for p, q in zip(a, b):
            assert torch.equal(p, q), f"step {step}"
    assert vs["bytes_copied_in"] == 0 and vs["bytes_copied_out"] == 0
    assert cs["bytes_copied_in"] > 0 and cs["bytes_copied_out"] > 0
