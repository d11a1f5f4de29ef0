"""tutti.torch.elastic in one job (every rank runs these; np 1, 2, 3):
ElasticSampler's deal and position (no sample repeated or skipped across
any pair of sizes, closed form), sync(), in-memory restore(), durable
commits loaded by run(), reset callbacks, check_host_updates on a resize
request or a preemption notice.  elastic_jobs.py covers restarts and size
changes with real jobs."""
import json
import os
import tempfile
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import tutti  # noqa: E402
import tutti.torch as hvd  # noqa: E402

from tutti.torch.elastic import _runtime  # noqa: E402
from tutti.torch.elastic.state import _decode, _encode  # noqa: E402

elastic = hvd.elastic


@pytest.fixture
def shared_dir():
    """A fresh directory every rank sees (all ranks run on this host)."""
    path = hvd.broadcast_object(tempfile.mkdtemp(prefix="tutti-elastic-") if
                                hvd.rank() == 0 else None, 0)
    yield path
    hvd.barrier()


@pytest.fixture
def ckpt(shared_dir):
    """Commits go to a fresh checkpoint directory."""
    if _runtime._objects["manager"] is not None:
        _runtime._objects["manager"].close()
        _runtime._objects["manager"] = None
    elastic.configure(ckpt_dir=os.path.join(shared_dir, "ckpt"))
    return os.path.join(shared_dir, "ckpt")


def deal(sampler, world, rank):
    """The positions rank ``rank`` of ``world`` would be dealt now."""
    sampler.num_replicas, sampler.rank = world, rank
    return sampler._deal()


# ---- ElasticSampler -------------------------------------------------------------------

def test_sampler_deals_the_epoch_once_with_horovod_padding(rank, size):
    n = 23
    s = elastic.ElasticSampler(list(range(n)), seed=5)
    mine = list(s)
    assert len(mine) == len(s) == -(-n // size)
    every = hvd.allgather_object(mine)
    flat = [i for part in every for i in part]
    perm = np.random.RandomState(5).permutation(n).tolist()
    pad = (-n) % size
    # Every sample once, plus the first `pad` of the permutation once more.
    assert sorted(flat) == sorted(list(range(n)) + perm[:pad])
    # Each rank records its first two samples: 2*W positions, a prefix.
    s.record_batch(0, 2)
    assert s.get_indices(0, 2) == mine[:2]
    s.sync()
    assert s.processed() == 2 * size
    sd = s.state_dict()
    assert (sd["prefix"], sd["extra"], sd["epoch"]) == (2 * size, [], 0)
    rest = [i for part in hvd.allgather_object(list(s)) for i in part]
    left = perm[2 * size:]
    assert sorted(rest) == sorted(left + left[:(-len(left)) % size])
    # Uneven records (one sample far ahead) stay exact as `extra`.
    ahead = perm[-1]
    if rank == size - 1:
        s.record_indices([ahead])
    s.sync()
    sd = s.state_dict()
    assert (sd["prefix"], sd["extra"]) == (2 * size, [n - 1])
    assert ahead not in [i for part in hvd.allgather_object(list(s)) for i in part]
    s.set_epoch(1)
    assert s.processed() == 0 and s.state_dict()["prefix"] == 0 and len(s) == -(-n // size)


@pytest.mark.parametrize("n", [48, 50])
def test_sampler_position_survives_any_size_change(n):
    """Train k rounds at W1 (batch B per rank), move the agreed position to
    a sampler at W2 through state_dict(), deal the rest: every sample of the
    epoch is trained exactly once, plus only the tail padding of the W2
    deal (none when W2 divides what is left)."""
    B = 4
    for w1 in (1, 2, 3, 4):
        for w2 in (1, 2, 3, 4):
            for rounds in (0, 1, 3):
                a = elastic.ElasticSampler(list(range(n)), seed=9)
                trained = []
                shares = [deal(a, w1, r) for r in range(w1)]
                for r in range(w1):
                    got = shares[r][:rounds * B].tolist()
                    trained += got
                    a._pending.extend(got)
                a._agree()
                sd = json.loads(json.dumps(a.state_dict()))   # as committed
                assert sd["prefix"] == min(n, rounds * B * w1) and sd["extra"] == []
                b = elastic.ElasticSampler(list(range(n)), seed=9)
                b.load_state_dict(sd)
                rest = [p for r in range(w2) for p in deal(b, w2, r).tolist()]
                left = n - sd["prefix"]
                assert len(rest) == left + (-left) % w2
                counts = np.bincount(trained + rest, minlength=n)
                assert counts.min() == 1 and counts.sum() == n + (-left) % w2, (w1, w2, rounds)


def test_sampler_refuses_another_dataset():
    a = elastic.ElasticSampler(list(range(10)), seed=1)
    b = elastic.ElasticSampler(list(range(12)), seed=1)
    with pytest.raises(tutti.InvalidArgumentError, match="size=10"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(tutti.InvalidArgumentError, match="record_batch"):
        a.record_batch(5, 4)   # no iteration yet


# ---- state ----------------------------------------------------------------------------

def make_state(rank, **objects):
    torch.manual_seed(100 + rank)
    model = torch.nn.Linear(3, 2).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.full((1, 3), float(rank + 1), dtype=torch.float64)).sum().backward()
    opt.step()           # a rank-dependent momentum buffer
    sampler = elastic.ElasticSampler(list(range(20)), seed=2)
    list(sampler)
    sampler.record_batch(0, 1 + rank)   # ranks record different amounts
    return elastic.TorchState(model=model, optimizer=opt, sampler=sampler, **objects)


def snapshot(state):
    return {"params": [p.detach().clone().tolist() for p in state.model.parameters()],
            "momentum": [state.optimizer.state[p]["momentum_buffer"].tolist()
                         for p in state.model.parameters()],
            "epoch": state.epoch, "tags": sorted(state.tags),
            "sampler": state.sampler.state_dict()}


def test_sync_makes_every_rank_equal_to_rank_0(rank, size):
    state = make_state(rank, epoch=rank, tags={f"r{rank}"})
    before = hvd.broadcast_object(snapshot(state), 0)
    records = hvd.allgather_object(list(state.sampler._pending))
    state.sync()
    after = snapshot(state)
    assert hvd.allgather_object(after) == [after] * size
    assert {k: after[k] for k in ("params", "momentum", "epoch", "tags")} == \
        {k: before[k] for k in ("params", "momentum", "epoch", "tags")}
    # The samplers agree on the union of what every rank recorded.
    assert state.sampler.processed() == len(set(p for r in records for p in r))


def test_restore_returns_to_the_last_commit_in_memory(ckpt, rank):
    state = make_state(rank, epoch=0, tags=set())
    state.sync()
    state.epoch, state.tags = 2, {"a", "b"}
    state.commit()
    committed = snapshot(state)
    with torch.no_grad():
        for p in state.model.parameters():
            p.add_(1.0)
    state.optimizer.state[next(state.model.parameters())]["momentum_buffer"].zero_()
    state.epoch, state.tags = 5, set()
    state.sampler.record_indices([3, 4, 5])
    state.restore()
    assert snapshot(state) == committed
    assert state.sampler._pending == []


def test_run_loads_the_commit_into_fresh_objects(ckpt, rank, size, monkeypatch):
    state = make_state(rank, epoch=0, tags=set())
    calls = []
    state.register_reset_callbacks([lambda: calls.append("first")])
    monkeypatch.setenv("TUTTI_RESTART_COUNT", "0")
    assert elastic.run(lambda s, k: (s.commit_step, k))(state, k=7) == (0, 7)
    assert calls == []                            # a fresh start is no reset
    state.epoch, state.tags = 3, {"x", "y"}
    state.commit()
    state.commit()
    assert state.commit_step == 2 and tutti.CheckpointManager is not None
    committed = snapshot(state)
    for restart, expect in ((0, []), (1, ["reset"])):
        monkeypatch.setenv("TUTTI_RESTART_COUNT", str(restart))
        fresh = make_state(rank + 17, epoch=-1, tags=set())
        fresh.register_reset_callbacks([lambda: calls.append("reset")])
        calls.clear()
        seen = elastic.run(lambda s: (snapshot(s), s.commit_step))(fresh)
        assert seen == (committed, 2)
        assert calls == expect


def test_run_reraises_communication_failures(rank):
    state = elastic.ObjectState(epoch=0)

    def train(s):
        raise hvd.HorovodInternalError("a peer vanished")

    with pytest.raises(hvd.HorovodInternalError, match="a peer vanished"):
        elastic.run(train)(state)
    assert issubclass(hvd.HorovodInternalError, tutti.CommError)
    with pytest.raises(tutti.InvalidArgumentError, match="elastic State"):
        elastic.run(train)(object())


def test_object_values_round_trip():
    for value in (3, [1, (2, "a")], {"k": (1.5, None)}, {"s", 3}, torch.ones(2)):
        back = _decode(json.loads(json.dumps(_encode(value, "v"))))
        assert type(back) is type(value)
        assert (torch.equal(back, value) if torch.is_tensor(value) else back == value)


def test_one_optimizer_per_state():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(tutti.UnsupportedError, match="one optimizer"):
        elastic.TorchState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1),
                           other=torch.optim.SGD(model.parameters(), lr=1))


def test_commits_outside_run_follow_the_newest_checkpoint(ckpt, rank):
    elastic.ObjectState(epoch=0).commit()
    later = elastic.ObjectState(epoch=1)          # loaded nothing: not step 1 again
    later.commit()
    assert later.commit_step == 2 and tutti.list_checkpoints(ckpt)[-1]["step"] == 2
    with pytest.raises(tutti.InvalidArgumentError, match="exists already"):
        elastic.configure(ckpt_dir="/elsewhere")


# ---- host updates ---------------------------------------------------------------------

def test_check_host_updates_on_a_resize_request(ckpt, shared_dir, rank, size, monkeypatch):
    monkeypatch.setenv("TUTTI_ELASTIC_DIR", shared_dir)
    state = elastic.ObjectState(epoch=1)
    path = os.path.join(shared_dir, "resize-requested")
    state.check_host_updates()                    # no file: nothing
    if rank == 0:                                 # only rank 0 reads it
        with open(path, "w") as f:
            json.dump({"np": size + 1}, f)
    with pytest.raises(elastic.HostsUpdatedInterrupt, match=f"asked for a resize to {size + 1} ranks") as e:
        state.check_host_updates()
    assert not e.value.committed
    # commit() writes the checkpoint, then raises.
    with pytest.raises(elastic.HostsUpdatedInterrupt) as e:
        state.commit()
    assert e.value.committed and state.commit_step == 1
    assert tutti.list_checkpoints(ckpt)[-1]["step"] == 1
    if rank == 0:
        with open(path, "w") as f:
            json.dump({"np": size}, f)            # the size this job runs at
    state.check_host_updates()
    if rank == 0:
        with open(path, "w") as f:
            json.dump({"np": size + 1}, f)
        old = time.time() - 3600                  # written for an earlier job
        os.utime(path, (old, old))
    state.check_host_updates()


@pytest.mark.parametrize("kind, raises", [("REBALANCE", False), ("STOP", True)])
def test_check_host_updates_on_a_notice_at_one_rank(rank, size, monkeypatch, kind, raises):
    monkeypatch.delenv("TUTTI_ELASTIC_DIR", raising=False)
    monitor = tutti.PreemptionMonitor(sources="none")
    monkeypatch.setitem(_runtime._objects, "monitor", monitor)
    state = elastic.ObjectState(epoch=1)
    if rank == size - 1:
        monitor.notify(getattr(tutti.NoticeKind, kind), "test", "spot reclaim")
    if raises:
        with pytest.raises(elastic.HostsUpdatedInterrupt) as e:
            state.check_host_updates()
        assert ("test: spot reclaim" if rank == size - 1 else "another rank") in e.value.reason
    else:
        state.check_host_updates()
    monitor.close()
