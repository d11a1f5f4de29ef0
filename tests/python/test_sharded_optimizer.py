"""tutti.ShardedOptimizer (ZeRO-1/2) through the bindings: each stage's
update equals the unsharded one (a tutti.Reducer all-reduce, then
tutti.optim.step over whole tensors) bit for bit, on numpy and torch
parameters written in place; stage 2's gradient shards cover every averaged
element once; the state checkpoints and loads; and bad input fails with a
clear error on every rank."""
import numpy as np
import pytest

import tutti

torch = pytest.importorskip("torch")

SHAPES = [("l1.weight", (6, 5)), ("l1.bias", (6,)), ("l2.weight", (3, 6)), ("l2.bias", (3,))]
# ~26 float32 per bucket: several buckets, parameters straddling shards.
CAP = dict(bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-4)
HYPER = dict(kind="adamw", lr=0.0625, weight_decay=0.125)


def grad_values(rank, step, k, n):
    """Small integers (sums over ranks are exact in any order) that differ
    by rank, step and parameter."""
    return ((np.arange(n) * (k + 1) + 3 * step + rank) % 7 - 3).astype(np.float32)


def initial(k, n):
    return (np.arange(n, dtype=np.float32) - n / 2) / 8 + k


def model(backend):
    if backend == "numpy":
        ps = [initial(k, int(np.prod(s))).reshape(s) for k, (_, s) in enumerate(SHAPES)]
        gs = [np.zeros(s, np.float32) for _, s in SHAPES]
    else:
        ps = [torch.from_numpy(initial(k, int(np.prod(s))).reshape(s)).clone()
              for k, (_, s) in enumerate(SHAPES)]
        gs = [torch.zeros(s) for _, s in SHAPES]
    return ps, gs


def reducer(world, ps, gs, name):
    r = tutti.Reducer(world, name=name, **CAP)
    for (n, _), p, g in zip(SHAPES, ps, gs):
        r.add_parameter(n, p, g)
    r.build()
    r.broadcast_parameters(0)
    return r


def as_np(t):
    return t.numpy() if torch.is_tensor(t) else t


def backward(r, gs, rank, step):
    for k, g in enumerate(gs):
        as_np(g)[...] = grad_values(rank, step, k, g.numel() if torch.is_tensor(g) else g.size
                                    ).reshape(g.shape)
    for k in reversed(range(len(gs))):
        r.grad_ready(k)
    assert r.synchronize() is True


def reference(world, rank, steps):
    """The unsharded update: all-reduce, then the fused step on whole tensors."""
    ps, gs = model("numpy")
    r = reducer(world, ps, gs, "ref")
    states = [[np.zeros_like(p), np.zeros_like(p)] for p in ps]
    for t in range(1, steps + 1):
        backward(r, gs, rank, t)
        tutti.optim.step(ps, gs, states, kind="adamw", lr=HYPER["lr"],
                         weight_decay=HYPER["weight_decay"], step=t)
    return ps


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("stage", [1, 2])
def test_update_equals_unsharded(world, rank, size, stage, backend):
    ps, gs = model(backend)
    ptrs = [p.data_ptr() if torch.is_tensor(p) else p.ctypes.data for p in ps]
    r = reducer(world, ps, gs, f"z{stage}{backend}")
    opt = tutti.ShardedOptimizer(r, stage=stage, **HYPER)
    assert isinstance(opt, tutti.Stateful) and opt.stage == stage
    assert len(opt.shards) == len(r.buckets) > 1
    for s, b in zip(opt.shards, r.buckets):
        per = -(-s["bucket_numel"] // size)  # ceil
        assert s["shard_numel"] == per
        assert (s["begin"], s["end"]) == (min(rank * per, s["bucket_numel"]),
                                          min((rank + 1) * per, s["bucket_numel"]))
    for t in range(1, 4):
        backward(r, gs, rank, t)
        opt.step()
    assert opt.steps == 3
    want = reference(world, rank, 3)
    for k, p in enumerate(ps):
        np.testing.assert_array_equal(as_np(p), want[k], err_msg=SHAPES[k][0])
        assert (p.data_ptr() if torch.is_tensor(p) else p.ctypes.data) == ptrs[k]
    # State for about 1/W of the elements: master weights + exp_avg + exp_avg_sq.
    total = sum(int(np.prod(s)) for _, s in SHAPES)
    assert opt.unsharded_state_bytes == 3 * 4 * total
    assert opt.state_bytes == 3 * 4 * sum(s["end"] - s["begin"] for s in opt.shards)
    # consolidate(): the whole float32 master weights on every rank.
    full = opt.consolidate()
    for k, (n, _) in enumerate(SHAPES):
        np.testing.assert_array_equal(full[n].reshape(want[k].shape), want[k])


def test_stage2_gradient_shards_cover_every_element_once(world, rank, size):
    ps, gs = model("numpy")
    r = reducer(world, ps, gs, "zshards")
    opt = tutti.ShardedOptimizer(r, stage=2, **HYPER)
    backward(r, gs, rank, 1)
    shards = [np.from_dlpack(v) for v in opt.gradient_shards()]
    assert [x.size for x in shards] == [s["end"] - s["begin"] for s in opt.shards]
    mine = np.array([sum(float(np.sum(x.astype(np.float64) ** 2)) for x in shards)])
    world.allreduce(mine, op="sum")
    avg = [sum(grad_values(q, 1, k, int(np.prod(s))) for q in range(size)).astype(np.float64)
           / size for k, (_, s) in enumerate(SHAPES)]
    assert mine[0] == pytest.approx(sum(float(np.sum(a ** 2)) for a in avg), rel=1e-6)
    opt.step()


def test_state_checkpoints_and_loads(world, rank, size):
    ps, gs = model("numpy")
    r = reducer(world, ps, gs, "zsave")
    opt = tutti.ShardedOptimizer(r, stage=2, **HYPER)
    for t in (1, 2):
        backward(r, gs, rank, t)
        opt.step()
    saved = opt.state_dict()
    assert saved["zero/step"][0] == 2
    assert {f"zero/{n}/{s}" for n, _ in SHAPES for s in ("master", "exp_avg", "exp_avg_sq")
            } <= set(saved)
    backward(r, gs, rank, 3)
    opt.step()
    # A fresh model and optimizer loaded at step 2 take the same third step.
    ps2, gs2 = model("numpy")
    for p in ps2:
        p[...] = 99.0
    r2 = reducer(world, ps2, gs2, "zload")
    opt2 = tutti.ShardedOptimizer(r2, stage=2, **HYPER)
    opt2.load_state_dict(saved)  # collective: writes the master weights back
    assert opt2.steps == 2
    backward(r2, gs2, rank, 3)
    opt2.step()
    for k in range(len(SHAPES)):
        np.testing.assert_array_equal(ps2[k], ps[k], err_msg=SHAPES[k][0])


def test_learning_rate_is_settable(world, rank):
    ps, gs = model("numpy")
    r = reducer(world, ps, gs, "zlr")
    opt = tutti.ShardedOptimizer(r, kind="sgd", lr=0.5)
    assert opt.hyper["kind"] == "sgd" and opt.lr == 0.5
    opt.lr = 0.0
    before = [p.copy() for p in ps]
    backward(r, gs, rank, 1)
    opt.step()
    for a, b in zip(ps, before):
        np.testing.assert_array_equal(a, b)  # lr 0: no change


def test_errors(world, rank, size):
    ps, gs = model("numpy")
    r = reducer(world, ps, gs, "zerr")
    with pytest.raises(tutti.InvalidArgumentError, match="'sgd', 'adam', 'adamw'"):
        tutti.ShardedOptimizer(r, kind="lamb")
    with pytest.raises(tutti.InvalidArgumentError, match="reducer is None"):
        tutti.ShardedOptimizer(None)
    opt = tutti.ShardedOptimizer(r, stage=2, **HYPER)
    backward(r, gs, rank, 1)
    opt.step()
    with pytest.raises(tutti.InvalidArgumentError, match="step"):
        opt.step()  # the same gradients twice
    if size > 1:
        ps3, gs3 = model("numpy")
        r3 = reducer(world, ps3, gs3, "zmis")
        with pytest.raises(tutti.MismatchError) as e:
            tutti.ShardedOptimizer(r3, kind="adam", lr=0.001 * (1 + (rank == size - 1)))
        assert f"rank {size - 1}" in str(e.value) and "lr" in str(e.value)
    world.barrier()
