"""tutti: distributed training runtime (data/tensor parallel, compression,
AMP, spot-safe checkpoints) for numpy, PyTorch, CuPy and JAX tensors.

    import tutti
    tutti.init()                       # under mpirun, or alone (world of one)
    g = tutti.world()
    g.allreduce(x, op="avg")           # in place, zero-copy through DLPack
    y = tutti.allreduce(x, op="sum")   # out of place, same framework as x

Every collective is also available on any ProcessGroup (``g.split(...)``).
Errors are ``tutti.Error`` subclasses carrying the rank, the operation and
what was expected.

Areas: ``tutti.Reducer`` (data-parallel gradient bucketing) and
``tutti.ShardedOptimizer`` (ZeRO-1/2 over it),
``tutti.amp`` (loss scaling, fused unscale/check, clipping, casts),
``tutti.ProcessMesh`` and ``tutti.tensor_parallel`` (Megatron-style layers),
``tutti.compression`` (gradient compressors), and ``tutti.torch``
(a Horovod-compatible PyTorch integration).
"""
import atexit as _atexit

from . import _C
from ._C import (  # noqa: F401  (re-exported API)
    AbortedError,
    CheckpointError,
    CommError,
    Compressor,
    Error,
    InvalidArgumentError,
    MismatchError,
    NoSync,
    ProcessGroup,
    ProcessMesh,
    RanksLostError,
    Reducer,
    ReduceOp,
    ShardedOptimizer,
    Stateful,
    TensorView,
    TimeoutError,
    UnsupportedError,
    Work,
    config_get,
    config_reload,
    config_settings,
    cuda_built,
    cuda_device_count,
    dtype_names,
    init,
    initialized,
    local_rank,
    local_size,
    log,
    make_compressor,
    rank,
    recover,
    recovery_available,
    set_log_level,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
    timeline_active,
    timeline_begin,
    timeline_end,
    timeline_file,
    timeline_mark,
    world,
)
from . import amp, checkpoint, compression, optim, tensor_parallel  # noqa: F401,E402
from .checkpoint import (  # noqa: F401,E402
    PREEMPTED_EXIT_CODE,
    CheckpointManager,
    NoticeKind,
    PreemptionMonitor,
    exit_preempted,
    list_checkpoints,
    verify_checkpoint,
)
from ._functional import (  # noqa: F401
    allgather,
    allreduce,
    allreduce_,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    reduce_scatter,
)

__version__ = _C.__version__

SUM, AVG, MIN, MAX, PROD = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MIN,
                            ReduceOp.MAX, ReduceOp.PROD)

# Python's atexit runs before the interpreter tears down objects that may
# hold process groups; tutti's own C++ atexit hook is the fallback.  atexit
# runs last-registered first: checkpoint saves finish before the shutdown.
_atexit.register(_C.shutdown)
_atexit.register(checkpoint.close_all)
