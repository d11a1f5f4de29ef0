"""The elastic sampler's re-shard after a recovery from W to W' ranks, as
arithmetic (tutti.torch.elastic.sampler.deal and the committed position; no
communication): every sample of the epoch is trained exactly once in
committed steps, the tail padding is marked, the deal is the closed form.
docs/elastic.md, "The sampler after a recovery"."""
import json

import numpy as np
import pytest

pytest.importorskip("torch")
from tutti.torch import elastic  # noqa: E402
from tutti.torch.elastic.sampler import deal  # noqa: E402


@pytest.mark.parametrize("left", [0, 1, 5, 12, 13])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_deal_closed_form(left, world):
    """Rank r gets remaining[r + j W] for j < ceil(left / W), wrapping past
    the end onto the head (the padding); only a rank's last one can wrap."""
    remaining = np.arange(100, 100 + left)
    per_rank = -(-left // world)
    dealt = []
    for r in range(world):
        mine, padded = deal(remaining, r, world)
        want = [remaining[(r + j * world) % left] for j in range(per_rank)] if left else []
        assert mine.tolist() == want
        assert padded == (1 if per_rank and r + (per_rank - 1) * world >= left else 0)
        dealt += mine[:len(mine) - padded].tolist()
    # Without the padding: each remaining position exactly once.
    assert sorted(dealt) == remaining.tolist()
    assert sum(deal(remaining, r, world)[1] for r in range(world)) == (-left) % world


def committed_epoch(n, batch, w1, w2, commits, inflight):
    """W1 ranks train `commits` committed steps of `batch` each, then
    `inflight` steps past the last commit (lost with the failure); the
    survivors load the commit and W2 ranks deal the rest of the epoch.
    Returns every (position, padding) trained in a committed step."""
    a = elastic.ElasticSampler(list(range(n)), seed=4)
    a.num_replicas, a.rank = w1, 0
    shares = [deal(a._remaining(), r, w1)[0] for r in range(w1)]
    trained = []
    for step in range(commits + inflight):
        for r in range(w1):
            got = shares[r][step * batch:(step + 1) * batch].tolist()
            a._pending.extend(got)
            if step < commits:
                trained += [(p, False) for p in got]
        if step + 1 == commits:
            a._agree()
            committed = json.loads(json.dumps(a.state_dict()))
    if commits == 0:
        committed = a.state_dict()
    b = elastic.ElasticSampler(list(range(n)), seed=4)
    b.load_state_dict(committed)      # what the survivors reload
    for r in range(w2):
        mine, padded = deal(b._remaining(), r, w2)
        trained += [(p, i >= len(mine) - padded) for i, p in enumerate(mine.tolist())]
    return committed, trained


@pytest.mark.parametrize("w1,w2", [(4, 3), (4, 2), (4, 1), (3, 2), (6, 5), (6, 3), (2, 1),
                                   (2, 3)])
@pytest.mark.parametrize("commits,inflight", [(0, 1), (1, 1), (3, 1), (3, 0)])
def test_reshard_after_recovery_trains_every_sample_once(w1, w2, commits, inflight):
    n, batch = 62, 2
    if commits * batch * w1 > n:
        pytest.skip("the epoch ends before the failure")
    committed, trained = committed_epoch(n, batch, w1, w2, commits, inflight)
    prefix = commits * batch * w1
    assert (committed["prefix"], committed["extra"]) == (prefix, [])
    counts = np.bincount([p for p, pad in trained if not pad], minlength=n)
    assert counts.tolist() == [1] * n           # none repeated, none skipped
    assert sum(pad for _, pad in trained) == (-(n - prefix)) % w2
    # Rank r of W2 trains the positions prefix + r, prefix + r + W2, ...
    b = elastic.ElasticSampler(list(range(n)), seed=4)
    b.load_state_dict(committed)
    for r in range(w2):
        mine, padded = deal(b._remaining(), r, w2)
        assert mine[:len(mine) - padded].tolist() == list(range(prefix + r, n, w2))


def test_padding_marks_the_iteration_tail():
    s = elastic.ElasticSampler(list(range(7)), shuffle=False)
    s.num_replicas, s.rank = 3, 2
    s._iter_positions, s._iter_padded = deal(s._remaining(), 2, 3)
    assert s._iter_positions.tolist() == [2, 5, 1] and s._iter_padded == 1
    assert s.padding(0, 2) == [False, False] and s.padding(1, 2) == [True]


def test_tp_size_deals_by_replica(rank, size):
    """The ranks of a TP group (consecutive) get their replica's share."""
    import tutti
    import tutti.torch as hvd
    if size % 2:
        with pytest.raises(tutti.InvalidArgumentError, match="does not divide"):
            elastic.ElasticSampler(list(range(9)), tp_size=2)
        return
    s = elastic.ElasticSampler(list(range(9)), shuffle=False, tp_size=2)
    assert (s.num_replicas, s.rank) == (size // 2, rank // 2)
    every = hvd.allgather_object(list(s))
    assert every[rank] == every[rank ^ 1]
    assert every[rank] == [(rank // 2 + j * (size // 2)) % 9 for j in range(len(s))]
