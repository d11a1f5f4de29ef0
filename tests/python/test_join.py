"""hvd.join() and DistributedDataParallel.join() for uneven inputs (issue 14).
Rank r has r + 2 batches; after the join the last joiner's weights (every
rank's once they are broadcast from it) equal a single-process reference that, at step k, averages the gradients of the
ranks that still had a batch over the WHOLE world (joined ranks count as
zeros: torch DDP Join's divide_by_initial_world_size=True)."""
import pytest

torch = pytest.importorskip("torch")
import tutti  # noqa: E402
import tutti.torch as hvd  # noqa: E402

LR = 0.1


@pytest.fixture(scope="module", autouse=True)
def horovod_init():
    hvd.init()


def batch(r, k):
    """Rank r's batch k (the same on every rank, so the reference can
    replay everyone's data)."""
    g = torch.Generator().manual_seed(1000 * r + k)
    x = torch.randn(4, 3, generator=g, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True) * 0.5 + 1.0


def model():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1).double()


def loss_of(m, r, k):
    x, y = batch(r, k)
    return ((m(x) - y) ** 2).mean()


def reference(size):
    """Plain SGD where step k's gradient is sum over the ranks with a batch
    k (r + 2 > k) of their gradient, divided by size."""
    m = model()
    for k in range(size + 1):
        grads = [torch.zeros_like(p) for p in m.parameters()]
        for r in range(size):
            if k < r + 2:
                gs = torch.autograd.grad(loss_of(m, r, k), list(m.parameters()))
                grads = [a + b for a, b in zip(grads, gs)]
        with torch.no_grad():
            for p, g in zip(m.parameters(), grads):
                p -= LR * g / size
    return [p.detach() for p in m.parameters()]


def train_uneven(m, opt, rank):
    for k in range(rank + 2):
        opt.zero_grad()
        loss_of(m, rank, k).backward()
        opt.step()


def assert_matches_reference(m, size):
    for p, want in zip(m.parameters(), reference(size)):
        assert torch.allclose(p.detach(), want, rtol=1e-10, atol=1e-12), (p, want)


def test_hvd_join_serves_allreduces_and_returns_the_last_rank(rank, size):
    for i in range(rank + 1):
        running = range(i, size)
        s = hvd.allreduce(torch.full((3,), rank + 1.0, dtype=torch.float64), op=hvd.Sum)
        assert torch.equal(s, torch.full((3,), float(sum(r + 1 for r in running)),
                                         dtype=torch.float64))
        a = hvd.allreduce(torch.tensor([rank + 1.0]))  # Average: over the whole world
        assert a.item() == pytest.approx(sum(r + 1 for r in running) / size)
        m = hvd.allreduce(torch.tensor([rank + 1], dtype=torch.int32), op=hvd.Min)
        assert m.item() == i + 1  # a joined rank's zero would win
    assert hvd.join() == size - 1
    assert hvd.join(process_set=hvd.global_process_set) == size - 1  # all at once: a tie


@pytest.fixture
def tiny_buckets(monkeypatch):
    """One bucket per parameter: the reducer then launches them on two
    channels (splits of the group, TUTTI_DP_LAUNCH_CHANNELS)."""
    monkeypatch.setenv("TUTTI_FIRST_BUCKET_MB", "1e-6")
    tutti.config_reload()
    yield 1e-6
    monkeypatch.undo()
    tutti.config_reload()


@pytest.mark.parametrize("buckets", [1, 2])
def test_ddp_model_join_context(rank, size, buckets, request):
    # Two buckets on two channels, which a joined rank serves too.
    cap = request.getfixturevalue("tiny_buckets") if buckets == 2 else None
    m = model()
    ddp = hvd.DistributedDataParallel(m, bucket_cap_mb=cap)
    assert len(ddp.reducer.buckets) == buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    with ddp.join():
        for k in range(rank + 2):
            opt.zero_grad()
            x, y = batch(rank, k)
            ((ddp(x) - y) ** 2).mean().backward()
            opt.step()
    assert_matches_reference(m, size)
    with pytest.raises(ValueError, match="divide_by_initial_world_size"):
        with ddp.join(divide_by_initial_world_size=False):
            pass


@pytest.mark.parametrize("groups", [None, 2])
def test_distributed_optimizer_then_join(rank, size, groups):
    # groups=2: each group reduces on its own split of the world, which a
    # joined rank serves too.
    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR),
                                   named_parameters=m.named_parameters(), groups=groups)
    train_uneven(m, opt, rank)
    last = hvd.join()
    assert last == size - 1
    if rank == last:  # the others skipped the steps of the batches they lacked
        assert_matches_reference(m, size)
    hvd.broadcast_parameters(m.state_dict(), root_rank=last)  # Horovod's recipe
    assert_matches_reference(m, size)


def test_refused_collective_with_a_joined_rank(rank, size):
    if size < 2:
        pytest.skip("needs two or more ranks")
    if rank == 0:
        assert hvd.join() == size - 1
        return
    with pytest.raises(tutti.MismatchError, match="rank 0 called join"):
        hvd.allgather(torch.ones(2))
    b = hvd.broadcast(torch.full((2,), float(rank)), root_rank=size - 1)
    assert torch.equal(b, torch.full((2,), float(size - 1)))
    assert hvd.join() == size - 1
