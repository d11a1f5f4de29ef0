"""The module-level skip decision of the gpu-labelled Python suites:
``gpu_skip.require_gpus()`` at the top of a test_gpu*.py module, before it
imports torch."""
import pytest

import tutti


def require_gpus():
    """Skips the calling module (every rank alike) unless torch is there and
    every rank has a CUDA device of its own."""
    try:
        import torch  # noqa: F401
    except ImportError:  # e.g. a CPU-only venv without torch: nothing to run
        pytest.skip("no CUDA device: this Python has no torch", allow_module_level=True)
    reason = gpu_skip_reason()
    if reason:
        pytest.skip(reason, allow_module_level=True)


def gpu_skip_reason():
    """None when every rank has a CUDA device of its own on its node (NCCL
    refuses two ranks on one GPU), else the reason to skip.  Every rank takes
    the same decision from one all-reduce, so none is left waiting in a
    collective that a skipping peer never joins."""
    import numpy as np
    import torch

    tutti.init()
    devices = (tutti.cuda_device_count()
               if torch.cuda.is_available() and tutti.cuda_built() else 0)
    local = tutti.local_size()
    code = 2 if devices == 0 else (1 if devices < local else 0)
    worst = np.array([code, max(0, local - devices)], dtype=np.int32)
    tutti.world().allreduce(worst, op="max")
    if worst[0] == 2:
        return "no CUDA device (on some rank; torch %s, CUDA %s)" % (
            torch.__version__, torch.version.cuda)
    if worst[0] == 1:
        return ("fewer CUDA devices than ranks on a node (%d short): the GPU "
                "tests need one GPU per rank" % worst[1])
    return None
