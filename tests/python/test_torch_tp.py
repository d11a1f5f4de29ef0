"""tutti.torch.tensor_parallel: autograd through tutti's region operators
and parallel layers matches dense PyTorch (forward, gradients, training,
clipping) with the TP group spanning all ranks."""
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tutti  # noqa: E402
from tutti.torch import tensor_parallel as tp  # noqa: E402


@pytest.fixture(scope="module")
def mesh(world):
    return tutti.ProcessMesh(world, world.size)


def shard(t, p, r, dim):
    return t.chunk(p, dim)[r]


def test_region_functions_differentiate(rank, size, mesh):
    x = torch.arange(6.0, requires_grad=True)
    w = torch.arange(6.0) * (rank + 1)
    (tp.copy_to_tp(x, mesh) * w).sum().backward()
    # Backward of copy_to_tp sums the gradients over the TP group.
    assert torch.equal(x.grad, torch.arange(6.0) * sum(r + 1 for r in range(size)))
    y = torch.full((2, 3), float(rank), requires_grad=True)
    full = tp.gather_from_tp(y, mesh, "act")
    assert full.shape == (2, 3 * size)
    assert torch.equal(full[0], torch.arange(size).repeat_interleave(3).float())
    (full * torch.arange(3.0 * size)).sum().backward()
    assert torch.equal(y.grad, (torch.arange(3.0) + 3 * rank).expand(2, 3))
    z = torch.ones(2 * size, 2, requires_grad=True)
    part = tp.reduce_scatter_to_sequence_parallel(z, mesh)
    assert torch.equal(part, torch.full((2, 2), float(size)))
    part.sum().backward()
    assert torch.equal(z.grad, torch.ones(2 * size, 2))
    if size > 1:
        with pytest.raises(tutti.InvalidArgumentError, match="tp_size"):
            tp.scatter_to_tp(torch.ones(2, 3 * size + 1), mesh)


def dense_and_tp_mlp(mesh, size):
    torch.manual_seed(3)
    d_in, d_hid, d_out = 4, 6, 3
    fc1, fc2 = torch.nn.Linear(d_in, d_hid), torch.nn.Linear(d_hid, d_out)
    col = tp.ColumnParallelLinear(d_in, d_hid, mesh, gather_output=False, name="fc1")
    row = tp.RowParallelLinear(d_hid, d_out, mesh, input_is_parallel=True, name="fc2")
    col.layer.load_from_full(fc1.weight.detach(), fc1.bias.detach())
    row.layer.load_from_full(fc2.weight.detach(), fc2.bias.detach())
    return (fc1, fc2), (col, row)


def test_mlp_matches_dense_and_trains_the_same(rank, size, mesh):
    (fc1, fc2), (col, row) = dense_and_tp_mlp(mesh, size)
    assert col.weight.shape == (6 // size, 4) and row.weight.shape == (3, 6 // size)
    assert col.weight.tutti_shard["dim"] == 0 and not col.weight.tp_replicated
    assert row.bias.tp_replicated
    assert col.weight.data_ptr() == col.layer.weight.data_ptr, "zero copy"
    dense_opt = torch.optim.SGD(list(fc1.parameters()) + list(fc2.parameters()), lr=0.1)
    tp_opt = torch.optim.SGD(list(col.parameters()) + list(row.parameters()), lr=0.1)
    torch.manual_seed(9)
    for step in range(3):
        x = torch.randn(5, 4, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        y = torch.randn(5, 3)
        dense_out = fc2(torch.relu(fc1(x)))
        tp_out = row(torch.relu(col(x2)))
        assert torch.allclose(tp_out, dense_out, rtol=1e-5, atol=1e-6)
        dense_opt.zero_grad()
        tp_opt.zero_grad()
        F.mse_loss(dense_out, y).backward()
        F.mse_loss(tp_out, y).backward()
        tol = dict(rtol=1e-4, atol=1e-6)
        assert torch.allclose(x2.grad, x.grad, **tol)
        assert torch.allclose(col.weight.grad, shard(fc1.weight.grad, size, rank, 0), **tol)
        assert torch.allclose(col.bias.grad, shard(fc1.bias.grad, size, rank, 0), **tol)
        assert torch.allclose(row.weight.grad, shard(fc2.weight.grad, size, rank, 1), **tol)
        assert torch.allclose(row.bias.grad, fc2.bias.grad, **tol)
        dense_opt.step()
        tp_opt.step()
    # The optimizer updated the memory the C++ layers compute with.
    assert torch.allclose(col.weight, shard(fc1.weight, size, rank, 0), rtol=1e-4, atol=1e-6)
    assert torch.allclose(torch.from_dlpack(row.layer.weight), row.weight)


def test_clip_grad_norm_matches_dense(rank, size, mesh):
    (fc1, fc2), (col, row) = dense_and_tp_mlp(mesh, size)
    x = torch.randn(5, 4)
    (fc2(fc1(x)) ** 2).sum().backward()
    (row(col(x)) ** 2).sum().backward()
    dense = torch.nn.utils.clip_grad_norm_(list(fc1.parameters()) + list(fc2.parameters()), 0.5)
    total = tp.clip_grad_norm_(list(col.parameters()) + list(row.parameters()), 0.5, mesh)
    assert total.item() == pytest.approx(dense.item(), rel=1e-5)
    assert torch.allclose(row.bias.grad, fc2.bias.grad, rtol=1e-4, atol=1e-7)
    assert torch.allclose(col.weight.grad, shard(fc1.weight.grad, size, rank, 0), rtol=1e-4, atol=1e-7)


def test_embedding_and_vocab_parallel_cross_entropy(rank, size, mesh):
    vocab, dim = 6, 4
    torch.manual_seed(4)
    emb_dense = torch.nn.Embedding(vocab, dim)
    head_dense = torch.nn.Linear(dim, vocab, bias=False)
    emb = tp.VocabParallelEmbedding(vocab, dim, mesh)
    head = tp.ColumnParallelLinear(dim, vocab, mesh, bias=False, gather_output=False)
    emb.layer.load_from_full(emb_dense.weight.detach())
    head.layer.load_from_full(head_dense.weight.detach())
    assert head.bias is None
    ce = tp.VocabParallelCrossEntropy(vocab, mesh)
    ids = torch.tensor([0, 5, 3, 3, 1])
    targets = torch.tensor([2, -100, 5, 0, 1])
    loss = ce(head(emb(ids)), targets)
    ref = F.cross_entropy(head_dense(emb_dense(ids)), targets, ignore_index=-100)
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(ref.item(), rel=1e-5)
    loss.backward()
    ref.backward()
    tol = dict(rtol=1e-4, atol=1e-6)
    assert torch.allclose(head.weight.grad, shard(head_dense.weight.grad, size, rank, 0), **tol)
    assert torch.allclose(emb.weight.grad, shard(emb_dense.weight.grad, size, rank, 0), **tol)
    # Two forwards before a backward: the earlier one is refused, not wrong.
    first = ce(head(emb(ids)), targets)
    ce(head(emb(ids)), targets)
    with pytest.raises(tutti.InvalidArgumentError, match="latest forward"):
        first.backward()


class DenseSPBlock(torch.nn.Module):
    """Megatron's SP recipe on one rank: LayerNorm -> fc1 -> gelu -> fc2 -> LayerNorm."""

    def __init__(self, h, ffn):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
        self.fc1, self.fc2 = torch.nn.Linear(h, ffn), torch.nn.Linear(ffn, h)
        with torch.no_grad():  # non-trivial LayerNorm parameters
            for ln in (self.ln1, self.ln2):
                ln.weight.copy_(1 + 0.5 * torch.randn(h))
                ln.bias.copy_(0.5 * torch.randn(h))

    def forward(self, x):
        return self.ln2(self.fc2(F.gelu(self.fc1(self.ln1(x)))))


class SPBlock(torch.nn.Module):
    """The same block with sequence parallelism: x is this rank's [s/p, b, h]."""

    def __init__(self, dense, mesh):
        super().__init__()
        h, ffn = dense.fc1.in_features, dense.fc1.out_features
        self.ln1, self.ln2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
        self.ln1.load_state_dict(dense.ln1.state_dict())
        self.ln2.load_state_dict(dense.ln2.state_dict())
        self.fc1 = tp.ColumnParallelLinear(h, ffn, mesh, gather_output=False,
                                           sequence_parallel=True, name="fc1")
        self.fc2 = tp.RowParallelLinear(ffn, h, mesh, input_is_parallel=True,
                                        sequence_parallel=True, name="fc2")
        self.fc1.layer.load_from_full(dense.fc1.weight.detach(), dense.fc1.bias.detach())
        self.fc2.layer.load_from_full(dense.fc2.weight.detach(), dense.fc2.bias.detach())
        tp.mark_sequence_parallel(*self.ln1.parameters(), *self.ln2.parameters())

    def forward(self, x):
        return self.ln2(self.fc2(F.gelu(self.fc1(self.ln1(x)))))


@pytest.fixture(scope="module", params=["tp_world", "tp2_dp"])
def sp_mesh(request, world, mesh):
    """TP over the whole world, and TP 2 x DP size/2 where the world has
    another even split (np 4: TP 2 x DP 2)."""
    if request.param == "tp_world":
        return mesh
    if world.size % 2 or world.size <= 2:
        pytest.skip("TP 2 x DP > 1 needs an even world of 4 or more")
    return tutti.ProcessMesh(world, 2)


def sp_and_dense_backward(mesh, reduce):
    rank, size = mesh.tp_rank, mesh.tp_size
    s, b, h, ffn = 12, 2, 12, 24  # every size divisible by tp_size 1, 2, 3 and 4
    torch.manual_seed(11)
    dense = DenseSPBlock(h, ffn)
    sp = SPBlock(dense, mesh)
    x, target = torch.randn(s, b, h), torch.randn(s, b, h)
    (dense(x) * target).sum().backward()
    # Each rank's loss covers its sequence slice; their sum is the dense loss.
    (sp(shard(x, size, rank, 0)) * shard(target, size, rank, 0)).sum().backward()
    if reduce:
        tp.allreduce_sequence_parallel_grads(sp, mesh)
    return dense, sp


# float32, the dense sum over s*b = 24 positions taken in another order
# (per rank, then over the TP group): well within 1e-4 relative, 1e-5 absolute.
SP_TOL = dict(rtol=1e-4, atol=1e-5)


def test_sequence_parallel_layernorm_grads_match_dense(sp_mesh):
    mesh = sp_mesh
    rank, size = mesh.tp_rank, mesh.tp_size
    dense, sp = sp_and_dense_backward(mesh, reduce=True)
    assert sp.ln1.weight.sequence_parallel and sp.ln1.weight.tp_replicated
    for name in ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"):
        got = sp.get_parameter(name).grad
        want = dense.get_parameter(name).grad
        assert torch.allclose(got, want, **SP_TOL), (name, (got - want).abs().max())
    assert torch.allclose(sp.fc1.weight.grad, shard(dense.fc1.weight.grad, size, rank, 0), **SP_TOL)
    assert torch.allclose(sp.fc2.weight.grad, shard(dense.fc2.weight.grad, size, rank, 1), **SP_TOL)
    assert torch.allclose(sp.fc2.bias.grad, dense.fc2.bias.grad, **SP_TOL)
    dense_norm = torch.nn.utils.clip_grad_norm_(dense.parameters(), 0.5)
    total = tp.clip_grad_norm_(sp.parameters(), 0.5, mesh)
    assert total.item() == pytest.approx(dense_norm.item(), rel=1e-5)
    assert torch.allclose(sp.ln2.weight.grad, dense.ln2.weight.grad, **SP_TOL)


def test_sequence_parallel_grads_are_partial_until_reduced(sp_mesh):
    mesh = sp_mesh
    size = mesh.tp_size
    dense, sp = sp_and_dense_backward(mesh, reduce=False)
    partial = sp.ln1.weight.grad.clone()
    if size > 1:
        assert not torch.allclose(partial, dense.ln1.weight.grad, **SP_TOL)
    # Clipping partial gradients would be silently wrong at tp_size > 1: it is
    # refused (at every tp_size, so the missing call shows on one rank too).
    with pytest.raises(tutti.InvalidArgumentError, match="allreduce_sequence_parallel_grads"):
        tp.clip_grad_norm_(sp.parameters(), 0.5, mesh)
    tp.allreduce_sequence_parallel_grads(sp, mesh)
    assert torch.allclose(sp.ln1.weight.grad, dense.ln1.weight.grad, **SP_TOL)
    # A second backward accumulates partial gradients again: refused again.
    sp(torch.ones(12 // size, 2, 12)).sum().backward()
    with pytest.raises(tutti.InvalidArgumentError, match="allreduce_sequence_parallel_grads"):
        tp.clip_grad_norm_(sp.parameters(), 0.5, mesh)


def test_error_on_one_rank_fails_every_rank_at_once(rank, size, mesh):
    """A shape error on TP rank 1 only: it raises its own error, the peers
    (waiting in the all-gather) raise MismatchError naming the op and rank 1
    at once, not after TUTTI_TIMEOUT; the mesh stays usable."""
    if size < 2:
        pytest.skip("needs two TP ranks")
    import time
    row = tp.RowParallelLinear(4 * size, 3, mesh, input_is_parallel=True,
                               sequence_parallel=True, name="fc2")
    # Rank 1's sequence (2 * size + 1) is not divisible by tp_size.
    x = torch.ones(2 * size + (rank == 1), 2, 4)
    start = time.monotonic()
    if rank == 1:
        with pytest.raises(tutti.InvalidArgumentError, match="fc2.*not divisible by tp_size"):
            row(x)
    else:
        with pytest.raises(tutti.MismatchError, match="'fc2' forward.*rank 1 rejected"):
            row(x)
    assert time.monotonic() - start < 20
    assert row(torch.ones(2 * size, 2, 4)).shape == (2, 2, 3)
