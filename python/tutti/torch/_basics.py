"""Horovod's process facts: init, rank, size, local/cross ranks, build facts."""
import numpy as np

from .. import _C

_cross = {}


def init(comm=None, process_sets=None):
    """Initialises tutti (MPI under mpirun, a world of one otherwise).
    Idempotent.  Horovod's ``comm`` (an mpi4py communicator or a rank list)
    and ``process_sets`` are not supported: split groups with
    ``tutti.world().split(color)`` and pass them as ``process_set=``."""
    if comm is not None or process_sets is not None:
        raise _C.UnsupportedError(
            "tutti.torch.init: comm= and process_sets= are not supported; "
            "create groups with tutti.world().split(color, key) instead")
    _C.init()
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


def is_initialized():
    """True between init() and shutdown()."""
    return _C.initialized()


def rank():
    """This process's rank in the world."""
    return _C.rank()


def size():
    """Number of processes in the world."""
    return _C.size()


def local_rank():
    """Rank among the processes on this node."""
    return _C.local_rank()


def local_size():
    """Number of processes on this node."""
    return _C.local_size()


def _node_facts():
    if not _cross:
        raise _C.InvalidArgumentError(
            "call tutti.torch.init() first (cross_rank/cross_size/is_homogeneous "
            "are computed there, collectively)")
    return _cross


def cross_rank():
    """Index of this process's node among the nodes (ranks with the same
    local rank form the cross-node group)."""
    return _node_facts()["rank"]


def cross_size():
    """Number of nodes (size of the cross-node group)."""
    return _node_facts()["size"]


def is_homogeneous():
    """True when every node runs the same number of processes."""
    return _node_facts()["homogeneous"]


def mpi_built():
    """True: tutti always runs over MPI."""
    return True


def mpi_enabled():
    """True: tutti always runs over MPI."""
    return True


def mpi_threads_supported():
    """tutti initialises MPI with MPI_THREAD_MULTIPLE when it owns MPI."""
    return True


def gloo_built():
    """False: tutti has no Gloo backend."""
    return False


def gloo_enabled():
    """False: tutti has no Gloo backend."""
    return False


def nccl_built():
    """True when this build has the NCCL backend (CUDA tensors)."""
    return _C.nccl_built()


def cuda_built():
    """True when tutti was compiled with CUDA."""
    return _C.cuda_built()


def rocm_built():
    """False: tutti has no ROCm build."""
    return False
