"""tutti.torch's Horovod-compatible collectives on torch tensors: distinct
per-rank data, closed-form results, zero copy, async handles, autograd,
objects, and errors."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import tutti  # noqa: E402
import tutti.torch as hvd  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]


@pytest.fixture(scope="module", autouse=True)
def horovod_init():
    hvd.init()


def per_rank(r, n=5, dtype=torch.float32):
    return (torch.arange(n, dtype=torch.float64) * 3 + r).to(dtype)


def test_process_facts(rank, size):
    assert (hvd.rank(), hvd.size()) == (rank, size)
    assert 0 <= hvd.local_rank() < hvd.local_size() <= size
    assert hvd.cross_size() * hvd.local_size() == size and hvd.is_homogeneous()
    assert hvd.is_initialized() and hvd.mpi_built() and not hvd.gloo_built()
    assert isinstance(hvd.nccl_built(), bool)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_ops(rank, size, dtype):
    total = sum(per_rank(r).double() for r in range(size))
    x = per_rank(rank, dtype=dtype)
    out = hvd.allreduce(x, op=hvd.Sum, name="x")
    assert torch.equal(out, total.to(dtype)) and torch.equal(x, per_rank(rank, dtype=dtype))
    assert torch.equal(hvd.allreduce(x, op=hvd.Max), per_rank(size - 1, dtype=dtype))
    assert torch.equal(hvd.allreduce(x, op=hvd.Min), per_rank(0, dtype=dtype))
    if dtype.is_floating_point:
        # Average (the default); avg of k*3 + r over ranks is k*3 + (size-1)/2.
        assert torch.equal(hvd.allreduce(x), (per_rank(0).double() + (size - 1) / 2).to(dtype))
        assert torch.equal(hvd.allreduce(x, average=False), total.to(dtype))
    ptr = x.data_ptr()
    y = hvd.allreduce_(x, op=hvd.Sum)
    assert y is x and x.data_ptr() == ptr and torch.equal(x, total.to(dtype))


def test_allreduce_scaling_compression_and_async(rank, size):
    x = per_rank(rank)
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert torch.equal(out, sum(per_rank(r) for r in range(size)))
    for comp in (hvd.Compression.fp16, hvd.Compression.bf16):
        c = hvd.allreduce(x, op=hvd.Sum, compression=comp)
        assert c.dtype == torch.float32 and torch.equal(c, sum(per_rank(r) for r in range(size)))
    handles = [hvd.allreduce_async_(per_rank(rank + k), op=hvd.Sum, name=f"h{k}") for k in range(3)]
    for k, h in enumerate(handles):
        got = hvd.synchronize(h)
        assert hvd.poll(h)
        assert torch.equal(got, sum(per_rank(r + k) for r in range(size)))
    h = hvd.allreduce_async(x, op=hvd.Max)
    assert torch.equal(hvd.synchronize(h), per_rank(size - 1))
    with pytest.raises(ValueError, match="DistributedOptimizer"):
        hvd.allreduce(x, compression=hvd.Compression.topk)


def test_allgather_broadcast_alltoall_reducescatter(rank, size):
    # allgather with a different first dimension per rank.
    mine = torch.full((rank + 1, 2), float(rank), dtype=torch.bfloat16)
    got = hvd.allgather(mine)
    assert got.shape == (size * (size + 1) // 2, 2) and got.dtype == torch.bfloat16
    assert torch.equal(got[:, 0].float(), torch.cat([torch.full((r + 1,), float(r)) for r in range(size)]))
    # broadcast from the last rank, in and out of place.
    root = size - 1
    x = per_rank(rank, dtype=torch.float16)
    assert torch.equal(hvd.broadcast(x, root), per_rank(root, dtype=torch.float16))
    assert torch.equal(x, per_rank(rank, dtype=torch.float16))
    ptr = x.data_ptr()
    hvd.broadcast_(x, root_rank=root)
    assert x.data_ptr() == ptr and torch.equal(x, per_rank(root, dtype=torch.float16))
    # alltoall, equal blocks: block j of rank r holds 10 r + j.
    a = torch.cat([torch.full((2,), 10.0 * rank + j) for j in range(size)])
    b = hvd.alltoall(a)
    assert torch.equal(b, torch.cat([torch.full((2,), 10.0 * r + rank) for r in range(size)]))
    # alltoall with splits: rank r sends j + 1 rows to rank j.
    splits = [j + 1 for j in range(size)]
    src = torch.cat([torch.full((j + 1, 3), 10.0 * rank + j) for j in range(size)])
    out, received = hvd.alltoall(src, splits=splits)
    assert received.tolist() == [rank + 1] * size
    assert torch.equal(out, torch.cat([torch.full((rank + 1, 3), 10.0 * r + rank) for r in range(size)]))
    # reducescatter (sum): 2 size + 1 rows, the first rank gets one more.
    n = 2 * size + 1
    rows = torch.arange(n, dtype=torch.float64)[:, None].repeat(1, 2) + rank
    mine = hvd.reducescatter(rows, op=hvd.Sum)
    counts = [n // size + (1 if r < n % size else 0) for r in range(size)]
    begin = sum(counts[:rank])
    expect = (torch.arange(n, dtype=torch.float64)[:, None].repeat(1, 2) * size
              + sum(range(size)))[begin:begin + counts[rank]]
    assert torch.equal(mine, expect)
    even = hvd.reducescatter(torch.ones(2 * size, 3))  # Average
    assert torch.equal(even, torch.ones(2, 3))
    hvd.barrier()


def test_autograd_through_collectives(rank, size):
    x = per_rank(rank).requires_grad_()
    # d/dx_r of sum_r' (w_r' . allreduce_avg(x)) = avg_r' w_r'
    w = torch.arange(5.0) + rank
    (hvd.allreduce(x) * w).sum().backward()
    assert torch.allclose(x.grad, torch.arange(5.0) + (size - 1) / 2)
    # allgather's backward averages the output gradient and keeps this
    # rank's rows (Horovod's convention).
    y = torch.full((rank + 1,), 1.0, requires_grad=True)
    g = hvd.allgather(y)
    (g * (rank + 1)).sum().backward()
    assert torch.allclose(y.grad, torch.full((rank + 1,), (size + 1) / 2))
    # broadcast: the root receives the averaged gradient, the others zero.
    z = torch.ones(3, requires_grad=True)
    (hvd.broadcast(z, 0) * (rank + 1)).sum().backward()
    assert torch.equal(z.grad, torch.full((3,), (size + 1) / 2 if rank == 0 else 0.0))


def test_objects(rank, size):
    obj = {"epoch": 3, "rank": rank, "names": ["a", "b"] * rank}
    got = hvd.broadcast_object(obj, root_rank=size - 1)
    assert got == {"epoch": 3, "rank": size - 1, "names": ["a", "b"] * (size - 1)}
    every = hvd.allgather_object((rank, "x" * rank))
    assert every == [(r, "x" * r) for r in range(size)]


def test_broadcast_parameters_and_optimizer_state(rank, size):
    torch.manual_seed(rank)  # a different model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    params = torch.cat([t.reshape(-1).double() for t in model.state_dict().values()])
    gathered = hvd.allgather(params[None])
    assert all(torch.equal(gathered[0], gathered[r]) for r in range(size))
    # Only the root has stepped: its momentum buffers and lr reach the others.
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.9)
    if rank == 0:
        model(torch.randn(5, 3)).sum().backward()
        opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    bufs = torch.cat([opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(bufs[None])
    assert all(torch.equal(gathered[0], gathered[r]) for r in range(size))


def test_errors_with_context(rank, size):
    with pytest.raises(tutti.InvalidArgumentError, match="not contiguous"):
        hvd.allreduce_(torch.zeros(4, 4).t())
    with pytest.raises(tutti.InvalidArgumentError, match="splits"):
        hvd.alltoall(torch.zeros(size + 1), splits=[1] * size)
    if size > 1:
        # Shapes that differ across ranks: an error on every rank, no hang.
        x = torch.zeros(3 + (rank == 0))
        with pytest.raises(tutti.MismatchError, match="'mism'"):
            hvd.allreduce(x, name="mism")
        # A wrong dtype on one rank only, in place.
        y = torch.zeros(4, dtype=torch.float64 if rank == 1 else torch.float32)
        with pytest.raises(tutti.MismatchError, match="float64"):
            hvd.allreduce_(y, name="dt")
    hvd.barrier()
    with pytest.raises(tutti.InvalidArgumentError, match="complex"):
        hvd.allreduce_(torch.zeros(2, dtype=torch.complex64))


def test_numpy_and_torch_share_one_build(rank, size):
    """The same extension serves numpy and torch tensors (DLPack)."""
    a = np.full(3, float(rank), np.float32)
    t = torch.full((3,), float(rank))
    tutti.world().allreduce(a, op="sum")
    tutti.world().allreduce(t, op="sum")
    assert a.tolist() == t.tolist() == [float(sum(range(size)))] * 3
