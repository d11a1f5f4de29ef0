"""Tensor parallel through the bindings: the mesh, every region operator and
the parallel layers against dense numpy references, with the TP group
spanning all ranks (tp_size = world size)."""
import numpy as np
import pytest

import tutti
from tutti import tensor_parallel as tp

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def mesh(world):
    return tutti.ProcessMesh(world, world.size)


def rng(seed):
    return np.random.default_rng(seed)


def shard(x, p, r, axis):
    n = x.shape[axis] // p
    return np.take(x, range(r * n, (r + 1) * n), axis=axis)


def test_mesh_layout(world, rank, size, mesh):
    assert (mesh.tp_size, mesh.dp_size, mesh.tp_rank, mesh.dp_rank) == (size, 1, rank, 0)
    assert mesh.tp_group.size == size and mesh.dp_group.size == 1
    assert mesh.rank_of(0, size - 1) == size - 1
    assert repr(mesh) == f"<tutti.ProcessMesh TP {size} x DP 1>"
    flat = tutti.ProcessMesh(world, 1)
    assert (flat.tp_size, flat.dp_size, flat.dp_rank) == (1, size, rank)
    with pytest.raises(tutti.InvalidArgumentError, match="tp_size"):
        tutti.ProcessMesh(world, size + 1 if size > 1 else 0)


def test_region_operators(rank, size, mesh):
    p = size
    # copy_to_tp: identity forward, backward sums the gradients over TP.
    x = np.arange(6, dtype=np.float32) + rank
    out = np.empty_like(x)
    tp.copy_to_tp_forward(mesh, x, out)
    np.testing.assert_array_equal(out, x)
    g = np.empty_like(x)
    tp.copy_to_tp_backward(mesh, x, g)
    np.testing.assert_array_equal(g, sum(np.arange(6, dtype=np.float32) + r for r in range(p)))
    # reduce_from_tp: all-reduce forward, identity backward.
    tp.reduce_from_tp_forward(mesh, torch.from_numpy(x), torch.from_numpy(out))
    np.testing.assert_array_equal(out, g)
    # gather_from_tp: [2, 3] per rank -> [2, 3p] in rank order on the last dim.
    mine = np.full((2, 3), float(rank), np.float32)
    full = np.empty((2, 3 * p), np.float32)
    tp.gather_from_tp_forward(mesh, mine, full)
    np.testing.assert_array_equal(full, np.repeat(np.arange(p, dtype=np.float32), 3)[None].repeat(2, 0))
    back = np.empty_like(mine)
    tp.gather_from_tp_backward(mesh, full, back)
    np.testing.assert_array_equal(back, mine)
    # scatter_to_tp: keeps this rank's slice of the last dim.
    whole = np.arange(12 * p, dtype=np.float32).reshape(2, 6 * p)
    part = np.empty((2, 6), np.float32)
    tp.scatter_to_tp_forward(mesh, whole, part, name="act")
    np.testing.assert_array_equal(part, shard(whole, p, rank, 1))
    # Sequence parallel on the first dimension.
    seq = np.full((2, 3), float(rank), np.float32)
    gathered = np.empty((2 * p, 3), np.float32)
    tp.gather_from_sequence_parallel_forward(mesh, seq, gathered)
    np.testing.assert_array_equal(gathered[:, 0], np.repeat(np.arange(p), 2))
    rs = np.empty((2, 3), np.float32)
    tp.gather_from_sequence_parallel_backward(mesh, gathered, rs)  # reduce-scatter
    np.testing.assert_array_equal(rs, np.full((2, 3), float(p * rank)))
    tp.reduce_scatter_to_sequence_parallel_forward(mesh, gathered, rs)
    np.testing.assert_array_equal(rs, np.full((2, 3), float(p * rank)))
    tp.scatter_to_sequence_parallel_forward(mesh, gathered, rs)
    np.testing.assert_array_equal(rs, np.full((2, 3), float(rank)))
    with pytest.raises(tutti.InvalidArgumentError):
        tp.scatter_to_tp_forward(mesh, np.zeros((2, 6 * p + 1), np.float32),
                                 np.zeros((2, 6), np.float32))


def dense_mlp(x, w1, b1, w2, b2, gy):
    h = x @ w1.T + b1
    y = h @ w2.T + b2
    gh = gy @ w2
    return y, {"w2": gy.T @ h, "b2": gy.sum(0), "w1": gh.T @ x, "b1": gh.sum(0), "x": gh @ w1}


def test_column_row_mlp_matches_dense(rank, size, mesh):
    p, n, d_in, d_hid, d_out = size, 5, 4, 6, 3
    r = rng(7)
    x, gy = r.standard_normal((n, d_in)), r.standard_normal((n, d_out))
    w1, b1 = r.standard_normal((d_hid, d_in)), r.standard_normal(d_hid)
    w2, b2 = r.standard_normal((d_out, d_hid)), r.standard_normal(d_out)
    y_ref, g_ref = dense_mlp(x, w1, b1, w2, b2, gy)
    col = tp.ColumnParallelLinear(mesh, d_in, d_hid, gather_output=False, name="fc1")
    row = tp.RowParallelLinear(mesh, d_hid, d_out, input_is_parallel=True, name="fc2")
    col.load_from_full(w1, b1)  # float64 host arrays, converted to float32
    row.load_from_full(torch.from_numpy(w2), torch.from_numpy(b2))
    assert col.out_features_per_rank == d_hid // p and not col.gather_output
    assert row.in_features_per_rank == d_hid // p and row.input_is_parallel
    np.testing.assert_allclose(col.weight.numpy(), shard(w1, p, rank, 0), rtol=1e-6)
    xf, gyf = x.astype(np.float32), gy.astype(np.float32)
    h = np.empty((n, d_hid // p), np.float32)
    y = np.empty((n, d_out), np.float32)
    col.forward(xf, h)
    row.forward(h, y)
    np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-5)
    gh, gx = np.empty_like(h), np.empty_like(xf)
    col.zero_grad()
    row.zero_grad()
    row.backward(h, gyf, gh)
    col.backward(xf, gh, gx)
    tol = dict(rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gx, g_ref["x"], **tol)
    np.testing.assert_allclose(row.weight_grad.numpy(), shard(g_ref["w2"], p, rank, 1), **tol)
    np.testing.assert_allclose(row.bias_grad.numpy(), g_ref["b2"], **tol)
    np.testing.assert_allclose(col.weight_grad.numpy(), shard(g_ref["w1"], p, rank, 0), **tol)
    np.testing.assert_allclose(col.bias_grad.numpy(), shard(g_ref["b1"], p, rank, 0), **tol)
    # The TP norm equals the dense model's (row's bias counted once).
    dense_sq = sum(float((g_ref[k] ** 2).sum()) for k in ("w1", "b1", "w2", "b2"))
    assert tp.grad_norm_squared(mesh, [col, row]) == pytest.approx(dense_sq, rel=1e-5)
    params = row.parameters()
    assert [q["name"] for q in params] == ["fc2.weight", "fc2.bias"]
    assert params[0]["shard"]["dim"] == 1 and params[0]["shard"]["global_shape"] == [d_out, d_hid]
    assert params[1]["tp_replicated"] and params[1]["shard"]["dim"] == -1
    # The views share the layer's memory; the layer outlives its Python name.
    w = torch.from_dlpack(col.weight)
    assert w.data_ptr() == col.weight.data_ptr
    before = w.clone()
    del col
    assert torch.equal(w, before)


def test_state_dict_roundtrip_and_seeded_init(rank, size, mesh):
    a = tp.ColumnParallelLinear(mesh, 4, 6, name="l", dtype=torch.bfloat16)
    a.init_from_seed(3)
    sd = a.state_dict()
    assert set(sd) == {"l.weight", "l.bias"} and sd["l.weight"].shape == (6 // size, 4)
    assert a.state_shards()["l.weight"]["offset"] == rank * (6 // size)
    b = tp.ColumnParallelLinear(mesh, 4, 6, name="l", dtype="bfloat16")
    b.load_state_dict(sd)
    assert torch.equal(torch.from_dlpack(a.weight), torch.from_dlpack(b.weight))
    # Seeded init is a function of the global index: TP 1 holds the same
    # global tensor, of which this rank has a slice.
    dense = tp.ColumnParallelLinear(tutti.ProcessMesh(tutti.world(), 1), 4, 6, name="l")
    dense.init_from_seed(3)
    a32 = tp.ColumnParallelLinear(mesh, 4, 6, name="l")
    a32.init_from_seed(3)
    np.testing.assert_array_equal(a32.weight.numpy(), shard(dense.weight.numpy(), size, rank, 0))
    assert tp.RowParallelLinear(mesh, 6, 2, bias=False).bias is None
    if size > 1:
        with pytest.raises(tutti.InvalidArgumentError, match=f"out_features {6 * size + 1} .*tp_size {size}"):
            tp.ColumnParallelLinear(mesh, 4, 6 * size + 1)


def test_vocab_embedding_and_cross_entropy(rank, size, mesh):
    p, vocab, dim, n = size, 6, 3, 4
    r = rng(11)
    table = r.standard_normal((vocab, dim)).astype(np.float32)
    ids = np.array([0, 5, 2, 5], dtype=np.int64)
    emb = tp.VocabParallelEmbedding(mesh, vocab, dim)
    emb.load_from_full(table)
    assert emb.vocab_start == rank * (vocab // p) and emb.vocab_per_rank == vocab // p
    out = np.empty((n, dim), np.float32)
    emb.forward(ids, out)
    np.testing.assert_array_equal(out, table[ids])
    emb.zero_grad()
    gout = np.ones((n, dim), np.float32)
    emb.backward(ids, gout)
    counts = np.bincount(ids, minlength=vocab).astype(np.float32)
    np.testing.assert_array_equal(emb.weight_grad.numpy(),
                                  shard(np.repeat(counts[:, None], dim, 1), p, rank, 0))
    with pytest.raises(tutti.InvalidArgumentError):
        emb.forward(np.array([vocab], np.int64), np.empty((1, dim), np.float32))
    # Cross-entropy over logits split by vocabulary.
    logits = r.standard_normal((n, vocab)).astype(np.float32)
    targets = np.array([1, 4, -100, 0], dtype=np.int64)
    ce = tp.VocabParallelCrossEntropy(mesh, vocab)
    mine = np.ascontiguousarray(shard(logits, p, rank, 1))
    losses, mean = np.empty(n, np.float32), np.empty(1, np.float32)
    ce.forward(mine, targets, losses, mean)
    lse = np.log(np.exp(logits.astype(np.float64)).sum(1))
    keep = targets != -100
    ref = np.where(keep, lse - logits[np.arange(n), np.where(keep, targets, 0)], 0.0)
    np.testing.assert_allclose(losses, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mean[0], ref[keep].mean(), rtol=1e-5)
    grad = np.empty_like(mine)
    ce.backward(mine, targets, grad, 2.0)
    soft = np.exp(logits - lse[:, None])
    onehot = np.zeros_like(soft)
    onehot[np.arange(n)[keep], targets[keep]] = 1
    gref = 2.0 * (soft - onehot) * keep[:, None] / keep.sum()
    np.testing.assert_allclose(grad, shard(gref, p, rank, 1), rtol=1e-4, atol=1e-6)
