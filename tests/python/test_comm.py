"""Collectives through the bindings on numpy and torch tensors: distinct
per-rank data, closed-form expected values, zero copy, errors with context."""
import ctypes

import numpy as np
import pytest

import tutti

torch = pytest.importorskip("torch")

NP_DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64]
TORCH_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                torch.int8, torch.uint8, torch.int32, torch.int64]
SIZES = [0, 1, 7, 1000]


def values(rank, n):
    """Small integers, exact in every dtype even after summing 4 ranks."""
    i = np.arange(n)
    return ((i * 7 + rank * 13) % 17 - 8 + rank).astype(np.float64)


def as_np(x, dtype):
    if dtype == np.uint8:
        x = np.maximum(x, 0)
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", NP_DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_numpy_allreduce_ops(world, rank, size, dtype, n):
    ranks = [as_np(values(r, n), dtype).astype(np.float64) for r in range(size)]
    for op, ref in [("sum", np.sum), ("min", np.min), ("max", np.max)]:
        x = as_np(values(rank, n), dtype)
        ptr = x.ctypes.data
        world.allreduce(x, op=op)
        assert x.ctypes.data == ptr, "in place, zero copy"
        expect = ref(np.stack(ranks), axis=0) if n else np.zeros(0)
        np.testing.assert_array_equal(x.astype(np.float64), expect.astype(dtype).astype(np.float64))


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_torch_allreduce_avg_and_out_of_place(world, rank, size, dtype, n):
    base = [torch.from_numpy(np.maximum(values(r, n), 0) if dtype == torch.uint8 else values(r, n)).to(dtype)
            for r in range(size)]
    x = base[rank].clone()
    ptr = x.data_ptr()
    out = torch.empty_like(x)
    world.allreduce(x, op=tutti.SUM, out=out)
    assert x.data_ptr() == ptr
    total = sum(b.double() for b in base) if n else torch.zeros(0, dtype=torch.float64)
    assert torch.equal(out.double(), total.to(dtype).double()), (out, total)
    assert torch.equal(x, base[rank]), "input untouched"
    world.allreduce(x, op="avg")
    if dtype == torch.float64:
        expect = total / size
    elif dtype.is_floating_point:  # divided in float32, rounded once
        expect = (total.float() / size).to(dtype) if n else total.to(dtype)
    else:
        expect = torch.trunc(total / size).to(dtype)
    assert torch.equal(x, expect), (x, expect)


@pytest.mark.parametrize("root", [0, -1])
def test_broadcast_allgather_reduce_scatter_alltoall(world, rank, size, root):
    root = root % size
    x = torch.from_numpy(values(rank, 11)).float()
    world.broadcast(x, root=root)
    assert torch.equal(x, torch.from_numpy(values(root, 11)).float())
    # allgather / allgatherv
    mine = np.full(3, rank, dtype=np.int32)
    out = np.empty(3 * size, dtype=np.int32)
    world.allgather(mine, out)
    np.testing.assert_array_equal(out, np.repeat(np.arange(size), 3))
    rows = tutti.allgather(np.full((rank + 1, 2), rank, dtype=np.float32))
    assert rows.shape == (size * (size + 1) // 2, 2)
    np.testing.assert_array_equal(rows[:, 0], np.concatenate([np.full(r + 1, r) for r in range(size)]))
    # reduce_scatter: block b of rank r holds r + b; rank k gets sum_r (r + k)
    inp = torch.cat([torch.full((4,), float(rank + b)) for b in range(size)])
    got = tutti.reduce_scatter(inp, op="sum")
    assert torch.equal(got, torch.full((4,), float(sum(range(size)) + size * rank)))
    # alltoall: block j of rank r holds 100 r + j; rank k receives 100 r + k from r
    a = np.concatenate([np.full(2, 100 * rank + j, dtype=np.int64) for j in range(size)])
    b = tutti.alltoall(a)
    np.testing.assert_array_equal(b, np.concatenate([np.full(2, 100 * r + rank) for r in range(size)]))


def test_async_work_and_split(world, rank, size):
    xs = [np.full(1000, rank + k, dtype=np.float32) for k in range(5)]
    works = [world.allreduce(x, op="sum", async_op=True) for x in xs]
    for k, w in enumerate(works):
        w.wait()
        assert w.test()
        assert w.seq > 0 and "allreduce #" in w.description
        np.testing.assert_array_equal(xs[k], np.full(1000, sum(range(size)) + size * k, dtype=np.float32))
    g = world.split(color=rank % 2, key=rank, name="parity")
    members = [r for r in range(size) if r % 2 == rank % 2]
    assert g.size == len(members) and g.name == "parity"
    y = np.array([rank], dtype=np.int64)
    g.allreduce(y)
    assert y[0] == sum(members)
    assert world.split(color=-1) is None


def test_send_recv_ring(world, rank, size):
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = np.empty(5, dtype=np.float64)
    r = world.recv(got, peer=prv, tag=3, async_op=True)
    world.send(np.full(5, float(rank)), peer=nxt, tag=3)
    r.wait()
    np.testing.assert_array_equal(got, np.full(5, float(prv)))


def test_errors_carry_context(world, rank, size):
    with pytest.raises(tutti.InvalidArgumentError, match="not contiguous"):
        world.allreduce(np.arange(10.0)[::2])
    with pytest.raises(tutti.InvalidArgumentError, match="does not support DLPack"):
        world.allreduce([1.0, 2.0])
    with pytest.raises(ValueError):  # InvalidArgumentError is also a ValueError
        world.allreduce(np.zeros(2), op="median")
    if size > 1:
        # Mismatched shapes across ranks: an error on every rank, no hang.
        x = np.zeros(4 + (rank == size - 1), dtype=np.float32)
        with pytest.raises(tutti.MismatchError) as e:
            world.allreduce(x, name="grad")
        msg = str(e.value)
        assert f"rank {rank}:" in msg and "'grad'" in msg and f"rank {size - 1} has" in msg
        assert e.value.code == "mismatch"
        world.barrier()  # still usable
        # Only the last rank passes an unusable tensor: it raises the precise
        # error, its peers learn at once that it rejected the operation.
        bad = rank == size - 1
        for call in (lambda t: world.allreduce(t, name="w"),
                     lambda t: world.broadcast(t, root=0),
                     lambda t: world.allgather(t, np.empty(4 * size, np.float32))):
            t = np.zeros(8, np.float32)[::2] if bad else np.zeros(4, np.float32)
            with pytest.raises(tutti.Error) as e:
                call(t)
            if bad:
                assert isinstance(e.value, tutti.InvalidArgumentError)
                assert "not contiguous" in str(e.value)
            else:
                assert isinstance(e.value, tutti.MismatchError)
                assert f"rank {size - 1} rejected the arguments" in str(e.value)
        world.barrier()


class _CudaLookalike:
    """A host array whose DLPack export claims to live on cuda:0, to exercise
    the wrong-device path on machines without a GPU."""

    def __init__(self):
        self.a = np.zeros(4, dtype=np.float32)

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        cap = self.a.__dlpack__()
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype = ctypes.c_void_p
        get.argtypes = [ctypes.py_object, ctypes.c_char_p]
        ptr = get(cap, b"dltensor")
        # DLTensor: data pointer, then DLDevice {int32 type, int32 id}
        ctypes.c_int32.from_address(ptr + 8).value = 2
        return cap


def test_cuda_tensor_without_gpu_is_a_clear_error(world, rank, size):
    if tutti.cuda_device_count() > 0:
        pytest.skip("a GPU is present")
    with pytest.raises((tutti.InvalidArgumentError, tutti.UnsupportedError), match="cuda:0"):
        world.allreduce(_CudaLookalike())
    if size > 1:
        # The wrong device on one rank only: its peers fail at once too.
        wrong = rank == size - 1
        with pytest.raises(tutti.Error) as e:
            world.allreduce(_CudaLookalike() if wrong else np.zeros(4, np.float32), name="dev")
        if wrong:
            assert "cuda:0" in str(e.value)
        else:
            assert isinstance(e.value, tutti.MismatchError)
            assert f"rank {size - 1} rejected the arguments" in str(e.value)
        world.barrier()


FRAMEWORKS = [("numpy", np.float32), ("numpy", np.float16), ("numpy", np.int64),
              ("torch", torch.float32), ("torch", torch.float16), ("torch", torch.bfloat16),
              ("torch", torch.int32)]


def make(fw, dtype, values):
    a = np.asarray(values, dtype=np.float64)
    return a.astype(dtype) if fw == "numpy" else torch.from_numpy(a).to(dtype)


def as_f64(x):
    return np.asarray(x.double() if torch.is_tensor(x) else x, dtype=np.float64)


def ptr(x):
    return x.data_ptr() if torch.is_tensor(x) else x.ctypes.data


@pytest.mark.parametrize("fw,dtype", FRAMEWORKS)
def test_every_collective_in_and_out_of_place(world, rank, size, fw, dtype):
    """Each collective on each framework, blocking and async, in place and
    out of place, against closed-form results (small integers: exact)."""
    n = 3
    # allreduce sum, in place (async) and out of place (functional).
    x = make(fw, dtype, np.arange(n) + rank)
    p = ptr(x)
    world.allreduce(x, op="sum", async_op=True).wait()
    assert ptr(x) == p
    np.testing.assert_array_equal(as_f64(x), size * np.arange(n) + sum(range(size)))
    y = tutti.allreduce(make(fw, dtype, np.arange(n) + rank), op="max")
    assert type(y) is type(x)
    np.testing.assert_array_equal(as_f64(y), np.arange(n) + size - 1)
    # broadcast from the last rank: in place and out of place.
    b = make(fw, dtype, np.full(n, rank))
    world.broadcast(b, root=size - 1)
    np.testing.assert_array_equal(as_f64(b), np.full(n, size - 1))
    c = tutti.broadcast(make(fw, dtype, np.full(n, rank + 1)), root=0)
    np.testing.assert_array_equal(as_f64(c), np.full(n, 1))
    # allgather into a caller's output, and the functional (row) form.
    out = make(fw, dtype, np.zeros(size * n))
    w = world.allgather(make(fw, dtype, np.full(n, rank)), out, async_op=True)
    w.wait()
    np.testing.assert_array_equal(as_f64(out), np.repeat(np.arange(size), n))
    g = tutti.allgather(make(fw, dtype, np.full((1, n), rank)))
    np.testing.assert_array_equal(as_f64(g)[:, 0], np.arange(size))
    # reduce_scatter: block k of rank r is r + k; rank k gets sum_r (r + k).
    rs = tutti.reduce_scatter(make(fw, dtype, np.repeat(np.arange(size) + rank, n)), op="sum")
    np.testing.assert_array_equal(as_f64(rs), np.full(n, sum(range(size)) + size * rank))
    # alltoall: block j of rank r is 10 r + j; rank k receives 10 r + k.
    a2a = tutti.alltoall(make(fw, dtype, np.repeat(10 * rank + np.arange(size), n)))
    np.testing.assert_array_equal(as_f64(a2a), np.repeat(10 * np.arange(size) + rank, n))
    tutti.barrier()
