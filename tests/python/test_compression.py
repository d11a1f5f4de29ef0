"""Compressors through the bindings: created by name with options, passed
to tutti.Reducer, averages within each algorithm's error and bit-identical
on every rank, state dicts that resume error feedback exactly, and the
torch integration (Compression.* in DistributedOptimizer)."""
import numpy as np
import pytest

import tutti

torch = pytest.importorskip("torch")
import tutti.torch as hvd  # noqa: E402

import horovod_mlp  # noqa: E402

SHAPES = [(16, 12), (12,), (8, 8)]


def grads_for(rank, step):
    rng = np.random.default_rng(100 * step + rank)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def reducer_with(world, name, grads, **options):
    comp = tutti.make_compressor(name, **options)
    r = tutti.Reducer(world, compressor=comp, name=f"dp-{name}")
    for k, g in enumerate(grads):
        r.add_parameter(f"w{k}", np.zeros_like(g), g)
    r.build()
    return r, comp


def step(r, grads, values):
    for g, v in zip(grads, values):
        g[...] = v
    for i in range(len(grads)):
        r.grad_ready(i)
    assert r.synchronize()


def identical_everywhere(world, arrays):
    flat = np.concatenate([a.reshape(-1) for a in arrays])
    every = np.empty(world.size * flat.size, np.float32)
    world.allgather(flat, every)
    return all(np.array_equal(every.reshape(world.size, -1)[0], row)
               for row in every.reshape(world.size, -1))


@pytest.mark.parametrize("name,rtol", [("none", 1e-6), ("fp16", 4e-3), ("bf16", 3e-2),
                                       ("topk", 1e-6), ("auto", 1e-6)])
def test_averages_within_the_algorithms_error(world, rank, size, name, rtol):
    options = {"topk_ratio": 1.0} if name == "topk" else {}
    grads = [np.zeros(s, np.float32) for s in SHAPES]
    r, comp = reducer_with(world, name, grads, **options)
    assert comp.name == name and r.options["compressor"] is comp
    values = grads_for(rank, 0)
    step(r, grads, values)
    mean = [sum(grads_for(q, 0)[k] for q in range(size)) / size for k in range(len(SHAPES))]
    scale = max(np.abs(m).max() for m in mean)
    for g, m in zip(grads, mean):
        np.testing.assert_allclose(g, m, rtol=0, atol=rtol * scale * (size + 1))
    assert identical_everywhere(world, grads)
    stats = comp.stats()
    if size > 1 and name in ("fp16", "bf16"):
        assert 0 < stats["wire_bytes"] < stats["uncompressed_bytes"]
    comp.reset_stats()
    assert comp.stats()["wire_bytes"] == 0


@pytest.mark.parametrize("name", ["topk", "powersgd", "onebit"])
def test_error_feedback_state_resumes_exactly(world, rank, size, name):
    options = {"topk": {"topk_ratio": 0.1}, "powersgd": {"powersgd_rank": 2},
               "onebit": {"onebit_chunk": 32}}[name]
    ga = [np.zeros(s, np.float32) for s in SHAPES]
    a, ca = reducer_with(world, name, ga, **options)
    step(a, ga, grads_for(rank, 0))
    assert identical_everywhere(world, ga)
    saved = ca.state_dict()
    assert saved and all(isinstance(v, np.ndarray) for v in saved.values())
    assert any(np.abs(v).sum() > 0 for k, v in saved.items() if "residual" in k)
    step(a, ga, grads_for(rank, 1))
    # A fresh reducer whose compressor loads the saved state continues
    # exactly where the first one was.
    gb = [np.zeros(s, np.float32) for s in SHAPES]
    b, cb = reducer_with(world, name, gb, **options)
    cb.load_state_dict(saved)
    step(b, gb, grads_for(rank, 1))
    for x, y in zip(ga, gb):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(tutti.InvalidArgumentError):
        cb.load_state_dict({})


def test_names_and_errors(world):
    assert set(tutti.compression.NAMES) == {"none", "fp16", "bf16", "topk", "powersgd",
                                            "onebit", "auto"}
    with pytest.raises(tutti.InvalidArgumentError, match="zip"):
        tutti.make_compressor("zip")
    r = tutti.Reducer(world, compressor="none")
    assert r.options["compressor"] is None
    with pytest.raises(ValueError):
        tutti.Reducer(world, compressor="fp16", op="sum")  # a compressor averages


@pytest.mark.parametrize("compression", ["fp16", "bf16", "topk", "powersgd", "onebit", "auto"])
def test_distributed_optimizer_with_compression(rank, size, compression):
    hvd.init()
    comp = getattr(hvd.Compression, compression)
    if compression == "topk":
        comp = comp(ratio=0.5)
    model = horovod_mlp.make_model(3).float()
    x, y = (t.float() for t in horovod_mlp.dataset())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                                   named_parameters=model.named_parameters(),
                                   compression=comp)
    assert opt.compressor.name == compression
    n = 24 // size
    losses = []
    for s in range(8):
        begin = (s * 24) % horovod_mlp.ROWS + rank * n
        xb, yb = x[begin:begin + n], y[begin:begin + n]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        losses.append(hvd.allreduce(loss.detach()).item())
    assert losses[-1] < losses[0]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.equal(hvd.broadcast(flat, 0), flat), "replicas stay identical"
    assert "Compression.topk(topk_ratio=0.5)" == repr(hvd.Compression.topk(ratio=0.5))
