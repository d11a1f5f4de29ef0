"""Horovod API surface beyond the basics (issue 14): build facts, errors that
name the Python call, bool/int16/uint8 tensors in collectives and broadcast
helpers, grouped operations and the async alltoall/reducescatter.  Closed
forms: rank r contributes values built from r."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import tutti  # noqa: E402
import tutti.torch as hvd  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def horovod_init():
    hvd.init()


# ---- build facts and errors -------------------------------------------------------

def test_build_facts(rank, size):
    for fn in (hvd.nccl_built, hvd.mpi_built, hvd.gloo_built, hvd.cuda_built, hvd.rocm_built,
               hvd.mpi_threads_supported, hvd.mpi_enabled, hvd.ddp_built, hvd.ccl_built):
        assert type(fn()) is bool, fn.__name__
    assert hvd.mpi_built() and not hvd.gloo_built() and not hvd.rocm_built()
    assert not hvd.nccl_built() or hvd.cuda_built()  # NCCL needs CUDA
    # Under mpiexec the world runs on MPI, which granted MPI_THREAD_MULTIPLE
    # (tutti refuses to start below it).
    assert hvd.mpi_enabled()
    assert hvd.mpi_thread_level() == "MPI_THREAD_MULTIPLE"
    assert hvd.mpi_threads_supported()


def _fresh_python(code, **env):
    """Runs ``code`` in a new interpreter without the MPI launcher's
    variables (a local world of one), returns (rc, stdout + stderr)."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    clean["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    clean.update(env)
    proc = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True,
                          text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_errors_name_the_python_call(rank):
    if rank != 0:
        return
    rc, out = _fresh_python(
        "import torch, tutti.torch as hvd\n"
        "for f in (hvd.rank, hvd.size, hvd.local_rank, hvd.cross_size, hvd.mpi_threads_supported,\n"
        "          lambda: hvd.allreduce(torch.ones(2)), lambda: hvd.grouped_allreduce([torch.ones(2)]),\n"
        "          lambda: hvd.broadcast_parameters({'w': torch.ones(1)}, 0)):\n"
        "    try:\n"
        "        f(); print('NO ERROR')\n"
        "    except ValueError as e:\n"
        "        print(type(e).__name__, e)\n"
        "hvd.init()\n"
        "print('local', hvd.size(), hvd.mpi_enabled(), hvd.mpi_threads_supported(),\n"
        "      repr(hvd.mpi_thread_level()))\n",
        TUTTI_WORLD="local")
    assert rc == 0, out
    lines = out.strip().splitlines()
    for call, line in zip(["hvd.rank()", "hvd.size()", "hvd.local_rank()", "hvd.cross_size()",
                           "hvd.mpi_threads_supported()", "hvd.allreduce()",
                           "hvd.grouped_allreduce()", "hvd.broadcast_parameters()"], lines):
        assert line.startswith("InvalidArgumentError " + call), out
        assert "call hvd.init() first" in line and "tutti::init" not in line, out
    # Without MPI there is no thread level to report.
    assert lines[-1] == "local 1 False False ''", out


def test_adasum_reducescatter_and_bool_average_refused(rank, size):
    with pytest.raises(tutti.UnsupportedError, match=r"hvd\.reducescatter\(\): op=Adasum"):
        hvd.reducescatter(torch.ones(2 * size), op=hvd.Adasum)
    with pytest.raises(tutti.InvalidArgumentError, match="bool tensor"):
        hvd.allreduce(torch.ones(2, dtype=torch.bool))  # Average


# ---- bool, int16, uint8 ------------------------------------------------------------

def test_small_dtypes_in_collectives(rank, size):
    # bool: Sum/Max = any, Min/Product = all.  Element k is true on rank r
    # when (k + r) % 3 == 0.
    flags = torch.tensor([(k + rank) % 3 == 0 for k in range(6)])
    anyr = torch.tensor([any((k + r) % 3 == 0 for r in range(size)) for k in range(6)])
    allr = torch.tensor([all((k + r) % 3 == 0 for r in range(size)) for k in range(6)])
    assert torch.equal(hvd.allreduce(flags, op=hvd.Sum), anyr)
    assert torch.equal(hvd.allreduce(flags, op=hvd.Max), anyr)
    assert torch.equal(hvd.allreduce(flags, op=hvd.Min), allr)
    inplace = flags.clone()
    assert hvd.allreduce_(inplace, op=hvd.Product) is inplace and torch.equal(inplace, allr)
    # int16 beyond int8's range; reduced exactly (Sum, Max, Min).
    h = torch.tensor([1000 * rank - 7, -3000, 30000 // (rank + 1)], dtype=torch.int16)
    want = sum(torch.tensor([1000 * r - 7, -3000, 30000 // (r + 1)]) for r in range(size))
    got = hvd.allreduce(h, op=hvd.Sum)
    assert got.dtype == torch.int16 and torch.equal(got, want.to(torch.int16))
    assert torch.equal(hvd.allreduce(h, op=hvd.Min)[2], torch.tensor(30000 // size, dtype=torch.int16))
    u = torch.tensor([rank, 200, 7 * rank], dtype=torch.uint8)
    assert torch.equal(hvd.allreduce(u, op=hvd.Max),
                       torch.tensor([size - 1, 200, 7 * (size - 1)], dtype=torch.uint8))
    for dtype, make in ((torch.bool, lambda r: torch.tensor([r % 2 == 1, True, r == 0])),
                        (torch.int16, lambda r: torch.tensor([-32768 + r, 32767 - r, 0x1234],
                                                             dtype=torch.int16)),
                        (torch.uint8, lambda r: torch.tensor([255 - r, r, 128], dtype=torch.uint8))):
        mine = make(rank)
        # broadcast (out of place and in place) from the last rank
        root = size - 1
        assert torch.equal(hvd.broadcast(mine, root), make(root))
        buf = mine.clone()
        assert hvd.broadcast_(buf, root) is buf and torch.equal(buf, make(root)), dtype
        # allgather: rank r contributes r + 1 rows
        rows = mine.repeat(rank + 1, 1)
        gathered = hvd.allgather(rows)
        assert gathered.dtype == dtype
        assert torch.equal(gathered, torch.cat([make(r).repeat(r + 1, 1) for r in range(size)]))
        # alltoall: row j goes to rank j
        out = hvd.alltoall(torch.stack([make(rank)] * size))
        assert torch.equal(out, torch.stack([make(r) for r in range(size)]))
    # reducescatter of int16: Sum of rank r's (row i = [r, i]) blocks.
    rs = torch.tensor([[rank, i] for i in range(2 * size)], dtype=torch.int16)
    mine = hvd.reducescatter(rs, op=hvd.Sum)
    total = size * (size - 1) // 2
    assert mine.dtype == torch.int16
    assert torch.equal(mine, torch.tensor([[total, size * i] for i in (2 * rank, 2 * rank + 1)],
                                          dtype=torch.int16))


def test_moved_dtypes_must_agree(rank, size):
    """bool/int16 travel as uint8/float16 views; a rank with the view's own
    dtype must not receive reinterpreted bits silently."""
    if size == 1:
        return
    for mine in (torch.int16, torch.float16, torch.float16), (torch.bool, torch.uint8, torch.int16):
        dtype = mine[rank % 3] if rank > 0 else mine[0]
        t = torch.ones(4, dtype=dtype)
        with pytest.raises(tutti.MismatchError):
            hvd.broadcast_(t, 0)
        with pytest.raises(tutti.MismatchError):
            hvd.allgather(t)
        with pytest.raises(tutti.MismatchError):
            hvd.broadcast_parameters({"t": t}, 0)
    hvd.barrier()
    h = hvd.broadcast(torch.full((2,), rank, dtype=torch.int16), 0)
    assert h.tolist() == [0, 0]  # the communicator is still usable


class _Masked(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.lin = torch.nn.Linear(3, 2)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(2, 3, generator=g))
            self.lin.bias.fill_(seed)
        self.register_buffer("mask", torch.tensor([seed % 2 == 0, seed % 3 == 0, True]))
        self.register_buffer("codes", torch.tensor([seed, -seed, 20000], dtype=torch.int16))
        self.register_buffer("bytes", torch.tensor([seed, 255], dtype=torch.uint8))

    def forward(self, x):
        return self.lin(x * self.mask)


def test_broadcast_helpers_with_bool_int16_uint8(rank, size):
    root = size - 1
    model, ref = _Masked(rank + 1), _Masked(root + 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    for k, v in ref.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    obj = hvd.broadcast_object({"mask": ref.mask if rank == root else None,
                                "codes": ref.codes if rank == root else None}, root)
    assert torch.equal(obj["mask"], ref.mask) and torch.equal(obj["codes"], ref.codes)
    # Optimizer state holding bool / int16 / uint8 tensors (a custom entry).
    mine = _Masked(rank + 1)
    opt = torch.optim.SGD(mine.parameters(), lr=0.1, momentum=0.9)
    p0 = next(iter(mine.parameters()))
    opt.state[p0]["flags"] = torch.tensor([rank == root, True])
    opt.state[p0]["count"] = torch.tensor([rank * 100 + 5], dtype=torch.int16)
    opt.state[p0]["tag"] = torch.tensor([rank], dtype=torch.uint8)
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    st = opt.state[next(iter(mine.parameters()))]
    # torch's load_state_dict casts state to a floating parameter's dtype.
    assert st["flags"].tolist() == [1.0, 1.0]
    assert st["count"].tolist() == [root * 100 + 5] and st["tag"].tolist() == [root]


def test_ddp_with_bool_buffer(rank, size):
    model = hvd.DistributedDataParallel(_Masked(rank + 1))
    ref = _Masked(1)  # rank 0's
    for k, v in ref.state_dict().items():
        assert torch.equal(model.module.state_dict()[k], v), k
    x = torch.ones(4, 3)
    model(x).sum().backward()
    # d/dw sum(lin(x * mask)) = rows of 4 * mask, the same on every rank.
    want = (4 * ref.mask.to(torch.float32)).expand(2, 3)
    assert torch.allclose(model.module.lin.weight.grad, want)


# ---- grouped, async alltoall/reducescatter ---------------------------------------

def _vals(r, k, n=4, dtype=torch.float32):
    return (torch.arange(n, dtype=torch.float64) * (k + 1) + 10 * r).to(dtype)


def test_grouped_allreduce(rank, size):
    tensors = [_vals(rank, 0), _vals(rank, 1, 3, torch.float64), _vals(rank, 2).reshape(2, 2),
               torch.tensor([rank, 1], dtype=torch.int32)]
    sums = [sum(_vals(r, 0) for r in range(size)),
            sum(_vals(r, 1, 3, torch.float64) for r in range(size)),
            sum(_vals(r, 2) for r in range(size)).reshape(2, 2),
            torch.tensor([size * (size - 1) // 2, size], dtype=torch.int32)]
    out = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="g")
    assert len(out) == 4
    for got, want, orig in zip(out, sums, tensors):
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert torch.equal(tensors[0], _vals(rank, 0))  # inputs untouched
    avg = hvd.grouped_allreduce(tensors[:3])  # Average
    for got, want in zip(avg, sums[:3]):
        assert torch.allclose(got, want / size)
    scaled = hvd.grouped_allreduce(tensors[:2], op=hvd.Sum, prescale_factor=2.0,
                                   postscale_factor=0.25)
    assert torch.equal(scaled[0], sums[0] / 2) and torch.equal(scaled[1], sums[1] / 2)
    h = hvd.grouped_allreduce_async(tensors, op=hvd.Sum)
    got = hvd.synchronize(h)
    assert hvd.poll(h) and all(torch.equal(a, b) for a, b in zip(got, sums))
    inplace = [t.clone() for t in tensors]
    res = hvd.grouped_allreduce_(inplace, op=hvd.Sum)
    assert all(a is b for a, b in zip(res, inplace))
    assert all(torch.equal(a, b) for a, b in zip(inplace, sums))
    inplace = [t.clone() for t in tensors[:2]]
    hvd.synchronize(hvd.grouped_allreduce_async_(inplace, op=hvd.Max))
    assert torch.equal(inplace[0], _vals(size - 1, 0))
    # Differentiable: d(sum of Sum-allreduce)/dx is the Sum-allreduce of ones.
    x = _vals(rank, 0).requires_grad_()
    y = hvd.grouped_allreduce([x, x * 2], op=hvd.Sum)
    (y[0].sum() + y[1].sum()).backward()
    assert torch.equal(x.grad, torch.full((4,), 3.0 * size))


def test_grouped_allgather_and_reducescatter(rank, size):
    a = torch.full((rank + 1, 2), float(rank))
    b = torch.tensor([rank * 10, rank * 10 + 1], dtype=torch.int64)
    ga, gb = hvd.grouped_allgather([a, b])
    assert torch.equal(ga, torch.cat([torch.full((r + 1, 2), float(r)) for r in range(size)]))
    assert torch.equal(gb, torch.tensor([v for r in range(size) for v in (10 * r, 10 * r + 1)]))
    h = hvd.grouped_allgather_async([b])
    assert torch.equal(hvd.synchronize(h)[0], gb)
    # reducescatter: row i of rank r is (i + r); Sum over ranks = size*i + T.
    t = size * (size - 1) // 2
    x = torch.arange(2 * size, dtype=torch.float32).reshape(-1, 1) + rank
    y = torch.arange(size + 1, dtype=torch.float64) + rank  # uneven: rank 0 gets 2
    rx, ry = hvd.grouped_reducescatter([x, y], op=hvd.Sum)
    assert torch.equal(rx, torch.tensor([[size * i + t] for i in (2 * rank, 2 * rank + 1)],
                                        dtype=torch.float32))
    mine = [0, 1] if rank == 0 else [rank + 1]
    assert torch.equal(ry, torch.tensor([size * i + t for i in mine], dtype=torch.float64))
    ax, = hvd.synchronize(hvd.grouped_reducescatter_async([x], prescale_factor=2.0,
                                                          postscale_factor=0.5))
    assert torch.allclose(ax, rx / size)  # Average


def test_alltoall_and_reducescatter_async(rank, size):
    # Rank r sends j + 1 rows of value 100 r + j to rank j.
    splits = [j + 1 for j in range(size)]
    src = torch.cat([torch.full((j + 1, 2), 100.0 * rank + j) for j in range(size)])
    h = hvd.alltoall_async(src, splits=splits, name="a2a")
    out, recv = hvd.synchronize(h)
    assert hvd.poll(h) and recv.tolist() == [rank + 1] * size
    assert torch.equal(out, torch.cat([torch.full((rank + 1, 2), 100.0 * r + rank)
                                       for r in range(size)]))
    even, recv = hvd.synchronize(hvd.alltoall_async(torch.arange(size) + 10 * rank))
    assert even.tolist() == [10 * r + rank for r in range(size)] and recv.tolist() == [1] * size
    x = torch.arange(size * 2, dtype=torch.float32) + rank
    h = hvd.reducescatter_async(x, op=hvd.Sum, postscale_factor=0.5)
    got = hvd.synchronize(h)
    t = size * (size - 1) // 2
    assert torch.equal(got, torch.tensor([(size * i + t) / 2 for i in (2 * rank, 2 * rank + 1)]))
    assert torch.allclose(hvd.reducescatter(x), got * 2 / size)  # Average


# ---- process sets ----------------------------------------------------------------

def test_process_sets(rank, size):
    g = hvd.global_process_set
    assert (g.process_set_id, g.size(), g.rank(), g.included()) == (0, size, rank, True)
    assert hvd.broadcast(torch.tensor([rank]), size - 1, process_set=g).item() == size - 1
    evens = [r for r in range(size) if r % 2 == 0]
    odds = [r for r in range(size) if r % 2 == 1]
    even_set = hvd.add_process_set(evens)
    odd_set = hvd.add_process_set(hvd.ProcessSet(odds)) if odds else None
    mine, ranks = (even_set, evens) if rank % 2 == 0 else (odd_set, odds)
    other, other_ranks = (odd_set, odds) if rank % 2 == 0 else (even_set, evens)
    assert mine.included() and mine.rank() == ranks.index(rank) and mine.size() == len(ranks)
    x = torch.tensor([float(rank), 1.0])
    assert torch.equal(hvd.allreduce(x, op=hvd.Sum, process_set=mine),
                       torch.tensor([float(sum(ranks)), len(ranks)]))
    assert torch.equal(hvd.allgather(torch.tensor([rank]), process_set=mine), torch.tensor(ranks))
    for root in ranks:  # root_rank is a world rank, as in Horovod
        assert hvd.broadcast(torch.tensor([10.0 * rank]), root, process_set=mine).item() == 10 * root
    assert hvd.broadcast_object({"r": rank}, ranks[-1], process_set=mine) == {"r": ranks[-1]}
    a, b = hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum, process_set=mine)
    assert torch.equal(b, 2 * a) and a[0].item() == sum(ranks)
    # DistributedOptimizer on the set: d(w * (rank + 1))/dw averaged over it.
    lin = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(lin.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=1.0),
                                   named_parameters=lin.named_parameters(), process_set=mine)
    lin(torch.tensor([[rank + 1.0]])).sum().backward()
    opt.step()
    assert lin.weight.item() == -(sum(ranks) / len(ranks) + 1)
    if other is not None:
        assert not other.included() and other.rank() == -1
        with pytest.raises(tutti.InvalidArgumentError, match=r"hvd\.allreduce_async\(\).*not in"):
            hvd.allreduce(x, process_set=other)
        with pytest.raises(tutti.InvalidArgumentError, match="root_rank"):
            hvd.broadcast(x, other_ranks[0], process_set=mine)
        with pytest.raises(tutti.MismatchError, match="differ"):
            hvd.add_process_set([0] if rank == 0 else [0, 1])
    with pytest.raises(tutti.InvalidArgumentError, match="already has ranks"):
        hvd.add_process_set(evens)
    assert hvd.remove_process_set(even_set) and not hvd.remove_process_set(even_set)
    assert not hvd.remove_process_set(hvd.global_process_set)
    if odd_set is not None:
        assert hvd.remove_process_set(odd_set)
    with pytest.raises(tutti.InvalidArgumentError, match="not registered"):
        hvd.allreduce(x, process_set=even_set)
    # Static sets through init (idempotent: registers what is new).
    every = hvd.ProcessSet(range(size))
    hvd.init(process_sets=[every])
    assert every.process_set_id is not None and every.rank() == rank
    assert hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, process_set=every).item() == size
    assert hvd.remove_process_set(every)
