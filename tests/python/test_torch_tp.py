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
