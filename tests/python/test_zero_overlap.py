"""ZeroRedundancyOptimizer(overlap_with_ddp=True) with
ddp_comm_hooks.hook_with_zero_step / hook_with_zero_step_interleaved: the
step runs inside the DDP's backward, bucket by bucket.

The reference is the same model under a DDP with the plain allreduce_hook
(the same buckets, so the very same averaged gradients) and the unsharded
torch optimizer, which skips its step during the warm-up passes (torch's
overlap does not update the parameters there).  The owner of a bucket runs
the update the unsharded optimizer runs on those parameters (same kernel,
gradient and state) and the others receive its bits, so every comparison
is torch.equal.

The model: fc1 = Linear(6, 5) (30 + 5), fc2 = Linear(5, 8) (40 + 8), fc3 =
Linear(8, 33000) (264000 + 33000).  The first bucket is capped at 1 MiB
(TUTTI_FIRST_BUCKET_MB), so fc3.bias closes it; with a tiny bucket_cap_mb
every other parameter is a bucket of its own:
  buckets [fc3.bias] [fc3.weight] [fc2.bias] [fc2.weight] [fc1.bias] [fc1.weight]
and bucket i belongs to rank i mod W (torch's rule): uneven at W = 2 and 3.
With bucket_cap_mb=1.5 there are two buckets, [fc3.bias] and [fc3.weight,
fc2.bias, fc2.weight, fc1.bias, fc1.weight]; shard_buckets=True (threshold
297083 / W elements, smallest bucket first, a run to the least-loaded rank
not holding part of the bucket yet) gives
  W=1: all rank 0
  W=2: fc3.bias -> 0; fc3.weight -> 1 (it reaches the threshold alone);
       fc2.*, fc1.* -> 0 (rank 1 already holds part of this bucket)
  W=3: fc3.bias -> 0; fc3.weight -> 1; fc2.*, fc1.* -> 2."""
import collections
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tutti  # noqa: E402
import tutti.torch as hvd  # noqa: E402
from tutti.torch.ddp_comm_hooks import (allreduce_hook, hook_with_zero_step,  # noqa: E402
                                        hook_with_zero_step_interleaved)
from test_zero import assert_same_state_dict  # noqa: E402

OUT = 33000
STEPS = 5
TINY = 1e-6  # MB: one parameter per bucket after the first
OPTIMIZERS = {
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01,
                                           nesterov=True)),
    "adam": (torch.optim.Adam, dict(lr=0.01)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
}
HOOKS = {"step": hook_with_zero_step, "interleaved": hook_with_zero_step_interleaved}
BUCKETS = [["fc3.bias"], ["fc3.weight"], ["fc2.bias"], ["fc2.weight"], ["fc1.bias"],
           ["fc1.weight"]]
SHARDED_OWNERS = {
    1: {n: 0 for n in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight",
                       "fc3.bias")},
    2: {"fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 0, "fc2.bias": 0, "fc3.weight": 1,
        "fc3.bias": 0},
    3: {"fc1.weight": 2, "fc1.bias": 2, "fc2.weight": 2, "fc2.bias": 2, "fc3.weight": 1,
        "fc3.bias": 0},
}


def make_net():
    """fc1, fc2, fc3 as in the module docstring, the same values each call."""
    torch.manual_seed(3)
    return torch.nn.Sequential(collections.OrderedDict(
        fc1=torch.nn.Linear(6, 5), act1=torch.nn.Tanh(), fc2=torch.nn.Linear(5, 8),
        act2=torch.nn.Tanh(), fc3=torch.nn.Linear(8, OUT)))


pytestmark = pytest.mark.usefixtures("hvd_initialised")


@pytest.fixture(scope="module")
def hvd_initialised():
    hvd.init()


def batch(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 6, generator=g), torch.randn(4, OUT, generator=g)


def overlapped(cls, kw, make_hook=hook_with_zero_step, cap=TINY, shard=False, net=None,
               **ddp_kw):
    ddp = hvd.DistributedDataParallel(net or make_net(), bucket_cap_mb=cap, **ddp_kw)
    zero = hvd.ZeroRedundancyOptimizer(ddp.parameters(), cls, overlap_with_ddp=True, **kw)
    ddp.register_comm_hook(None, make_hook(allreduce_hook, ddp, zero, shard_buckets=shard))
    return ddp, zero


def reference(cls, kw, cap=TINY, net=None, **ddp_kw):
    ddp = hvd.DistributedDataParallel(net or make_net(), bucket_cap_mb=cap, **ddp_kw)
    ddp.register_comm_hook(None, allreduce_hook)
    return ddp, cls(ddp.parameters(), **kw)


def backward(ddp, zero_grad, step, rank):
    x, y = batch(step, rank)
    zero_grad()
    F.mse_loss(ddp(x), y).backward()


def run_side_by_side(ddp, zero, ref, ref_opt, steps, warmup, rank, first=0):
    """Backward on both (rank-distinct batches); the reference steps after
    the warm-up.  Parameters equal after every step; unchanged in warm-up."""
    start = [p.detach().clone() for p in ddp.parameters()]
    for step in range(first, first + steps):
        backward(ddp, zero.zero_grad, step, rank)
        backward(ref, ref_opt.zero_grad, step, rank)
        if step - first >= warmup:
            ref_opt.step()
        for (n, p), q, s in zip(ddp.module.named_parameters(), ref.parameters(), start):
            assert torch.equal(p, q), (step, n)
            assert torch.equal(p, s) == (step - first < warmup), (step, n, "warm-up")


@pytest.mark.parametrize("variant", sorted(HOOKS))
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_parity_with_ddp_and_torch_optimizer(rank, size, name, variant):
    cls, kw = OPTIMIZERS[name]
    ddp, zero = overlapped(cls, kw, HOOKS[variant])
    ref, ref_opt = reference(cls, kw)
    assert [[s["name"] for s in b["slots"]] for b in ddp.reducer.buckets] == BUCKETS
    assert zero.optim is None
    run_side_by_side(ddp, zero, ref, ref_opt, STEPS, 2, rank)
    owners = {n: zero.owner(p) for n, p in ddp.module.named_parameters()}
    assert owners == {n: k % size for k, b in enumerate(BUCKETS) for n in b}
    mine = [p for p in ddp.parameters() if zero.owner(p) == rank]
    assert sorted(map(id, zero.optim.state)) == sorted(map(id, mine)), "state only for mine"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert zero.step() is None
    assert any("does nothing" in str(w.message) for w in caught)


def test_shard_buckets_and_static_graph(rank, size):
    """shard_buckets=True splits the big bucket (closed-form owners above);
    static_graph=True makes the warm-up three passes, as torch's; with
    gradient_as_bucket_view=True (.grad is the bucket's slot)."""
    cls, kw = OPTIMIZERS["adam"]
    ddp, zero = overlapped(cls, kw, hook_with_zero_step, cap=1.5, shard=True,
                           static_graph=True, gradient_as_bucket_view=True)
    ref, ref_opt = reference(cls, kw, cap=1.5, static_graph=True)
    assert len(ddp.reducer.buckets) == 2
    run_side_by_side(ddp, zero, ref, ref_opt, STEPS, 3, rank)
    owners = {n: zero.owner(p) for n, p in ddp.module.named_parameters()}
    assert owners == SHARDED_OWNERS[size]


@pytest.mark.parametrize("load", ["before_warmup", "after_warmup"])
def test_state_dict_round_trip(rank, size, load):
    """The consolidated state equals the unsharded optimizer's; a new
    overlapped optimizer loads it (kept until the partition exists, or
    after it) and continues exactly as the reference does."""
    cls, kw = OPTIMIZERS["adamw"]
    ddp, zero = overlapped(cls, kw, hook_with_zero_step_interleaved)
    ref, ref_opt = reference(cls, kw)
    with pytest.raises(tutti.InvalidArgumentError, match=f"rank {rank}: .*warm-up"):
        zero.consolidate_state_dict(0)
    run_side_by_side(ddp, zero, ref, ref_opt, 4, 2, rank)
    zero.consolidate_state_dict(to=0)
    sd = zero.state_dict() if rank == 0 else None
    if rank == 0:
        assert_same_state_dict(sd, ref_opt.state_dict())
        assert sorted(sd["state"]) == list(range(6))
    sd = hvd.broadcast_object(sd, 0)

    net = make_net()
    with torch.no_grad():
        for p, q in zip(net.parameters(), ddp.parameters()):
            p.copy_(q)
    ddp2, zero2 = overlapped(cls, dict(kw, lr=0.5), hook_with_zero_step, net=net)
    if load == "before_warmup":
        zero2.load_state_dict(sd)
    for step in range(4, 6):  # warm-up: no update on either side
        backward(ddp2, zero2.zero_grad, step, rank)
        backward(ref, ref_opt.zero_grad, step, rank)
    if load == "after_warmup":
        zero2.load_state_dict(sd)
    assert zero2.param_groups[0]["lr"] == kw["lr"], "the loaded settings"
    run_side_by_side(ddp2, zero2, ref, ref_opt, 2, 0, rank, first=6)
    zero2.consolidate_state_dict(to=size - 1)
    if rank == size - 1:
        assert_same_state_dict(zero2.state_dict(), ref_opt.state_dict())


def test_misuse(rank, size):
    sgd = dict(lr=0.1)
    ddp = hvd.DistributedDataParallel(make_net(), bucket_cap_mb=TINY)
    zero = hvd.ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.SGD,
                                       overlap_with_ddp=True, **sgd)
    with pytest.raises(tutti.InvalidArgumentError, match=f"rank {rank}: .*no hook_with_zero_step"):
        zero.step()
    hook = hook_with_zero_step(allreduce_hook, ddp, zero)
    with pytest.raises(tutti.InvalidArgumentError, match="not registered"):
        zero.step()
    with pytest.raises(tutti.InvalidArgumentError, match="already has a hook"):
        hook_with_zero_step_interleaved(allreduce_hook, ddp, zero)
    with pytest.raises(tutti.InvalidArgumentError, match="single parameter group"):
        zero.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    for call in (zero.state_dict, lambda: zero.owner(ddp.module.fc1.weight)):
        with pytest.raises(tutti.InvalidArgumentError, match="warm-up"):
            call()
    ddp.register_comm_hook(None, hook)

    plain = hvd.ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.SGD, **sgd)
    with pytest.raises(ValueError, match=f"rank {rank}: .*overlap_with_ddp=True"):
        hook_with_zero_step(allreduce_hook, ddp, plain)
    with pytest.raises(ValueError, match="LBFGS is not supported"):
        hvd.ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.LBFGS, overlap_with_ddp=True)
    with pytest.warns(UserWarning, match="parameters_as_bucket_view=True is ignored"):
        ignored = hvd.ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.SGD,
                                              overlap_with_ddp=True,
                                              parameters_as_bucket_view=True, **sgd)
    assert not ignored.parameters_as_bucket_view


def test_parameter_outside_the_ddp(rank, size):
    """A trainable parameter the DDP does not hold would never be updated:
    the partition refuses it when the warm-up ends."""
    ddp = hvd.DistributedDataParallel(make_net(), bucket_cap_mb=TINY)
    extra = torch.nn.Parameter(torch.zeros(3))
    zero = hvd.ZeroRedundancyOptimizer(list(ddp.parameters()) + [extra], torch.optim.SGD,
                                       overlap_with_ddp=True, lr=0.1)
    ddp.register_comm_hook(None, hook_with_zero_step(allreduce_hook, ddp, zero))
    backward(ddp, zero.zero_grad, 0, rank)
    with pytest.raises(RuntimeError, match="InvalidArgumentError: rank .*parameter 6 .*in none "
                       "of the DDP's buckets"):
        backward(ddp, zero.zero_grad, 1, rank)


@pytest.mark.parametrize("variant", sorted(HOOKS))
def test_where_the_step_runs(rank, size, variant):
    """interleaved: a bucket's step runs before the next bucket reaches the
    hook (during backward); hook_with_zero_step: after the last bucket's
    hook.  Both: done when backward returns (the parameters differ from the
    start on every rank)."""
    events = []

    def recording_hook(state, bucket):
        events.append(("hook", bucket.index()))
        return allreduce_hook(state, bucket)
    ddp = hvd.DistributedDataParallel(make_net(), bucket_cap_mb=TINY)
    zero = hvd.ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.SGD,
                                       overlap_with_ddp=True, lr=0.1)
    ddp.register_comm_hook(None, HOOKS[variant](recording_hook, ddp, zero))
    for step in range(2):
        backward(ddp, zero.zero_grad, step, rank)
    bucket_of = {id(p): k for k, names in enumerate(BUCKETS)
                 for n, p in ddp.module.named_parameters() if n in names}
    local_step = zero.optim.step

    def recording_step(*args, **kwargs):
        events.append(("step", bucket_of[id(zero.optim.param_groups[0]["params"][0])]))
        return local_step(*args, **kwargs)
    zero.optim.step = recording_step
    events.clear()
    before = [p.detach().clone() for p in ddp.parameters()]
    backward(ddp, zero.zero_grad, 2, rank)
    assert all(not torch.equal(p, b) for p, b in zip(ddp.parameters(), before))
    mine = [k for k in range(len(BUCKETS)) if k % size == rank]
    hooks = [("hook", k) for k in range(len(BUCKETS))]
    if variant == "interleaved":
        want = []
        for k in range(len(BUCKETS)):
            want.append(("hook", k))
            if k in mine and k + 1 < len(BUCKETS):
                want.append(("step", k))
        if len(BUCKETS) - 1 in mine:
            want.append(("step", len(BUCKETS) - 1))
    else:
        want = hooks + [("step", k) for k in mine]
    assert events == want


def test_loss_scaled_gradients_are_refused(rank, size):
    """A tutti loss scaler hands its scale to the DDP: stepping inside
    backward would use scaled gradients (no unscale, no overflow check), so
    the hook refuses them after the warm-up, before any collective."""
    ddp = hvd.DistributedDataParallel(make_net(), bucket_cap_mb=TINY)
    zero = hvd.ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.SGD,
                                       overlap_with_ddp=True, lr=0.1)
    ddp.register_comm_hook(None, hook_with_zero_step(allreduce_hook, ddp, zero))
    scaler = hvd.amp.LossScaler(init_scale=4.0)
    for step in range(2):  # warm-up: no step, nothing to refuse
        x, y = batch(step, rank)
        scaler.scale(F.mse_loss(ddp(x), y)).backward()
    x, y = batch(2, rank)
    with pytest.raises(tutti.InvalidArgumentError, match=f"rank {rank}: .*AMP loss scale"):
        scaler.scale(F.mse_loss(ddp(x), y)).backward()


def test_rank_without_a_bucket(rank, size):
    """Default bucket sizes: two buckets ([fc3.bias], the rest), so at W = 3
    rank 2 owns nothing (an empty local optimizer); training and the
    consolidated state are still the unsharded optimizer's."""
    cls, kw = OPTIMIZERS["adam"]
    ddp, zero = overlapped(cls, kw, hook_with_zero_step_interleaved, cap=None)
    ref, ref_opt = reference(cls, kw, cap=None)
    assert len(ddp.reducer.buckets) == 2
    run_side_by_side(ddp, zero, ref, ref_opt, 3, 2, rank)
    owned = {0: 1, 1: 5}.get(rank, 0) if size > 1 else 6  # bucket k -> rank k mod W
    assert sum(len(g["params"]) for g in zero.optim.param_groups) == owned
    zero.consolidate_state_dict(to=0)
    if rank == 0:
        assert_same_state_dict(zero.state_dict(), ref_opt.state_dict())
