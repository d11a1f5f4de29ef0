"""The module-level skip decision of the gpu-labelled Python suites:
``gpu_skip.require_gpus()`` at the top of a test_gpu*.py module, before it
imports torch (``require_gpus(needs_nccl=True)`` for a module that tests
NCCL itself).  The rule is tests/common/mpi_test_main.cc's: ranks take
device ``local_rank % device_count``; where they share one (fewer devices
than ranks on a node) the staged device transport serves their CUDA
tensors (TUTTI_DEVICE_TRANSPORT auto or staged), since NCCL refuses two
ranks on one GPU."""
import pytest

import tutti


def require_gpus(needs_nccl=False):
    """Skips the calling module (every rank alike) unless torch is there,
    every rank has a CUDA device, and the transport serving the world's CUDA
    tensors can run them (NCCL when `needs_nccl`)."""
    try:
        import torch  # noqa: F401
    except ImportError:  # e.g. a CPU-only venv without torch: nothing to run
        pytest.skip("no CUDA device: this Python has no torch", allow_module_level=True)
    reason = gpu_skip_reason(needs_nccl)
    if reason:
        pytest.skip(reason, allow_module_level=True)


def gpu_transport():
    """What serves the world's CUDA tensors in this run, "nccl" or "staged"
    (collective; call after require_gpus)."""
    return _decide()[1]


def gpu_skip_reason(needs_nccl=False):
    """None when the GPU tests can run, else the reason to skip.  Every rank
    takes the same decision from one all-reduce, so none is left waiting in
    a collective that a skipping peer never joins."""
    import torch

    worst, transport = _decide()
    if worst[0]:
        return "no CUDA device (on some rank; torch %s, CUDA %s)" % (
            torch.__version__, torch.version.cuda)
    shared = worst[1] > 0
    if shared and transport == "nccl":
        return ("fewer CUDA devices than ranks on a node (%d short) and "
                "TUTTI_DEVICE_TRANSPORT=nccl: NCCL needs one GPU per rank" % worst[1])
    if needs_nccl and transport != "nccl":
        if shared:
            return ("fewer CUDA devices than ranks on a node (%d short): ranks share "
                    "a GPU, which NCCL refuses, and this module needs NCCL" % worst[1])
        return ("this module needs NCCL, but the staged transport serves CUDA tensors "
                "(TUTTI_DEVICE_TRANSPORT=staged, or no NCCL built)")
    return None


def _decide():
    """(MAX over ranks of [no device, devices lacking on a node, setting
    nccl, setting staged or no NCCL], the transport) from one all-reduce."""
    import numpy as np
    import torch

    tutti.init()
    devices = (tutti.cuda_device_count()
               if torch.cuda.is_available() and tutti.cuda_built() else 0)
    local = tutti.local_size()
    setting = tutti.config_get("TUTTI_DEVICE_TRANSPORT")
    worst = np.array([1 if devices == 0 else 0, max(0, local - devices),
                      1 if setting == "nccl" else 0,
                      1 if setting == "staged" or not tutti._C.nccl_built() else 0],
                     dtype=np.int32)
    tutti.world().allreduce(worst, op="max")
    staged = bool(worst[3]) or (worst[1] > 0 and not worst[2])
    return worst, "staged" if staged else "nccl"
