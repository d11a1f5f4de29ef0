"""Horovod's process facts: init, rank, size, local/cross ranks, build facts."""
import numpy as np

from .. import _C
from . import process_sets as _sets
from ._util import require_init

_cross = {}


def init(comm=None, process_sets=None):
    """Initialises tutti (MPI under mpirun, a world of one otherwise).
    Idempotent.  ``process_sets``: ProcessSets (or rank lists) registered
    here, collectively, as hvd.add_process_set() does ("dynamic" is
    accepted: sets can always be added later).  Horovod's ``comm`` (an
    mpi4py communicator or a rank list) is not supported."""
    if comm is not None:
        raise _C.UnsupportedError(
            "hvd.init(): comm= is not supported; create process sets with "
            "hvd.add_process_set(ranks) (or tutti.world().split(color, key))")
    _C.init()
    if 0 not in _sets._registry:
        _sets._start()
    if process_sets is not None and process_sets != "dynamic":
        for ps in process_sets:
            if getattr(ps, "process_set_id", None) is None:
                _sets.add_process_set(ps)
    if not _cross:
        # Collective, once, while every rank is here: the node structure.
        world = _C.world()
        cross = world.cross_node_group()
        _cross["rank"], _cross["size"] = cross.rank, cross.size
        local = np.array([_C.local_size()], dtype=np.int64)
        every = np.empty(world.size, dtype=np.int64)
        world.allgather(local, every, name="hvd.init local sizes")
        _cross["homogeneous"] = bool((every == every[0]).all())


def shutdown():
    """Drains and releases everything (also registered at exit)."""
    _C.shutdown()
    _cross.clear()
    _sets._forget()


def is_initialized():
    """True between init() and shutdown()."""
    return _C.initialized()


def rank():
    """This process's rank in the world."""
    require_init("hvd.rank()")
    return _C.rank()


def size():
    """Number of processes in the world."""
    require_init("hvd.size()")
    return _C.size()


def local_rank():
    """Rank among the processes on this node."""
    require_init("hvd.local_rank()")
    return _C.local_rank()


def local_size():
    """Number of processes on this node."""
    require_init("hvd.local_size()")
    return _C.local_size()


def _node_facts(call):
    require_init(call)
    if not _cross:
        raise _C.InvalidArgumentError(
            f"{call}: call hvd.init() first (cross_rank/cross_size/is_homogeneous "
            "are computed there, collectively; tutti was initialised without it)")
    return _cross


def cross_rank():
    """Index of this process's node among the nodes (ranks with the same
    local rank form the cross-node group)."""
    return _node_facts("hvd.cross_rank()")["rank"]


def cross_size():
    """Number of nodes (size of the cross-node group)."""
    return _node_facts("hvd.cross_size()")["size"]


def is_homogeneous():
    """True when every node runs the same number of processes."""
    return _node_facts("hvd.is_homogeneous()")["homogeneous"]


def mpi_built():
    """True: MPI is a build requirement of tutti (host tensors and the
    control plane always travel over MPI)."""
    return True


def mpi_enabled():
    """True when this job's world runs over MPI (under mpirun, or
    TUTTI_WORLD=mpi); False for a local world of one.  Needs hvd.init()."""
    require_init("hvd.mpi_enabled()")
    return _C.mpi_thread_level() != ""


def mpi_threads_supported():
    """True when MPI granted MPI_THREAD_MULTIPLE (so mpi4py and other MPI
    code may run alongside tutti): the level MPI_Init_thread returned, or
    MPI_Query_thread when the application initialised MPI.  tutti refuses
    to start below it, so this is False only in a world without MPI.
    ``tutti.torch.mpi_thread_level()`` gives the level's name."""
    require_init("hvd.mpi_threads_supported()")
    return _C.mpi_thread_level() == "MPI_THREAD_MULTIPLE"


def mpi_thread_level():
    """The name of the thread level MPI granted ("MPI_THREAD_MULTIPLE"), or
    "" when the world runs without MPI.  Needs hvd.init()."""
    require_init("hvd.mpi_thread_level()")
    return _C.mpi_thread_level()


def gloo_built():
    """False: tutti has no Gloo backend."""
    return False


def gloo_enabled():
    """False: tutti has no Gloo backend."""
    return False


def nccl_built():
    """True when this build has the NCCL backend (CUDA tensors)."""
    return bool(_C.nccl_built())


def cuda_built():
    """True when tutti was compiled with CUDA."""
    return bool(_C.cuda_built())


def rocm_built():
    """False: tutti has no ROCm build."""
    return False


def ddp_built():
    """False: Horovod's own DDP backend; tutti has none (its NCCL and MPI
    backends are reported by nccl_built() and mpi_built())."""
    return False


def ccl_built():
    """False: tutti has no oneCCL backend."""
    return False
