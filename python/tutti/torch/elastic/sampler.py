"""ElasticSampler: Horovod's elastic sampler on a global sample position.

Each epoch has one permutation of the dataset, the same at every world size
(``numpy.random.RandomState(seed + epoch)``, or the identity without
shuffle).  What an epoch has processed is a set of *positions* in that
permutation; every rank agrees on it at ``sync()`` and at each
``TorchState.commit()``.  An iteration deals the positions not yet processed
round-robin over the W ranks (rank r takes the r-th, (r+W)-th, ...), so
after every rank trained n samples of its share the processed set is again
a prefix of the permutation: the data position is one number (the prefix)
plus, after uneven record calls, a list of positions past it.  A size change
restarts the deal from that position at the new W: no sample is repeated or
skipped.  The one repetition is Horovod's (and DistributedSampler's) tail
padding: when W does not divide what is left of an epoch, the first
``W - left % W`` remaining samples are dealt twice so every rank has as many
samples (and batches) as the others; ``padding(batch_idx, batch_size)`` marks
them (give them weight 0 to train every sample exactly once).

The deal is :func:`deal` (no communication): after an in-process recovery
from W to W' ranks (docs/elastic.md, "The sampler after a recovery") the
committed position is loaded and rank r' of W' takes the r'-th, (r'+W')-th,
... of the positions left; what the ranks recorded after the last commit is
dropped with the rest of the uncommitted step.

A tensor-parallel job (``tp_size`` > 1, TP groups of consecutive ranks)
deals by data-parallel replica: the ``tp_size`` ranks of a TP group get the
same samples (replica ``rank // tp_size`` of ``size // tp_size``).
"""
import numpy as np
import torch

from ... import _C
from .._util import error
from ..functions import allgather_object

_FORMAT = 1


def deal(remaining, rank, world):
    """Rank ``rank`` of ``world``'s share of ``remaining`` (the epoch's
    positions not yet processed, ascending): round-robin, the r-th,
    (r+W)-th, ... of them, the list tail-padded with its own head (cyclically,
    when fewer are left than ranks) to a multiple of W so every rank gets
    ceil(len / W).  Returns (positions,
    padded): the last ``padded`` (0 or 1) of them repeat a sample dealt to
    another rank."""
    left = np.asarray(remaining, dtype=np.int64)
    per_rank = -(-len(left) // world)
    if len(left):
        left = np.resize(left, per_rank * world)   # cyclic: fewer left than ranks too
    mine = left[rank::world]
    padded = 1 if per_rank and rank + (per_rank - 1) * world >= len(remaining) else 0
    return mine, padded


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ``hvd.elastic.ElasticSampler(dataset, shuffle=True,
    seed=0)``: call ``set_epoch(e)`` at the start of each epoch and
    ``record_batch(batch_idx, batch_size)`` (or ``record_indices``) after
    each trained batch; keep the sampler in a ``TorchState`` so its position
    is committed and restored with the model."""

    def __init__(self, dataset, shuffle=True, seed=0, tp_size=1):
        # torch.utils.data.Sampler.__init__ takes nothing (or a deprecated
        # data_source) depending on the torch version: not called.
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        if int(tp_size) < 1:
            raise error(_C.InvalidArgumentError,
                        f"ElasticSampler: tp_size {tp_size} must be positive")
        self.tp_size = int(tp_size)
        self._iter_padded = 0
        self.epoch = 0
        self._n = len(dataset)
        self._agreed = np.zeros(self._n, dtype=bool)   # identical on every rank
        self._pending = []         # positions this rank recorded since the last agreement
        self._perm = None
        self._inverse = None
        self._iter_positions = np.zeros(0, dtype=np.int64)
        self.num_replicas = 1
        self.rank = 0
        self.reset()

    # ---- the epoch's permutation --------------------------------------------------
    def _permutation(self):
        if self._perm is None:
            if self.shuffle:
                self._perm = np.random.RandomState(
                    (self.seed + self.epoch) % (1 << 32)).permutation(self._n)
            else:
                self._perm = np.arange(self._n)
        return self._perm

    def _positions_of(self, indices):
        if self._inverse is None:
            self._inverse = np.empty(self._n, dtype=np.int64)
            self._inverse[self._permutation()] = np.arange(self._n)
        idx = np.asarray(list(indices), dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self._n):
            raise error(_C.InvalidArgumentError,
                        f"ElasticSampler.record_indices: index out of range "
                        f"[0, {self._n}) in {sorted(set(idx.tolist()))[:8]}")
        return self._inverse[idx]

    def _remaining(self):
        return np.flatnonzero(~self._agreed)

    def _deal(self):
        """This rank's positions of what is left: round-robin, tail padded."""
        return deal(self._remaining(), self.rank, self.num_replicas)[0]

    # ---- Horovod's interface ------------------------------------------------------
    def set_epoch(self, epoch):
        """Starts epoch ``epoch``: nothing of it is processed yet."""
        self.epoch = int(epoch)
        self._perm = self._inverse = None
        self._agreed[:] = False
        self._pending = []
        self.reset()

    def reset(self):
        """Re-reads the world size and rank (after a restart at a new size)."""
        size, rank = (_C.size(), _C.rank()) if _C.initialized() else (1, 0)
        if size % self.tp_size:
            raise error(_C.InvalidArgumentError,
                        f"ElasticSampler: tp_size {self.tp_size} does not divide the world "
                        f"size {size}")
        self.num_replicas = size // self.tp_size
        self.rank = rank // self.tp_size
        self.num_samples = len(self._deal())
        self.total_size = self.num_samples * self.num_replicas

    def get_indices(self, batch_idx, batch_size):
        """The dataset indices of batch ``batch_idx`` of the current
        iteration on this rank."""
        pos = self._iter_positions[batch_idx * batch_size:(batch_idx + 1) * batch_size]
        return self._permutation()[pos].tolist()

    def padding(self, batch_idx, batch_size):
        """For each sample of batch ``batch_idx`` of the current iteration on
        this rank: True when it is tail padding (a sample another rank was
        dealt too).  Weigh those 0 to train every sample exactly once."""
        n = len(self._iter_positions)
        start, stop = batch_idx * batch_size, min(n, (batch_idx + 1) * batch_size)
        return [i >= n - self._iter_padded for i in range(start, stop)]

    def record_batch(self, batch_idx, batch_size):
        """Batch ``batch_idx`` (of ``batch_size`` samples per rank) of the
        current iteration was trained on this rank."""
        start = batch_idx * batch_size
        if batch_idx < 0 or batch_size <= 0 or start >= len(self._iter_positions):
            raise error(_C.InvalidArgumentError,
                        f"ElasticSampler.record_batch({batch_idx}, {batch_size}): this rank's "
                        f"iteration has {len(self._iter_positions)} samples")
        self._pending.extend(self._iter_positions[start:start + batch_size].tolist())

    def record_indices(self, indices):
        """These dataset indices were trained on this rank."""
        self._pending.extend(self._positions_of(indices).tolist())

    def __iter__(self):
        self.reset()
        self._iter_positions, self._iter_padded = deal(self._remaining(), self.rank,
                                                       self.num_replicas)
        return iter(self._permutation()[self._iter_positions].tolist())

    def __len__(self):
        return self.num_samples

    # ---- agreement and state ------------------------------------------------------
    def sync(self, root_rank=0):
        """Collective: every rank's recorded positions become the agreed
        processed set of every rank (the union), then the deal restarts."""
        self._agree()
        self.reset()

    def _agree(self):
        """Collective: the union of what the ranks recorded joins the agreed set."""
        every = allgather_object(self._pending, name="elastic.sampler.records")
        for positions in every:
            if positions:
                self._agreed[np.asarray(positions, dtype=np.int64)] = True
        self._pending = []

    def processed(self):
        """Samples of this epoch agreed as processed (the global position
        when they form a prefix)."""
        return int(self._agreed.sum())

    def state_dict(self):
        """The agreed position as JSON data: {epoch, prefix, extra, ...}
        (``extra``: processed positions past the prefix).  A rank's records
        since the last agreement are not in it."""
        done = self._agreed
        prefix = int(np.argmin(done)) if not done.all() else self._n
        extra = (np.flatnonzero(done[prefix:]) + prefix).tolist()
        return {"format": _FORMAT, "epoch": self.epoch, "prefix": prefix, "extra": extra,
                "size": self._n, "seed": self.seed, "shuffle": self.shuffle}

    def _snapshot(self):
        return (self.epoch, self._agreed.copy(), list(self._pending))

    def _restore_snapshot(self, snap):
        epoch, agreed, pending = snap
        if epoch != self.epoch:
            self._perm = self._inverse = None
        self.epoch = epoch
        self._agreed[:] = agreed
        self._pending = list(pending)
        self.reset()

    def load_state_dict(self, state):
        """Restores a state_dict() (from any world size)."""
        for key, mine in (("size", self._n), ("seed", self.seed), ("shuffle", self.shuffle)):
            if key in state and state[key] != mine:
                raise error(_C.InvalidArgumentError,
                            f"ElasticSampler.load_state_dict: the saved sampler had {key}="
                            f"{state[key]!r}, this one has {mine!r} (the data position "
                            "refers to another dataset or order)")
        self.epoch = int(state["epoch"])
        self._perm = self._inverse = None
        self._agreed[:] = False
        self._agreed[:int(state["prefix"])] = True
        if state.get("extra"):
            self._agreed[np.asarray(state["extra"], dtype=np.int64)] = True
        self._pending = []
        self.reset()


__all__ = ["ElasticSampler", "deal"]
