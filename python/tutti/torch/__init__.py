"""tutti for PyTorch, with Horovod's API: change ``import horovod.torch as
hvd`` to ``import tutti.torch as hvd`` and a Horovod training script runs on
tutti.

    import tutti.torch as hvd
    hvd.init()
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # buckets all-reduce during backward
        opt.step()                        # waits for them, then steps

Beyond Horovod: ``DistributedDataParallel`` (a DDP-style wrapper with
``no_sync()``), ``LossScaler``/``GradScaler`` (overflow agreed across ranks),
``tutti.torch.tensor_parallel`` (autograd Functions and modules over
tutti's tensor-parallel layers), tutti's compressors
(``Compression.bf16/topk/powersgd/onebit/auto``), and checkpoint helpers in
``tutti.torch.checkpoint``; Horovod elastic (``hvd.elastic.run``,
``TorchState``, ``ElasticSampler``) on tutti checkpoints and tutti-run
restarts in ``tutti.torch.elastic``.

This module imports torch; ``tutti`` itself never does (the extension has no
compile-time dependency on any framework: tensors cross through DLPack).
"""
from .. import _C
from .._C import (  # noqa: F401  (tutti's errors and groups, re-exported)
    AbortedError,
    CheckpointError,
    CommError,
    Error,
    InvalidArgumentError,
    MismatchError,
    ProcessGroup,
    ProcessMesh,
    TimeoutError,
    UnsupportedError,
    start_timeline,
    stop_timeline,
    timeline_begin,
    timeline_end,
    timeline_mark,
)
from ._basics import (  # noqa: F401
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddp_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_thread_level,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
)
from .amp import GradScaler, LossScaler, agree_found_inf  # noqa: F401
from .compression import Compression, Compressor  # noqa: F401
from .ddp import DistributedDataParallel  # noqa: F401
from .functions import (  # noqa: F401
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from .mpi_ops import (  # noqa: F401
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    synchronize,
)
from .optimizer import DistributedOptimizer  # noqa: F401
from .zero import ZeroRedundancyOptimizer  # noqa: F401
from .sync_batch_norm import SyncBatchNorm, convert_sync_batchnorm  # noqa: F401
from .process_sets import (  # noqa: F401
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from . import checkpoint, ddp_comm_hooks, elastic, tensor_parallel  # noqa: F401,E402
from .elastic import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401,E402


def world():
    """The world tutti.ProcessGroup (pass split groups as process_set=)."""
    return _C.world()
