"""Horovod's process sets over tutti process groups.

``hvd.ProcessSet([0, 2])`` names world ranks; registering it (every rank
calls ``hvd.add_process_set(ps)`` with the same ranks, or passes it to
``hvd.init(process_sets=[...])``) splits tutti's world into a
``tutti.ProcessGroup`` of those ranks.  Every ``process_set=`` argument of
tutti.torch takes it; ``root_rank`` is then a world rank, as in Horovod.
"""
from .. import _C
from ._util import error, require_init


class ProcessSet:
    """A subset of the world's ranks that collectives can run on."""

    def __init__(self, ranks_or_comm):
        if not isinstance(ranks_or_comm, (list, tuple, range)):
            raise error(_C.UnsupportedError,
                        "hvd.ProcessSet(): only a list of world ranks is supported "
                        f"(got a {type(ranks_or_comm).__name__}; mpi4py communicators are not)")
        self.ranks = sorted(set(int(r) for r in ranks_or_comm))
        self.process_set_id = None
        self._group = None

    def _registered(self, call):
        if self.process_set_id is None:
            raise error(_C.InvalidArgumentError,
                        f"{call}: process set {self.ranks} is not registered: pass it to "
                        "hvd.add_process_set() or hvd.init(process_sets=[...]) first")

    def _hvd_group(self, call):
        """The tutti.ProcessGroup of this set (_util.group_or_world)."""
        self._registered(call)
        if self.process_set_id == 0:
            require_init(call)
            return _C.world()
        if self._group is None:
            raise error(_C.InvalidArgumentError,
                        f"{call}: rank {_C.rank()} is not in process set "
                        f"{self.process_set_id} (ranks {self.ranks})")
        return self._group

    def _set_rank_of(self, world_rank, call):
        """A world rank's rank within the set (Horovod's root_rank)."""
        ranks = self._world_ranks()
        if world_rank not in ranks:
            raise error(_C.InvalidArgumentError,
                        f"{call}: root_rank {world_rank} is not in process set "
                        f"{self.process_set_id} (ranks {ranks})")
        return ranks.index(world_rank)

    def _world_ranks(self):
        return list(range(_C.size())) if self.process_set_id == 0 else self.ranks

    def size(self):
        """Number of ranks in the set; None while not registered."""
        return None if self.process_set_id is None else len(self._world_ranks())

    def rank(self):
        """This process's rank within the set, -1 outside it; None while not
        registered."""
        if self.process_set_id is None:
            return None
        ranks = self._world_ranks()
        return ranks.index(_C.rank()) if _C.rank() in ranks else -1

    def included(self):
        """Whether this process is in the set; None while not registered."""
        return None if self.process_set_id is None else _C.rank() in self._world_ranks()

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


#: The set of every rank (id 0); the default of every process_set= argument.
global_process_set = ProcessSet([])
_registry = {}


def _start():
    """hvd.init(): registers the global set."""
    global_process_set.process_set_id = 0
    _registry[0] = global_process_set


def _forget():
    """hvd.shutdown(): the groups die with tutti's world."""
    for ps in _registry.values():
        ps.process_set_id, ps._group = None, None
    _registry.clear()


def add_process_set(process_set):
    """Registers a ProcessSet (or a list of world ranks) and returns it.
    Collective: every rank of the world calls it with the same ranks."""
    call = "hvd.add_process_set()"
    require_init(call)
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    world = _C.world()
    bad = [r for r in ps.ranks if not 0 <= r < world.size]
    if bad or not ps.ranks:
        raise error(_C.InvalidArgumentError,
                    f"{call}: ranks {ps.ranks} must be a non-empty list of world ranks "
                    f"0..{world.size - 1}")
    if ps.process_set_id is not None:
        raise error(_C.InvalidArgumentError, f"{call}: {ps} is already registered")
    # Every rank must pass the same ranks: compare them all before the split.
    from .functions import allgather_object
    every = allgather_object(ps.ranks, name="add_process_set ranks")
    if any(r != ps.ranks for r in every):
        raise error(_C.MismatchError, f"{call}: ranks differ across processes: "
                    + ", ".join(f"rank {i}: {r}" for i, r in enumerate(every)))
    for other in _registry.values():
        if other.process_set_id != 0 and other.ranks == ps.ranks:
            raise error(_C.InvalidArgumentError,
                        f"{call}: {other} already has ranks {ps.ranks}")
    new_id = max(_registry) + 1
    mine = world.rank in ps.ranks
    ps._group = world.split(0 if mine else -1, ps.ranks.index(world.rank) if mine else 0,
                            f"process_set {new_id}")
    ps.process_set_id = new_id
    _registry[new_id] = ps
    return ps


def remove_process_set(process_set):
    """Unregisters a set; True when it was registered (the global set stays:
    False).  Every rank calls it."""
    ps_id = process_set.process_set_id
    if ps_id is None or ps_id == 0 or _registry.get(ps_id) is not process_set:
        return False
    del _registry[ps_id]
    process_set.process_set_id, process_set._group = None, None
    return True
