"""op=hvd.Adasum (Maleki et al., MLSys 2021): closed forms (orthogonal
vectors add, identical vectors average, a zero vector is neutral), the
pairwise formula in the recursive-doubling tree against a NumPy reference of
the same tree (per-tensor dot products), DistributedOptimizer(op=Adasum)
combining the per-rank updates, and the errors (non-power-of-two sizes,
ranks disagreeing on the tensors, integer tensors).  Runs at np 1, 2, 3
(the error) and 4 (the two-level tree)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import tutti  # noqa: E402
import tutti.torch as hvd  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def horovod_init():
    hvd.init()


def power_of_two(size):
    return size & (size - 1) == 0


needs_pow2 = pytest.mark.skipif(not power_of_two(tutti.world().size),
                                reason="Adasum needs a power-of-two size")


def ref_pair(a, b):
    """The paper's pairwise combination, in float64."""
    fa, fb = a.ravel(), b.ravel()
    dot, na, nb = float(fa @ fb), float(fa @ fa), float(fb @ fb)
    ca = 1.0 - dot / (2 * na) if na > 0 else 1.0
    cb = 1.0 - dot / (2 * nb) if nb > 0 else 1.0
    return ca * a + cb * b


def ref_tree(per_rank):
    """per_rank[r] is rank r's list of tensors (float64 arrays): level 1
    combines ranks (0,1), (2,3), ..., level 2 those results pairwise, and so
    on; each tensor with its own dot products."""
    level = [list(ts) for ts in per_rank]
    while len(level) > 1:
        level = [[ref_pair(a, b) for a, b in zip(level[i], level[i + 1])]
                 for i in range(0, len(level), 2)]
    return level[0]


def rank_tensors(r, lengths, seed=7):
    g = np.random.default_rng(seed + 1000 * r)
    return [g.standard_normal(n) + 0.5 for n in lengths]  # a common component


# ---- closed forms -----------------------------------------------------------------

@needs_pow2
def test_orthogonal_vectors_add(rank, size):
    x = torch.zeros(size + 3, dtype=torch.float64)
    x[rank] = rank + 1.0
    out = hvd.allreduce(x, op=hvd.Adasum)
    expect = torch.zeros(size + 3, dtype=torch.float64)
    expect[:size] = torch.arange(1.0, size + 1, dtype=torch.float64)
    assert torch.equal(out, expect)
    assert x[rank] == rank + 1.0  # out of place: the input is unchanged


@needs_pow2
def test_identical_vectors_average(rank, size):
    v = torch.tensor([3.0, -1.5, 0.25, 8.0, 2.0])
    out = hvd.allreduce(v.clone(), op=hvd.Adasum)
    # adasum(v, v) = (1 - 1/2) v + (1 - 1/2) v = v at every level of the tree.
    assert torch.allclose(out, v, rtol=1e-6, atol=0)
    # Parallel vectors of different lengths: adasum(a, 2a) = (1-1)a + (1-1/4)2a = 1.5a.
    if size == 2:
        a = torch.tensor([1.0, 2.0, -2.0], dtype=torch.float64)
        out = hvd.allreduce(a * (rank + 1), op=hvd.Adasum)
        assert torch.allclose(out, 1.5 * a, rtol=1e-14, atol=0)


@needs_pow2
def test_zero_vector_is_neutral(rank, size):
    a = torch.tensor([1.0, -2.0, 4.0], dtype=torch.float64)
    x = a.clone() if rank == 0 else torch.zeros(3, dtype=torch.float64)
    assert torch.equal(hvd.allreduce(x, op=hvd.Adasum), a)


# ---- the formula and the tree against NumPy ---------------------------------------

@needs_pow2
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_tree_matches_reference(rank, size, dtype, tol):
    # Odd lengths so the halves cut through tensors; one element; one empty.
    lengths = [7, 1, 13, 0, 24]
    mine = [torch.from_numpy(t).to(dtype) for t in rank_tensors(rank, lengths)]
    got = hvd.grouped_allreduce(mine, op=hvd.Adasum)
    per_rank = [[torch.from_numpy(t).to(dtype).double().numpy()
                 for t in rank_tensors(r, lengths)] for r in range(size)]
    expect = ref_tree(per_rank)
    for g, e in zip(got, expect):
        assert g.dtype == dtype
        np.testing.assert_allclose(g.double().numpy(), e, rtol=tol, atol=tol)
    if size > 1:
        # Per-tensor dot products matter: one fused vector gives another answer.
        fused = ref_tree([[np.concatenate(ts)] for ts in per_rank])[0]
        assert np.abs(np.concatenate(expect) - fused).max() > 1e-3
    # In place, and the async form, agree with the out-of-place result.
    again = [t.clone() for t in mine]
    hvd.grouped_allreduce_(again, op=hvd.Adasum)
    for a, g in zip(again, got):
        assert torch.equal(a, g)
    h = hvd.allreduce_async(mine[2], op=hvd.Adasum, name="adasum async")
    np.testing.assert_allclose(hvd.synchronize(h).double().numpy(), expect[2], rtol=tol, atol=tol)


@needs_pow2
def test_half_precision_combines_in_float32(rank, size):
    mine = torch.from_numpy(rank_tensors(rank, [33])[0]).to(torch.float16)
    got = hvd.allreduce(mine, op=hvd.Adasum)
    assert got.dtype == torch.float16
    per_rank = [[torch.from_numpy(rank_tensors(r, [33])[0]).half().double().numpy()]
                for r in range(size)]
    np.testing.assert_allclose(got.double().numpy(), ref_tree(per_rank)[0], rtol=2e-3, atol=2e-3)


@needs_pow2
def test_prescale_and_postscale(rank, size):
    x = torch.zeros(size, dtype=torch.float64)
    x[rank] = 1.0
    out = hvd.allreduce(x, op=hvd.Adasum, prescale_factor=2.0, postscale_factor=0.5)
    assert torch.equal(out, torch.ones(size, dtype=torch.float64))


# ---- DistributedOptimizer(op=Adasum) ----------------------------------------------

@needs_pow2
def test_optimizer_combines_updates(rank, size):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).double()
    start = [p.detach().clone() for p in model.parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(5, 4, generator=g, dtype=torch.float64)
    model(x).pow(2).sum().backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    local = [-0.1 * gr for gr in grads]
    opt.synchronize()  # nothing to wait for: gradients stay local
    for p, gr in zip(model.parameters(), grads):
        assert torch.equal(p.grad, gr)
    opt.step()
    every = [torch.empty((size,) + d.shape, dtype=d.dtype) for d in local]
    for e, d in zip(every, local):
        e.copy_(hvd.allgather(d.unsqueeze(0)))
    per_rank = [[e[r].numpy() for e in every] for r in range(size)]
    for p, s, d in zip(model.parameters(), start, ref_tree(per_rank)):
        np.testing.assert_allclose(p.detach().numpy(), s.numpy() + d, rtol=1e-12, atol=1e-12)
    # Every rank holds the same parameters.
    for p in model.parameters():
        assert torch.equal(hvd.broadcast(p.detach(), 0), p.detach())


@needs_pow2
def test_optimizer_fp16_compression_and_refusals(rank, size):
    model = torch.nn.Linear(2, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   compression=hvd.Compression.fp16, op=hvd.Adasum)
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.ones(1, 2)).sum().backward()  # the same gradient on every rank
    opt.step()
    # Identical updates average to themselves (up to the fp16 cast).
    for p, b in zip(model.parameters(), before):
        assert torch.allclose(p.detach(), b - 0.5 * p.grad, atol=2e-3)
    with pytest.raises(tutti.InvalidArgumentError, match="Compression.none, fp16 or bf16"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 compression=hvd.Compression.topk, op=hvd.Adasum)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 op=hvd.Adasum, gradient_predivide_factor=2.0)


# ---- errors -----------------------------------------------------------------------

def test_non_power_of_two_size_is_refused(rank, size):
    if power_of_two(size):
        pytest.skip("a power-of-two size")
    with pytest.raises(tutti.InvalidArgumentError,
                       match=rf"power-of-two number of ranks.*the group has {size}"):
        hvd.allreduce(torch.ones(4), op=hvd.Adasum)
    with pytest.raises(tutti.InvalidArgumentError, match="power-of-two"):
        opt = hvd.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))],
                                                       lr=0.1), op=hvd.Adasum)
        opt.step()


@needs_pow2
def test_disagreeing_ranks_fail_together(rank, size):
    if size == 1:
        pytest.skip("needs peers")
    # Rank 0 passes a longer tensor: every rank raises MismatchError at once.
    with pytest.raises(tutti.MismatchError, match="disagree on the tensors"):
        hvd.allreduce(torch.ones(4 + (rank == 0)), op=hvd.Adasum, name="shapes")
    # An integer tensor on rank 0: its own error there, MismatchError elsewhere.
    bad = torch.ones(4, dtype=torch.int32 if rank == 0 else torch.float32)
    expected = (tutti.InvalidArgumentError, "floating-point") if rank == 0 else \
        (tutti.MismatchError, r"rank\(s\) 0 rejected")
    with pytest.raises(expected[0], match=expected[1]):
        hvd.allreduce(bad, op=hvd.Adasum)
    # The group still works afterwards.
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(size)))


def test_adasum_is_an_allreduce_only(rank, size):
    with pytest.raises(tutti.UnsupportedError, match=r"hvd\.reducescatter\(\): op=Adasum"):
        hvd.reducescatter(torch.ones(2 * size), op=hvd.Adasum)
