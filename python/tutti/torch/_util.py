"""Small helpers shared by the tutti.torch modules."""
import torch

from .. import _C


def group_or_world(process_set):
    """A tutti.ProcessGroup: the one given (Horovod's process_set), else the
    world."""
    return process_set if process_set is not None else _C.world()


def stream_of(tensor):
    """The cudaStream_t (as an int) tutti should order a CUDA tensor's work
    on: the current stream of its device.  0 for host tensors."""
    if tensor.is_cuda:
        return torch.cuda.current_stream(tensor.device).cuda_stream
    return 0


def export(tensor):
    """The tensor as tutti sees it: torch refuses DLPack export of tensors
    that require grad; .detach() shares the memory."""
    return tensor.detach() if tensor.requires_grad else tensor


def error(cls, message):
    """A tutti error raised from Python, with the rank prefix tutti's C++
    errors carry."""
    rank = _C.rank() if _C.initialized() else 0
    return cls(f"rank {rank}: {message}")


# The loss scale of the newest LossScaler.scale() or GradScaler.scale() call
# (a float, or GradScaler's device tensor): DistributedOptimizer
# and DistributedDataParallel hand it to their reducer at the start of each
# backward pass, so error-feedback compressors keep residuals in the units
# the gradients carry (tutti.Reducer.set_gradient_scale).
current_loss_scale = [None]
