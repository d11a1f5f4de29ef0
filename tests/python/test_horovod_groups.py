"""DistributedOptimizer(groups=...) and sparse_as_dense=True (issue 14).
Closed forms: rank r's loss is (r + 1) * sum(parameters), so every gradient
element is r + 1 and its average over the ranks (size + 1) / 2."""
import pytest

torch = pytest.importorskip("torch")
import tutti  # noqa: E402
import tutti.torch as hvd  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def horovod_init():
    hvd.init()


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))


def closed_form_step(model, opt, rank, size, lr):
    start = [p.detach().clone() for p in model.parameters()]
    loss = sum(p.sum() for p in model.parameters()) * (rank + 1)
    loss.backward()
    opt.synchronize()
    avg = (size + 1) / 2
    for p in model.parameters():
        assert torch.allclose(p.grad, torch.full_like(p, avg), rtol=1e-6, atol=0)
    with opt.skip_synchronize():
        opt.step()
    for p, s in zip(model.parameters(), start):
        assert torch.allclose(p.detach(), s - lr * avg, rtol=1e-6, atol=1e-7)
    opt.zero_grad()


@pytest.mark.parametrize("groups", [2, "lists"])
def test_groups_reduce_together(rank, size, groups):
    model = mlp()
    w1, b1, w2, b2 = model.parameters()
    spec = [[w1, b1], [w2]] if groups == "lists" else groups
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), groups=spec)
    syncs = opt._tutti.syncs
    # int 2: [w1, b1] and [w2, b2]; lists: the two listed groups plus the rest [b2].
    assert [len(s.params) for s in syncs] == ([2, 2] if groups == 2 else [2, 1, 1])
    for s in syncs[:2]:
        assert len(s.reducer.buckets) == 1  # a group is reduced as one fused bucket
    for _ in range(2):
        closed_form_step(model, opt, rank, size, 0.1)


def test_num_groups_alias_and_bad_groups(rank, size):
    model = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), num_groups=4)
    assert [len(s.params) for s in opt._tutti.syncs] == [1, 1, 1, 1]
    closed_form_step(model, opt, rank, size, 0.05)
    w1 = next(model.parameters())
    with pytest.raises(ValueError, match=r"in groups\[0\] and groups\[1\]"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), groups=[[w1], [w1]])
    with pytest.raises(ValueError, match="not a parameter of the optimizer"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 groups=[[torch.nn.Parameter(torch.ones(1))]])
    with pytest.raises(ValueError, match="groups must be >= 0"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), groups=-1)


class Bag(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(6, 3, sparse=True)
        self.head = torch.nn.Linear(3, 1)

    def forward(self, idx):
        return self.head(self.emb(idx)).sum()


def test_sparse_as_dense_reduces_the_dense_average(rank, size):
    torch.manual_seed(1)
    model = Bag()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   sparse_as_dense=True)
    # Rank r looks up rows r % 6 and (r + 1) % 6: row i's gradient is the
    # head's weight times how many ranks looked it up, averaged over ranks.
    for step in range(2):
        model(torch.tensor([rank % 6, (rank + 1) % 6])).backward()
        opt.synchronize()
        g = model.emb.weight.grad
        assert not g.is_sparse
        hits = torch.zeros(6)
        for r in range(size):
            hits[r % 6] += 1
            hits[(r + 1) % 6] += 1
        expect = hits[:, None] * model.head.weight.detach() / size
        assert torch.allclose(g, expect, rtol=1e-6, atol=1e-7), step
        with opt.skip_synchronize():
            opt.step()
        opt.zero_grad(set_to_none=True)  # the next sparse gradient arrives fresh


def test_sparse_gradient_without_sparse_as_dense_names_the_parameter(rank, size):
    model = Bag()
    hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                             named_parameters=model.named_parameters())
    with pytest.raises(tutti.UnsupportedError,
                       match="parameter 'emb.weight' has a sparse gradient.*sparse_as_dense=True"):
        model(torch.tensor([0, 1])).backward()
