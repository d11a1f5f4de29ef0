"""A DistributedDataParallel-style module wrapper over tutti's reducer."""
import contextlib

import torch

from .. import _C
from ._comm_hook import HookRunner
from ._grad_sync import GradSync
from ._util import error, graph_leaves
from .compression import as_compressor
from .functions import broadcast_tensors_
from .mpi_ops import Average


class DistributedDataParallel(torch.nn.Module):
    """Wraps ``module`` like ``torch.nn.parallel.DistributedDataParallel``:
    construction broadcasts parameters and buffers from rank 0; gradients are
    all-reduced in buckets while backward runs, and ``loss.backward()``
    returns with every ``.grad`` holding the average over ``process_group``
    (any optimizer then steps as usual).  ``no_sync()`` accumulates locally.
    Unused parameters need no flag to be correct: they contribute zero.
    After the first step the buckets follow the order gradients became
    ready (rank 0's), as torch DDP rebuilds them.

    ``find_unused_parameters=True``: each forward searches the autograd
    graph of the output; parameters it cannot reach are filled (zero) as
    backward starts, so their buckets launch during backward instead of at
    its end.  ``static_graph=True``: the parameters unused in the first step
    are taken to be unused in every step, without a search (a step that
    uses one raises InvalidArgumentError).  ``gradient_as_bucket_view=True``:
    every ``.grad`` is a view into the fusion bucket (no copy in, no copy
    back; after ``zero_grad(set_to_none=True)`` the next backward copies the
    new gradient into the view once and re-points ``.grad``).

    ``process_group``: a :class:`tutti.ProcessGroup` (default: the world).
    ``bucket_cap_mb``: fusion bucket size (default TUTTI_BUCKET_MB).
    ``broadcast_buffers``: rank 0's buffers (e.g. BatchNorm statistics) are
    copied to every rank before each forward.  ``compression``: a
    ``Compression.*`` choice.  Other torch-DDP arguments (device_ids,
    output_device, ...) are accepted and ignored.

    ``register_comm_hook(state, hook)``: torch DDP's communication hook
    (``hook(state, bucket) -> torch.futures.Future``, per bucket; see
    ``tutti.torch.ddp_comm_hooks`` for tutti's hooks)."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, process_group=None, bucket_cap_mb=None,
                 find_unused_parameters=False, compression=None, op=Average,
                 gradient_as_bucket_view=False, static_graph=False, **_ignored):
        super().__init__()
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        buffers = [b for b in module.buffers()]
        self._tutti = GradSync(module.named_parameters(), process_set=process_group,
                               compressor=as_compressor(compression), op=op,
                               bucket_cap_mb=bucket_cap_mb, name="DistributedDataParallel",
                               sync_in_backward=True,
                               find_unused_parameters=find_unused_parameters and not static_graph,
                               static_graph=static_graph,
                               gradient_as_bucket_view=gradient_as_bucket_view)
        self.find_unused_parameters = find_unused_parameters and not static_graph
        self.static_graph = static_graph
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.process_group = self._tutti.group
        self._explicit_compression = compression is not None
        self._comm_hook = None   # a HookRunner after register_comm_hook()
        self._forwarded = False
        self._tutti.broadcast_parameters(0)
        if buffers:
            broadcast_tensors_(buffers, 0, self.process_group, "ddp buffers")

    @property
    def reducer(self):
        return self._tutti.reducer

    @property
    def compressor(self):
        return self._tutti.compressor

    def register_comm_hook(self, state, hook):
        """Replaces each bucket's all-reduce by ``hook(state, bucket)``, as
        torch DDP's ``register_comm_hook``: ``bucket`` is a GradBucket
        (``buffer()``, ``index()``, ``parameters()``, ``gradients()``,
        ``is_last()``, ``set_buffer()``) holding this rank's gradients; the
        hook returns a ``torch.futures.Future`` whose value is the bucket's
        reduced tensor (complete by the end of backward; tutti's hooks in
        ``tutti.torch.ddp_comm_hooks`` complete theirs), which becomes every
        parameter's ``.grad``.  Hooks run per bucket in bucket order while
        backward runs; none inside ``no_sync()``.  ``state`` is passed as is
        (tutti's hooks take a process group/set or their state object; None
        means this DDP's group).  Call once, before the first forward
        (InvalidArgumentError otherwise), and without ``compression=`` (the
        hook replaces it)."""
        if not callable(hook):
            raise TypeError(f"register_comm_hook: the hook must be callable, got {hook!r}")
        if self._comm_hook is not None:
            raise error(_C.InvalidArgumentError,
                        "DistributedDataParallel.register_comm_hook() can only be called once")
        if self._forwarded:
            raise error(_C.InvalidArgumentError,
                        "DistributedDataParallel.register_comm_hook() must be called before "
                        "the first forward")
        if self._explicit_compression:
            raise error(_C.InvalidArgumentError,
                        "DistributedDataParallel.register_comm_hook(): this DDP was built "
                        "with compression=; a comm hook replaces it (drop one of the two)")
        self._comm_hook = HookRunner(self._tutti, state, hook, self.gradient_as_bucket_view,
                                     self.static_graph)

    def forward(self, *inputs, **kwargs):
        """Re-broadcasts rank 0's buffers (training, broadcast_buffers), then
        runs the wrapped module."""
        self._forwarded = True
        if self.broadcast_buffers and torch.is_grad_enabled() and self.training:
            buffers = [b for b in self.module.buffers()]
            if buffers:
                broadcast_tensors_(buffers, 0, self.process_group, "ddp buffers")
        output = self.module(*inputs, **kwargs)
        if self.find_unused_parameters and torch.is_grad_enabled():
            (self._comm_hook or self._tutti).set_unused(self._unreachable(output))
        return output

    def _unreachable(self, output):
        """Indices of the registered parameters the autograd graph of
        ``output`` does not reach (torch DDP's search)."""
        reached = graph_leaves(output)
        return [i for i, p in enumerate(self._tutti.params) if id(p) not in reached]

    @contextlib.contextmanager
    def join(self, divide_by_initial_world_size=True, enable=True):
        """torch DDP's uneven-inputs context: ``with model.join(): for batch
        in my_data: ...`` lets ranks run different numbers of batches; on
        leaving the block a rank calls ``hvd.join()`` on the DDP's group and
        serves the others' gradient all-reduces with zeros until every rank
        has left it; then every rank takes the parameters and buffers of the
        last rank to join (a joined rank skipped the optimizer steps of the
        batches it lacked), as torch's join hook does.  Gradients average over the whole group (joined ranks
        count as zeros): torch's ``divide_by_initial_world_size=True``, the
        only mode (False raises ValueError).  After an exception inside the
        block the rank does not join (the others then fail at TUTTI_TIMEOUT,
        as with any missing collective)."""
        if not divide_by_initial_world_size:
            raise ValueError("DistributedDataParallel.join(divide_by_initial_world_size="
                             "False) is not supported: joined ranks count as zeros in "
                             "the average over the whole group")
        yield
        if enable:
            # A joined rank skipped the optimizer steps of the batches it
            # did not have: as torch's join hook, every rank takes the model
            # of the last rank to join.
            last = self.process_group.join()
            self._tutti.broadcast_parameters(last)
            buffers = [b for b in self.module.buffers()]
            if buffers:
                broadcast_tensors_(buffers, last, self.process_group, "ddp buffers")

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients without communicating;
        the first backward after the block reduces the accumulated sum."""
        self._tutti.no_sync_depth += 1
        try:
            yield
        finally:
            self._tutti.no_sync_depth -= 1

