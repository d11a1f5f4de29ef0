"""tutti.torch.ZeroRedundancyOptimizer and DistributedOptimizer(shard_
optimizer_state=True): parity with the unsharded torch optimizer, state
dicts (consolidate, load at any world size, broadcast), state bytes per
rank, errors.

Bit-identical by construction: the partition never splits a parameter, so
the rank that owns a parameter runs the very update (same kernel, same
gradient, same state) the unsharded optimizer runs, and the others receive
its bits by broadcast.  Every assertion below is torch.equal."""
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tutti  # noqa: E402
import tutti.torch as hvd  # noqa: E402

STEPS = 3
OPTIMIZERS = {
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01,
                                           nesterov=True)),
    "adam": (torch.optim.Adam, dict(lr=0.01)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
}
# The model's parameters: group 0 = fc1 (35 + 7), group 1 = fc2 (21 + 3);
# 66 elements, not divisible by 2 or 3.  PyTorch's sorted-greedy partition
# (largest first, to the least-loaded rank, sizes carried across groups):
#   W=2: fc1.weight -> 0 (35); fc1.bias -> 1 (7); fc2.weight -> 1 (28);
#        fc2.bias -> 1 (31)
#   W=3: fc1.weight -> 0 (35); fc1.bias -> 1 (7); fc2.weight -> 2 (21);
#        fc2.bias -> 1 (10)
OWNERS = {
    1: {"fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 0, "fc2.bias": 0},
    2: {"fc1.weight": 0, "fc1.bias": 1, "fc2.weight": 1, "fc2.bias": 1},
    3: {"fc1.weight": 0, "fc1.bias": 1, "fc2.weight": 2, "fc2.bias": 1},
}


@pytest.fixture(scope="module", autouse=True)
def horovod_init():
    hvd.init()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.fc1 = torch.nn.Linear(5, 7)
        self.fc2 = torch.nn.Linear(7, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def groups(net, lr2=None):
    """Two parameter groups; the second with its own lr when lr2 is given."""
    second = {"params": list(net.fc2.parameters())}
    if lr2 is not None:
        second["lr"] = lr2
    return [{"params": list(net.fc1.parameters())}, second]


def batch(step, rank=0):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, 5, generator=g), torch.randn(6, 3, generator=g)


def train(net, opt, steps, first=0, closure=False):
    """The same full batch on every rank: identical gradients, so the
    sharded and the unsharded optimizer see the same input."""
    losses = []
    for step in range(first, first + steps):
        x, y = batch(step)

        def loss_fn():
            opt.zero_grad()
            loss = F.mse_loss(net(x), y)
            loss.backward()
            return loss
        if closure:
            losses.append(opt.step(loss_fn))
        else:
            losses.append(loss_fn())
            opt.step()
    return losses


def side_by_side(pairs, step, rank):
    """One step of each (model, optimizer) on this rank's own batch (the
    reducer or DDP averages the gradients)."""
    x, y = batch(step, rank)
    for net, opt in pairs:
        opt.zero_grad()
        F.mse_loss(net(x), y).backward()
        opt.step()


def assert_same_params(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name


def assert_same_state_dict(got, want):
    assert got["param_groups"] == want["param_groups"]
    assert sorted(got["state"]) == sorted(want["state"])
    for i, entries in want["state"].items():
        assert sorted(got["state"][i]) == sorted(entries), i
        for key, value in entries.items():
            if torch.is_tensor(value):
                assert torch.equal(got["state"][i][key], value), (i, key)
            else:
                assert got["state"][i][key] == value, (i, key)


def state_bytes(optimizer):
    return sum(v.numel() * v.element_size() for s in optimizer.state.values()
               for v in s.values() if torch.is_tensor(v))


def agree(value):
    """Every rank's float, as a list (rank order)."""
    return hvd.allgather(torch.tensor([float(value)], dtype=torch.float64)).tolist()


@pytest.mark.parametrize("bucket_view", [False, True], ids=["per_param", "bucket_view"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_parity_with_unsharded(size, name, bucket_view):
    cls, kw = OPTIMIZERS[name]
    ref, net = Net(), Net()
    ref_opt = cls(groups(ref, lr2=0.05), **kw)
    opt = hvd.ZeroRedundancyOptimizer(groups(net, lr2=0.05), cls,
                                      parameters_as_bucket_view=bucket_view, **kw)
    assert isinstance(opt, torch.optim.Optimizer) and opt.world_size == size
    owners = {n: opt.owner(p) for n, p in net.named_parameters()}
    assert owners == OWNERS[size]
    mine = [p for ps in opt.partition() for p in ps]
    assert [p for g in opt.optim.param_groups for p in g["params"]] == mine
    assert [g["lr"] for g in opt.optim.param_groups] == [kw["lr"], 0.05], "groups kept"
    got = train(net, opt, STEPS, closure=name == "adam")
    want = train(ref, ref_opt, STEPS, closure=name == "adam")
    assert [float(v) for v in got] == [float(v) for v in want]
    assert_same_params(net, ref)
    # Every rank holds state for its own parameters only.
    assert {id(p) for p in opt.optim.state} == {id(p) for p in mine}
    assert not opt.state
    if bucket_view:
        for p in net.parameters():  # .data lives in its owner's bucket
            bucket = opt._buckets[0][1][opt.owner(p)]
            assert bucket.data_ptr() <= p.data_ptr() < bucket.data_ptr() + bucket.numel() * 4
    # A scheduler changing the wrapper's lr reaches the local optimizer.
    for group in opt.param_groups:
        group["lr"] *= 0.5
    for group in ref_opt.param_groups:
        group["lr"] *= 0.5
    train(net, opt, 1, first=STEPS)
    train(ref, ref_opt, 1, first=STEPS)
    assert_same_params(net, ref)


def test_consolidated_state_dict_equals_unsharded(rank, size):
    cls, kw = OPTIMIZERS["adam"]
    ref, net = Net(), Net()
    ref_opt = cls(groups(ref, lr2=0.05), **kw)
    opt = hvd.ZeroRedundancyOptimizer(groups(net, lr2=0.05), cls, **kw)
    train(net, opt, STEPS)
    train(ref, ref_opt, STEPS)
    with pytest.raises(RuntimeError, match="has not been consolidated"):
        opt.state_dict()
    to = size - 1
    opt.consolidate_state_dict(to=to)
    if rank == to:
        assert_same_state_dict(opt.state_dict(), ref_opt.state_dict())
    else:
        expect = rf"consolidated to rank {to}.*consolidate_state_dict\(to={rank}\)"
        with pytest.raises(tutti.InvalidArgumentError, match=expect):
            opt.state_dict()
    opt.consolidate_state_dict()  # to=0: the last rank drops its copy
    assert_same_state_dict(opt.state_dict(), ref_opt.state_dict()) if rank == 0 else None
    if rank != 0:
        with pytest.raises(RuntimeError, match="has not been consolidated"):
            opt.state_dict()


@pytest.mark.parametrize("name", ["sgd_momentum", "adamw"])
def test_load_state_saved_at_another_world_size(tmp_path, name):
    """A plain torch optimizer's state (what any world size's consolidated
    state_dict() equals, previous test) written to a file, loaded by the
    sharded optimizer, continues exactly as the plain one does."""
    cls, kw = OPTIMIZERS[name]
    ref = Net()
    ref_opt = cls(groups(ref), **kw)
    train(ref, ref_opt, 2)
    path = tmp_path / "reference.pt"
    torch.save({"model": ref.state_dict(), "optimizer": ref_opt.state_dict()}, path)
    saved = torch.load(path)
    net = Net()
    net.load_state_dict(saved["model"])
    opt = hvd.ZeroRedundancyOptimizer(groups(net), cls, **kw)
    opt.load_state_dict(saved["optimizer"])
    assert {id(p) for p in opt.optim.state} == {id(p) for ps in opt.partition() for p in ps}
    train(net, opt, 2, first=2)
    train(ref, ref_opt, 2, first=2)
    assert_same_params(net, ref)
    with pytest.raises(ValueError, match="parameter groups"):
        opt.load_state_dict({"state": {}, "param_groups": saved["optimizer"]["param_groups"][:1]})


def test_broadcast_optimizer_state_reshards(rank, size):
    """hvd.broadcast_optimizer_state on a sharded optimizer: the state rank
    0 loaded (Horovod's resume recipe) reaches every rank's partition."""
    cls, kw = OPTIMIZERS["adam"]
    ref = Net()
    ref_opt = cls(groups(ref), **kw)
    train(ref, ref_opt, 2)
    net = Net()
    net.load_state_dict(ref.state_dict())
    opt = hvd.ZeroRedundancyOptimizer(groups(net), cls, **kw)
    if rank == 0:
        opt.load_state_dict(ref_opt.state_dict())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    train(net, opt, 2, first=2)
    train(ref, ref_opt, 2, first=2)
    assert_same_params(net, ref)
    # After a step the root's whole state is the consolidated one: a
    # broadcast from the last rank changes nothing.
    hvd.broadcast_optimizer_state(opt, root_rank=size - 1)
    train(net, opt, 1, first=4)
    train(ref, ref_opt, 1, first=4)
    assert_same_params(net, ref)


def test_add_param_group_keeps_owners(rank, size):
    cls, kw = OPTIMIZERS["sgd_momentum"]
    ref, net = Net(), Net()
    ref_opt = cls(net_params(ref, "fc1"), **kw)
    opt = hvd.ZeroRedundancyOptimizer(net_params(net, "fc1"), cls, **kw)
    before = {n: opt.owner(p) for n, p in net.fc1.named_parameters()}
    train(net, opt, 1)
    train(ref, ref_opt, 1)
    ref_opt.add_param_group({"params": list(ref.fc2.parameters()), "lr": 0.05})
    opt.add_param_group({"params": list(net.fc2.parameters()), "lr": 0.05})
    assert {k: v for k, v in opt.param_groups[1].items() if k != "params"} == \
        {k: v for k, v in ref_opt.param_groups[1].items() if k != "params"}
    assert {n: opt.owner(p) for n, p in net.fc1.named_parameters()} == before
    assert {n: opt.owner(p) for n, p in net.named_parameters()} == OWNERS[size]
    train(net, opt, 2, first=1)
    train(ref, ref_opt, 2, first=1)
    assert_same_params(net, ref)
    opt.consolidate_state_dict(0)
    if rank == 0:
        assert_same_state_dict(opt.state_dict(), ref_opt.state_dict())


def net_params(net, module):
    return list(getattr(net, module).parameters())


def test_process_group_subset(rank, size):
    """Two optimizers side by side on split groups (even and odd ranks)."""
    group = tutti.world().split(rank % 2, rank, "zero parity")
    cls, kw = OPTIMIZERS["adamw"]
    ref, net = Net(), Net()
    ref_opt = cls(groups(ref), **kw)
    opt = hvd.ZeroRedundancyOptimizer(groups(net), cls, process_group=group,
                                      parameters_as_bucket_view=True, **kw)
    assert (opt.world_size, opt.rank) == (len(range(rank % 2, size, 2)), rank // 2)
    train(net, opt, 2)
    train(ref, ref_opt, 2)
    assert_same_params(net, ref)


def test_state_bytes_per_rank(rank, size):
    """Adam keeps exp_avg and exp_avg_sq (4 bytes per element each) and a
    step counter per parameter: a rank holds 8 * (its elements) + s * (its
    parameters) bytes, s the step tensor's bytes; over the ranks that sums
    to the unsharded optimizer's, and the largest rank holds at most the
    mean plus one parameter's (the greedy partition's bound)."""
    cls, kw = OPTIMIZERS["adam"]
    net = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(6)])
    ref = cls(net.parameters(), **kw)
    opt = hvd.ZeroRedundancyOptimizer(net.parameters(), cls, **kw)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
    net(x).sum().backward()
    ref.step()  # one step each: only the state's size matters here
    opt.step()
    step = ref.state[net[0].weight]["step"]  # a float32 scalar tensor on torch >= 1.12
    step_bytes = step.numel() * step.element_size() if torch.is_tensor(step) else 0
    total = state_bytes(ref)
    assert total == 8 * sum(p.numel() for p in net.parameters()) + 12 * step_bytes  # 12 params
    mine = [p for ps in opt.partition() for p in ps]
    assert state_bytes(opt.optim) == 8 * sum(p.numel() for p in mine) + len(mine) * step_bytes
    every = agree(state_bytes(opt.optim))
    assert sum(every) == total
    largest = max(8 * p.numel() + step_bytes for p in net.parameters())
    assert max(every) <= total / size + largest
    # Six 256-element weights, then six 16-element biases: at W = 1, 2, 3
    # the greedy rule deals each rank 6/W of both, exactly 1/W of the bytes.
    if 6 % size == 0:
        assert every == [total / size] * size


def test_distributed_optimizer_sharded_equals_unsharded(rank, size):
    """Horovod's wrapper with shard_optimizer_state=True: per-rank batches
    averaged by the reducer, then ZeRO's step; the same bits as the
    unsharded wrapper (both reduce the same gradients the same way)."""
    cls, kw = OPTIMIZERS["adam"]
    plain, sharded = Net(), Net()
    opt_p = hvd.DistributedOptimizer(cls(plain.parameters(), **kw),
                                     named_parameters=plain.named_parameters())
    opt_s = hvd.DistributedOptimizer(cls(sharded.parameters(), **kw),
                                     named_parameters=sharded.named_parameters(),
                                     shard_optimizer_state=True)
    assert isinstance(opt_s, hvd.ZeroRedundancyOptimizer)
    assert type(opt_s).__name__ == "Adam" and opt_s.process_set is not None
    for step in range(STEPS):
        side_by_side([(plain, opt_p), (sharded, opt_s)], step, rank)
        assert_same_params(sharded, plain)
    assert state_bytes(opt_s.optim) < state_bytes(opt_p) or size == 1
    assert sum(agree(state_bytes(opt_s.optim))) == state_bytes(opt_p)
    opt_s.consolidate_state_dict(0)
    if rank == 0:
        assert_same_state_dict(opt_s.state_dict(), opt_p.state_dict())
    # A wrapped optimizer that already has state hands it over (resharded).
    again = Net()
    again.load_state_dict(plain.state_dict())
    inner = cls(again.parameters(), **kw)
    inner.load_state_dict(opt_p.state_dict())
    opt_a = hvd.DistributedOptimizer(inner, named_parameters=again.named_parameters(),
                                     shard_optimizer_state=True)
    side_by_side([(plain, opt_p), (again, opt_a)], STEPS, rank)
    assert_same_params(again, plain)


def test_distributed_optimizer_sharded_with_loss_scaler(rank, size):
    """hvd.LossScaler drives the sharded wrapper as the unsharded one: the
    same unscaled steps, and the same agreed skip when one rank's batch
    overflows at step 1 (its inf reaches every rank through the average)."""
    cls, kw = OPTIMIZERS["sgd_momentum"]
    runs = []
    for shard in (False, True):
        net = Net()
        opt = hvd.DistributedOptimizer(cls(net.parameters(), **kw),
                                       named_parameters=net.named_parameters(),
                                       shard_optimizer_state=shard)
        scaler = hvd.LossScaler(init_scale=1024.0)
        for step in range(STEPS):
            x, y = batch(step, rank)
            if step == 1 and rank == size - 1:
                x = x * float("inf")
            opt.zero_grad()
            scaler.scale(F.mse_loss(net(x), y)).backward()
            scaler.step(opt)
            scaler.update()
        assert scaler.skipped_steps == 1 and scaler.get_scale() == 512.0
        runs.append(net)
    assert_same_params(runs[1], runs[0])


def test_with_ddp(rank, size):
    cls, kw = OPTIMIZERS["sgd_momentum"]
    plain, sharded = Net(), Net()
    ddp_p, ddp_s = hvd.DistributedDataParallel(plain), hvd.DistributedDataParallel(sharded)
    opt_p = cls(ddp_p.parameters(), **kw)
    opt_s = hvd.ZeroRedundancyOptimizer(ddp_s.parameters(), cls,
                                        parameters_as_bucket_view=True, **kw)
    for step in range(STEPS):
        side_by_side([(ddp_p, opt_p), (ddp_s, opt_s)], step, rank)
    assert_same_params(sharded, plain)


def test_errors(rank, size):
    net = Net()
    with pytest.raises(ValueError, match=f"rank {rank}: .*single parameter group"):
        hvd.ZeroRedundancyOptimizer(groups(net), torch.optim.SGD, overlap_with_ddp=True, lr=0.1)
    with pytest.raises(ValueError, match="empty parameter list"):
        hvd.ZeroRedundancyOptimizer([], torch.optim.SGD, lr=0.1)
    with pytest.raises(ValueError, match="one dtype"):
        hvd.ZeroRedundancyOptimizer([net.fc1.weight, torch.nn.Parameter(torch.zeros(2).double())],
                                    torch.optim.SGD, lr=0.1)
    opt = hvd.ZeroRedundancyOptimizer(net.parameters(), torch.optim.SGD, lr=0.1)
    for to in (size, -1, "0"):
        expect = rf"rank {rank}: .*to={to!r}.*0\.\.{size - 1}"
        with pytest.raises(tutti.InvalidArgumentError, match=expect):
            opt.consolidate_state_dict(to=to)
    with pytest.raises(RuntimeError, match=rf"consolidate_state_dict\(to={rank}\)"):
        opt.state_dict()


def test_checkpoint_resize(world, rank, size):
    """tutti.torch.checkpoint carries the sharded state (gathered into the
    unsharded format when saving): saved by size - 1 ranks (a ZeRO over
    their group), loaded by all (2 -> 3 at np 3), training continues as the
    plain optimizer does."""
    if size < 2:
        pytest.skip("needs two ranks")
    import shutil
    import tempfile
    path = hvd.broadcast_object(tempfile.mkdtemp(prefix="tutti-zero-") if rank == 0 else None)
    cls, kw = OPTIMIZERS["adamw"]
    ref = Net()
    ref_opt = cls(groups(ref, lr2=0.05), **kw)
    train(ref, ref_opt, 2)
    savers = world.split(0 if rank < size - 1 else -1, rank, "zero savers")
    if savers is not None:
        net = Net()
        opt = hvd.ZeroRedundancyOptimizer(groups(net, lr2=0.05), cls, process_group=savers, **kw)
        train(net, opt, 2)
        with tutti.CheckpointManager(savers, path, async_save=False) as mgr:
            hvd.checkpoint.save(mgr, 2, model=net, optimizer=opt, rng=False)
    world.barrier()
    net = Net()
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
    opt = hvd.ZeroRedundancyOptimizer(groups(net), cls, parameters_as_bucket_view=True, **kw)
    with tutti.CheckpointManager(world, path) as mgr:
        res = hvd.checkpoint.load(mgr, model=net, optimizer=opt, rng=False)
    assert res["step"] == 2 and res["saved_world_size"] == size - 1
    assert [g["lr"] for g in opt.param_groups] == [kw["lr"], 0.05]
    train(net, opt, 2, first=2)
    train(ref, ref_opt, 2, first=2)
    assert_same_params(net, ref)
    world.barrier()
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
