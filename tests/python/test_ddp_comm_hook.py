"""DistributedDataParallel.register_comm_hook and tutti.torch.ddp_comm_hooks:
every rank gets distinct gradients with a closed-form reduction (integer
multiples, so float16/bfloat16 sums are exact), over three buckets."""
import pytest
import torch

import tutti
import tutti.torch as hvd
from tutti.torch import ddp_comm_hooks as hooks


class Net(torch.nn.Module):
    """loss = sum(p * g_p): each parameter's gradient is the given g_p.
    Registration order a, big, b, c; buckets (reverse order, first bucket
    capped at 1 MiB, bucket_cap_mb=1): [c, b], [big], [a]."""

    shapes = {"a": (16, 8), "big": (600, 500), "b": (5,), "c": (3,)}

    def __init__(self):
        super().__init__()
        for n, s in self.shapes.items():
            setattr(self, n, torch.nn.Parameter(torch.zeros(s)))

    def forward(self, grads):
        return sum((getattr(self, n) * g).sum() for n, g in grads.items())


def base(name):
    """Small integers (1..7), distinct per parameter."""
    n = 1
    for d in Net.shapes[name]:
        n *= d
    return (torch.arange(n, dtype=torch.float32) % 7 + 1 + len(name)).reshape(Net.shapes[name])


def make(rank, size, hook=None, state=None, **kw):
    torch.manual_seed(0)
    ddp = hvd.DistributedDataParallel(Net(), bucket_cap_mb=1, **kw)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    return ddp


def step(ddp, rank, size, mult=1):
    """Rank r's gradients: (r + 1) * size * base * mult."""
    for p in ddp.parameters():
        p.grad = None
    grads = {n: base(n) * ((rank + 1) * size * mult) for n in Net.shapes}
    ddp(grads).backward()


def expected(name, size, mult=1):
    """The average of (r + 1) * size * base over r: size (size + 1) / 2 * base."""
    return base(name) * (size * (size + 1) // 2 * mult)


@pytest.mark.parametrize("hook,view", [(hooks.allreduce_hook, False),
                                       (hooks.allreduce_hook, True),
                                       (hooks.fp16_compress_hook, False),
                                       (hooks.bf16_compress_hook, True)])
def test_builtin_hooks_give_the_average(rank, size, hook, view):
    ddp = make(rank, size, hook, gradient_as_bucket_view=view)
    assert len(ddp.reducer.buckets) == 3
    for mult in (1, 2):
        step(ddp, rank, size, mult)
        for n, p in ddp.module.named_parameters():
            assert torch.equal(p.grad, expected(n, size, mult)), (hook, n)
    # no_sync: one local pass, then a reducing pass averages the sum.
    for p in ddp.parameters():
        p.grad = None
    grads = {n: base(n) * ((rank + 1) * size) for n in Net.shapes}
    with ddp.no_sync():
        ddp(grads).backward()
    assert torch.equal(ddp.module.c.grad, grads["c"])  # local, not reduced
    ddp(grads).backward()
    for n, p in ddp.module.named_parameters():
        assert torch.equal(p.grad, expected(n, size, 2)), (hook, "no_sync", n)


def test_custom_hook_is_applied_per_bucket(rank, size):
    seen = []

    def doubled_average(state, bucket):
        seen.append((bucket.index(), bucket.is_last(),
                     [id(p) for p in bucket.parameters()],
                     [g.clone() for g in bucket.gradients()]))
        return hooks.allreduce_hook(state, bucket).then(lambda f: f.value() * 2)

    ddp = make(rank, size, doubled_average, state=None)
    params = dict(ddp.module.named_parameters())
    step(ddp, rank, size)
    assert [s[0] for s in seen] == [0, 1, 2] and [s[1] for s in seen] == [False, False, True]
    order = [["c", "b"], ["big"], ["a"]]
    for (_, _, ids, grads), names in zip(seen, order):
        assert ids == [id(params[n]) for n in names]
        for g, n in zip(grads, names):  # the hook saw this rank's own gradients
            assert torch.equal(g, base(n) * ((rank + 1) * size))
    for n, p in params.items():
        assert torch.equal(p.grad, 2 * expected(n, size))


def test_local_hook_without_communication(rank, size):
    def local_only(state, bucket):
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer() * state)
        return fut

    ddp = make(rank, size, local_only, state=3.0)
    step(ddp, rank, size)
    for n, p in ddp.module.named_parameters():
        assert torch.equal(p.grad, 3 * base(n) * ((rank + 1) * size))


def test_unused_parameter_averages_zero(rank, size):
    ddp = make(rank, size, hooks.allreduce_hook, find_unused_parameters=True)
    for p in ddp.parameters():
        p.grad = None
    grads = {n: base(n) * ((rank + 1) * size) for n in ("a", "b", "c")}  # big unused
    ddp(grads).backward()
    assert torch.equal(ddp.module.big.grad, torch.zeros(Net.shapes["big"]))
    for n in grads:
        assert torch.equal(getattr(ddp.module, n).grad, expected(n, size))


class SignNet(torch.nn.Module):
    def __init__(self, m=16, n=8):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(m, n))
        self.b = torch.nn.Parameter(torch.zeros(n))

    def forward(self, gw, gb):
        return (self.w * gw).sum() + (self.b * gb).sum()


def signs(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, shape, generator=g).float() * 2 - 1


def test_onebit_hook_closed_form(rank, size):
    # Every rank's gradient is (r + 1) * s with s in {-1, 1}: 1-bit sign with
    # a mean-magnitude scale sends exactly that, so the result is the exact
    # average (size + 1) / 2 * s and the residual stays zero.
    torch.manual_seed(0)
    ddp = hvd.DistributedDataParallel(SignNet())
    state = hooks.CompressorState(hvd.Compression.onebit)
    ddp.register_comm_hook(state, hooks.compressor_hook)
    sw, sb = signs((16, 8), 1), signs((8,), 2)
    for _ in range(2):
        ddp.zero_grad()
        ddp(sw * (rank + 1), sb * (rank + 1)).backward()
        assert torch.equal(ddp.module.w.grad, sw * ((size + 1) / 2))
        assert torch.equal(ddp.module.b.grad, sb * ((size + 1) / 2))
    sd = state.state_dict()
    residuals = [v for k, v in sd.items() if k.endswith("/residual")]
    assert residuals and all((v == 0).all() for v in residuals)
    assert state.compressors[0].name == "onebit"


def test_topk_hook_keeps_the_rest_as_residual(rank, size):
    # Three large entries per bucket (same places on every rank) and small
    # ones: top-k with k = ceil(0.02 * 136) = 3 sends the large ones (their
    # average arrives) and keeps the small ones as this rank's residual.
    torch.manual_seed(0)
    ddp = hvd.DistributedDataParallel(SignNet())
    state = hooks.CompressorState(hvd.Compression.topk(ratio=0.02))
    ddp.register_comm_hook(state, hooks.compressor_hook)
    gw = torch.full((16, 8), 0.5 * (rank + 1))
    gw[0, 0], gw[3, 5] = 100.0 * (rank + 1), -200.0 * (rank + 1)
    gb = torch.full((8,), 0.5 * (rank + 1))
    gb[2] = 300.0 * (rank + 1)
    ddp(gw, gb).backward()
    mean = (size + 1) / 2
    want_w = torch.zeros(16, 8)
    want_w[0, 0], want_w[3, 5] = 100.0 * mean, -200.0 * mean
    want_b = torch.zeros(8)
    want_b[2] = 300.0 * mean
    assert torch.equal(ddp.module.w.grad, want_w) and torch.equal(ddp.module.b.grad, want_b)
    (res,) = [v for k, v in state.state_dict().items() if k.endswith("/residual")]
    assert res.sum() == pytest.approx(0.5 * (rank + 1) * (136 - 3))


def test_powersgd_hook_recovers_rank_one_average(rank, size):
    # Rank r's weight gradient is (r + 1) u v^T: PowerSGD at rank 1 recovers
    # the average rank-1 matrix (to float rounding); the 1-D bias is sent
    # uncompressed (exact).
    torch.manual_seed(0)
    ddp = hvd.DistributedDataParallel(SignNet())
    state = hooks.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                start_powerSGD_iter=0)
    ddp.register_comm_hook(state, hooks.powerSGD_hook)
    u = torch.arange(1, 17, dtype=torch.float32) / 16
    v = torch.arange(8, 0, -1, dtype=torch.float32) / 8
    gb = torch.arange(8, dtype=torch.float32) * (rank + 1) * size
    ddp(torch.outer(u, v) * (rank + 1), gb).backward()
    mean = (size + 1) / 2
    torch.testing.assert_close(ddp.module.w.grad, torch.outer(u, v) * mean,
                               rtol=1e-5, atol=1e-6)
    assert torch.equal(ddp.module.b.grad, torch.arange(8, dtype=torch.float32)
                       * (size * (size + 1) // 2))
    assert any(k.endswith("/step") for k in state.state_dict())


def test_registration_errors(rank, size):
    ddp = make(rank, size)
    with pytest.raises(TypeError, match="callable"):
        ddp.register_comm_hook(None, "not a hook")
    ddp.register_comm_hook(None, hooks.allreduce_hook)
    with pytest.raises(tutti.InvalidArgumentError, match="only be called once"):
        ddp.register_comm_hook(None, hooks.allreduce_hook)
    late = make(rank, size)
    step(late, rank, size)
    with pytest.raises(tutti.InvalidArgumentError, match="before the first forward"):
        late.register_comm_hook(None, hooks.allreduce_hook)
    compressed = make(rank, size, compression=hvd.Compression.fp16)
    with pytest.raises(tutti.InvalidArgumentError, match="compression="):
        compressed.register_comm_hook(None, hooks.allreduce_hook)


@pytest.mark.parametrize("bad,match", [
    (lambda s, b: b.buffer(), "returned Tensor"),
    (lambda s, b: torch.futures.Future(), "not complete"),
    (lambda s, b: _done(b.buffer()[:1]), "its Future returned"),
])
def test_bad_hook_results_raise(rank, size, bad, match):
    ddp = make(rank, size, bad)
    with pytest.raises(tutti.InvalidArgumentError, match=match):
        step(ddp, rank, size)


def _done(value):
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut


def test_a_hook_error_leaves_the_ddp_usable(rank, size):
    calls = []

    def fails_once(state, bucket):
        calls.append(bucket.index())
        if len(calls) == 1:
            raise ValueError("hook failed on purpose")
        return hooks.allreduce_hook(state, bucket)

    ddp = make(rank, size, fails_once)
    with pytest.raises(ValueError, match="on purpose"):
        step(ddp, rank, size)
    step(ddp, rank, size)  # a fresh pass: every bucket handed over again
    assert calls == [0, 0, 1, 2]
    for n, p in ddp.module.named_parameters():
        assert torch.equal(p.grad, expected(n, size)), n
