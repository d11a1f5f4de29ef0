"""A Horovod-style training script (horovod_mlp.py, Horovod API names only)
trained on every rank of this job matches single-process training on the
full batch; Horovod's DistributedOptimizer semantics (accumulation, Sum,
synchronize/skip_synchronize, zero_grad checks) hold."""
import pytest

torch = pytest.importorskip("torch")
import tutti  # noqa: E402
import tutti.torch as hvd  # noqa: E402

import horovod_mlp  # noqa: E402


def assert_same_model(a, b, rtol):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=rtol, atol=rtol * 1e-2), name


@pytest.mark.parametrize("variant", [
    dict(),
    dict(backward_passes_per_step=2),
    dict(op="sum"),
    dict(optimizer="adam", lr=0.01),
])
def test_distributed_training_matches_full_batch(variant):
    model, losses = horovod_mlp.train(steps=6, **variant)
    ref_args = {k: v for k, v in variant.items() if k in ("lr", "optimizer")}
    ref, ref_losses = horovod_mlp.train_single_process(steps=6, **ref_args)
    # float64 everywhere: only the summation order differs.
    assert_same_model(model, ref, rtol=1e-10)
    assert losses == pytest.approx(ref_losses, rel=1e-10)
    assert losses[-1] < losses[0]
    # Every rank holds the same parameters.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.equal(hvd.broadcast(flat, 0), flat)


def make_opt(model, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    return hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **kw)


def test_optimizer_protocol(rank, size):
    hvd.init()
    model = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    opt = make_opt(model)
    assert isinstance(opt, torch.optim.SGD)
    # Gradient of sum(w . x_r) is x_r; the average is the mean of the x_r.
    x = torch.tensor([[1.0 + rank, 2.0 * rank]])
    model(x).sum().backward()
    with pytest.raises(tutti.InvalidArgumentError, match="zero_grad"):
        opt.zero_grad()  # before the reduction was waited for
    opt.synchronize()
    mean = torch.tensor([[1.0 + (size - 1) / 2, (size - 1) * 1.0]])
    assert torch.allclose(model.weight.grad, mean)
    with opt.skip_synchronize():
        opt.step()
    assert torch.allclose(model.weight, -0.5 * mean)
    opt.zero_grad()
    # Too many backward passes before step() is Horovod's error.
    model(x).sum().backward()
    with pytest.raises(tutti.InvalidArgumentError, match="backward_passes_per_step"):
        model(x).sum().backward()
    opt.step()
    stats = opt.reducer.stats()
    assert stats["steps"] == 2 and stats["buckets_reduced"] >= 2


def test_fewer_passes_than_backward_passes_per_step_still_reduce(rank, size):
    """step() after one of two passes reduces what was accumulated (Horovod
    forces the allreduce in step() too)."""
    model = torch.nn.Linear(3, 1, bias=False)
    opt = make_opt(model, backward_passes_per_step=2)
    model(torch.full((1, 3), float(rank))).sum().backward()
    assert opt.reducer.stats()["steps"] == 0
    opt.synchronize()
    assert torch.allclose(model.weight.grad, torch.full((1, 3), (size - 1) / 2))


def test_zero_grad_set_to_none_and_unused_parameters(rank, size):
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(2, 2), "unused": torch.nn.Linear(2, 2)})
    opt = make_opt(model)
    for step in range(2):
        opt.zero_grad(set_to_none=True)
        x = torch.full((1, 2), float(rank + step))
        model["used"](x).sum().backward()
        opt.synchronize()
        expect = float(step) + (size - 1) / 2
        assert torch.allclose(model["used"].weight.grad, torch.full((2, 2), expect))
        # Unused on every rank: zero, present (Horovod fills them in).
        assert torch.equal(model["unused"].weight.grad, torch.zeros(2, 2))
        with opt.skip_synchronize():
            opt.step()


def test_named_parameters_checks():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="not named"):
        hvd.DistributedOptimizer(opt, named_parameters=[("w", model.weight)])
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(opt, named_parameters=[("w", model.weight), ("w", model.bias)])


@pytest.mark.parametrize("factor", [1.0, 2.0, "size"])
def test_gradient_predivide_factor_keeps_the_average(rank, size, factor):
    # Horovod's gradient_predivide_factor f: divide by f before the sum and
    # by size / f after it.  Dyadic gradients: every division by a power of
    # two is exact, and (sum / 2) / 1.5 rounds like sum / 3 (size 3, f = 2),
    # so the result equals the float32 mean bit for bit.
    hvd.init()
    f = float(size) if factor == "size" else factor
    model = torch.nn.Linear(3, 1, bias=False)
    opt = make_opt(model, gradient_predivide_factor=f)
    assert opt.reducer.options["gradient_predivide_factor"] == f
    xs = [torch.tensor([[1.0 + r, 2.0 * r - 3.0, 0.375 * (r + 1)]]) for r in range(size)]
    model(xs[rank]).sum().backward()
    opt.synchronize()
    mean = torch.cat(xs).sum(0, keepdim=True) / size
    assert torch.equal(model.weight.grad, mean), (f, model.weight.grad, mean)


@pytest.mark.parametrize("compression", ["none", "fp16", "bf16"])
@pytest.mark.parametrize("factor", [1.0, 2.0, 0.5, "size"])
def test_gradient_predivide_factor_with_compression(rank, size, compression, factor):
    # Horovod's MNIST with --fp16-allreduce --gradient-predivide-factor f:
    # the cast divides by f before rounding to 16 bits and by size / f after
    # converting back (f = 1: the cast's own division by size before it).
    # Dyadic gradients: whenever the divisions are by powers of two the
    # result is the float32 mean bit for bit; otherwise it is within the
    # cast's bound, (size + 1) roundings of the wire type relative to max |x|
    # (docs/compression.md).
    hvd.init()
    f = float(size) if factor == "size" else factor
    model = torch.nn.Linear(3, 1, bias=False)
    opt = make_opt(model, gradient_predivide_factor=f,
                   compression=getattr(hvd.Compression, compression))
    xs = [torch.tensor([[1.0 + r, 2.0 * r - 3.0, 0.375 * (r + 1)]]) for r in range(size)]
    model(xs[rank]).sum().backward()
    opt.synchronize()
    mean = torch.cat(xs).sum(0, keepdim=True) / size
    got = model.weight.grad
    before = f if (compression == "none" or f != 1.0) else float(size)
    dyadic = all(float(x).is_integer() and x > 0 and (int(x) & (int(x) - 1)) == 0
                 for x in (before * 4, size / before * 4))
    if compression == "none" or dyadic:
        assert torch.equal(got, mean), (compression, f, got, mean)
    else:
        eps = 2.0 ** -11 if compression == "fp16" else 2.0 ** -8
        bound = (size + 1) * eps * float(torch.cat(xs).abs().max())
        assert (got - mean).abs().max().item() <= bound, (compression, f, got, mean)


def test_gradient_predivide_factor_errors(rank, size):
    hvd.init()
    model = torch.nn.Linear(2, 1, bias=False)
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported with op"):
        make_opt(model, gradient_predivide_factor=2.0, op=hvd.Sum)
    # Compressors that form the average in float32 themselves refuse it.
    for c in ("topk", "powersgd", "onebit", "auto"):
        with pytest.raises(tutti.InvalidArgumentError, match=f"compressor '{c}'"):
            make_opt(model, gradient_predivide_factor=2.0,
                     compression=getattr(hvd.Compression, c))
    with pytest.raises(tutti.InvalidArgumentError, match="finite and > 0"):
        make_opt(model, gradient_predivide_factor=0.0)


def test_step_without_backward_on_one_rank_is_its_error(rank, size):
    # Issue 27: one rank steps without a backward pass while the others have
    # gradients.  It joins their reduction with zeros (nobody hangs) and the
    # error is its own; the others complete the step.
    hvd.init()
    model = torch.nn.Linear(3, 1, bias=False)
    torch.nn.init.ones_(model.weight)
    opt = make_opt(model)
    lazy = size - 1
    if size == 1 or rank != lazy:
        model(torch.ones(1, 3)).sum().backward()
    if size > 1 and rank == lazy:
        with pytest.raises(tutti.InvalidArgumentError,
                           match="without a backward pass on this rank") as e:
            opt.step()
        assert f"rank {rank}:" in str(e.value) and "'weight'" in str(e.value)
    else:
        opt.step()
    # Every rank's gradient is the average with the lazy rank's zeros.
    expect = 1.0 if size == 1 else (size - 1) / size
    assert torch.allclose(model.weight.grad, torch.full((1, 3), expect))
    # No rank runs a backward pass: no error, no hang, .grad stays None.
    opt.zero_grad(set_to_none=True)
    opt.step()
    assert model.weight.grad is None
    # A second synchronize() in one step is still a no-op.
    model(torch.ones(1, 3)).sum().backward()
    opt.synchronize()
    grad = model.weight.grad.clone()
    opt.step()
    assert torch.equal(model.weight.grad, grad)


def test_replicas_that_differ_fail_at_the_first_step(rank, size):
    # Issue 27: a forgotten broadcast_parameters() left the replicas apart
    # silently.  The first step checks a digest of every parameter across
    # the ranks and names the first one that differs, on every rank.
    hvd.init()
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    torch.nn.init.zeros_(model[0].weight)
    torch.nn.init.zeros_(model[0].bias)
    torch.nn.init.constant_(model[1].weight, 0.5)
    torch.nn.init.constant_(model[1].bias, float(rank == size - 1))  # the last rank's own
    opt = make_opt(model)
    model(torch.ones(1, 3)).sum().backward()
    if size == 1:
        opt.step()
        return
    with pytest.raises(tutti.MismatchError) as e:
        opt.step()
    msg = str(e.value)
    assert f"rank {rank}:" in msg and "Reducer 'DistributedOptimizer'" in msg
    assert f"parameter #3 '1.bias' float32[1] of rank {size - 1} differs from rank 0's" in msg
    assert "1 of 4 parameters differ" in msg and "broadcast_parameters" in msg
    opt._tutti.close()  # its hooks off the parameters
    # The same replicas after the broadcast: the check passes.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = make_opt(model)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    assert opt.reducer.options["check_parameters"]


def test_replica_check_can_be_turned_off(rank, size):
    hvd.init()
    p = torch.full((4,), float(rank))
    g = torch.ones(4)
    r = tutti.Reducer(tutti.world(), check_parameters=False, name="off")
    r.add_parameter("p", p, g)
    r.build()
    r.grad_ready(0)
    assert r.synchronize()  # replicas differ, unchecked
    assert not r.options["check_parameters"]
