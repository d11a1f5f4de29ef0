"""A DistributedDataParallel-style module wrapper over tutti's reducer."""
import contextlib

import torch

from ._grad_sync import GradSync
from .compression import as_compressor
from .functions import broadcast_tensors_
from .mpi_ops import Average


class DistributedDataParallel(torch.nn.Module):
    """Wraps ``module`` like ``torch.nn.parallel.DistributedDataParallel``:
    construction broadcasts parameters and buffers from rank 0; gradients are
    all-reduced in buckets while backward runs, and ``loss.backward()``
    returns with every ``.grad`` holding the average over ``process_group``
    (any optimizer then steps as usual).  ``no_sync()`` accumulates locally.
    Unused parameters need no flag: they contribute zero.

    ``process_group``: a :class:`tutti.ProcessGroup` (default: the world).
    ``bucket_cap_mb``: fusion bucket size (default TUTTI_BUCKET_MB).
    ``broadcast_buffers``: rank 0's buffers (e.g. BatchNorm statistics) are
    copied to every rank before each forward.  ``compression``: a
    ``Compression.*`` choice.  torch-DDP-only arguments (device_ids,
    find_unused_parameters, gradient_as_bucket_view, ...) are accepted and
    ignored."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, process_group=None, bucket_cap_mb=None,
                 find_unused_parameters=False, compression=None, op=Average, **_ignored):
        super().__init__()
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        buffers = [b for b in module.buffers()]
        self._tutti = GradSync(module.named_parameters(), process_set=process_group,
                               compressor=as_compressor(compression), op=op,
                               bucket_cap_mb=bucket_cap_mb, name="DistributedDataParallel",
                               sync_in_backward=True)
        self.process_group = self._tutti.group
        self._tutti.broadcast_parameters(0)
        if buffers:
            broadcast_tensors_(buffers, 0, self.process_group, "ddp buffers")

    @property
    def reducer(self):
        return self._tutti.reducer

    @property
    def compressor(self):
        return self._tutti.compressor

    def forward(self, *inputs, **kwargs):
        """Re-broadcasts rank 0's buffers (training, broadcast_buffers), then
        runs the wrapped module."""
        if self.broadcast_buffers and torch.is_grad_enabled() and self.training:
            buffers = [b for b in self.module.buffers()]
            if buffers:
                broadcast_tensors_(buffers, 0, self.process_group, "ddp buffers")
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients without communicating;
        the first backward after the block reduces the accumulated sum."""
        self._tutti.no_sync_depth += 1
        try:
            yield
        finally:
            self._tutti.no_sync_depth -= 1
