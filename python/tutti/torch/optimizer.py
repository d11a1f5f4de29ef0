"""Horovod's DistributedOptimizer over tutti's gradient reducer."""
import contextlib

import torch

from .. import _C
from ._grad_sync import GradSync
from .compression import as_compressor
from .mpi_ops import Average, _resolve_op
from ._util import error


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed into the wrapped optimizer's class (so isinstance checks and the
    optimizer's own step() keep working)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 op, process_set, bucket_cap_mb, original, gradient_as_bucket_view,
                 gradient_predivide_factor):
        super(self.__class__, self).__init__(params)
        if original.state:
            self.load_state_dict(original.state_dict())
        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(item, tuple) for item in named):
                raise ValueError("named_parameters should be a sequence of (name, parameter) "
                                 "tuples, usually model.named_parameters()")
            names = [n for n, _ in named]
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                raise ValueError(f"Parameter names in named_parameters must be unique: {dups}")
            named_ids = {id(p) for _, p in named}
            unnamed = [id(p) for p in all_params if id(p) not in named_ids]
            if unnamed:
                raise ValueError("named_parameters was specified, but one or more model "
                                 f"parameters were not named. Python object ids: {unnamed}")
            in_optimizer = {id(p) for p in all_params}
            named = [(n, p) for n, p in named if id(p) in in_optimizer]
        else:
            named = [(f"allreduce.noname.{i}", p) for i, p in enumerate(all_params)]
        self._tutti = GradSync(named, process_set=process_set,
                               compressor=as_compressor(compression), op=op,
                               backward_passes_per_step=backward_passes_per_step,
                               bucket_cap_mb=bucket_cap_mb, name="DistributedOptimizer",
                               gradient_as_bucket_view=gradient_as_bucket_view,
                               gradient_predivide_factor=gradient_predivide_factor)
        self._should_synchronize = True

    @property
    def compressor(self):
        """The tutti compressor (None without compression); checkpoint its
        state_dict() to resume error feedback exactly."""
        return self._tutti.compressor

    @property
    def reducer(self):
        """The tutti.Reducer (bucket plan, stats)."""
        return self._tutti.reducer

    @property
    def process_set(self):
        return self._tutti.group

    def set_backward_passes_per_step(self, passes):
        if passes < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {passes}")
        self._tutti.backward_passes_per_step = passes

    def synchronize(self):
        """Waits for the gradient all-reduce started during backward; after it
        every parameter's .grad holds the average over the ranks."""
        self._tutti.synchronize()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside does not synchronize (call synchronize() first, e.g.
        to clip or unscale the averaged gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            self._tutti.synchronize()
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._tutti.pending:
            raise error(_C.InvalidArgumentError,
                        "optimizer.zero_grad() was called after loss.backward() but before "
                        "optimizer.step() or optimizer.synchronize(). This is prohibited "
                        "as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1, op=Average,
                         gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=None, bucket_cap_mb=None,
                         gradient_as_bucket_view=False, shard_optimizer_state=False):
    """Wraps a torch optimizer so that gradients are averaged (``op=Average``)
    or summed (``op=Sum``) over the ranks while backward runs: autograd hooks
    feed tutti's C++ bucketing reducer; ``step()`` waits for it, then steps.

    ``backward_passes_per_step=N``: gradients of N backward passes accumulate
    locally and are communicated during the N-th (scale the loss by 1/N for a
    mean).  ``compression``: ``Compression.none/fp16/bf16/topk/powersgd/
    onebit/auto`` (default None: the TUTTI_COMPRESSION setting, "none"
    unless set).  ``process_set``: a :class:`tutti.ProcessGroup` (e.g. the
    data-parallel group of a ProcessMesh).  ``bucket_cap_mb``: fusion bucket
    size (default TUTTI_BUCKET_MB).  ``num_groups``/``groups`` are Horovod's
    manual fusion hints; tutti's bucketing replaces them and ignores them.
    ``gradient_predivide_factor=f`` (Horovod's): each rank's gradients are
    divided by f before the sum and the sum by size / f after it (f = 1: sum,
    then divide; f = size: divide first; see docs/data_parallel.md for which
    is more accurate).  Needs ``op=Average`` (ValueError otherwise, as in
    Horovod) and no compression (the cast compressors divide by the size
    themselves; InvalidArgumentError).  ``op=Adasum`` raises
    UnsupportedError.  Sparse gradients are not supported (``sparse_as_dense``
    is accepted: gradients are always dense here).
    ``gradient_as_bucket_view=True``: every ``.grad`` is a view into the
    reducer's fusion bucket (as torch DDP's option): no copy into the bucket
    and none back; ``zero_grad(set_to_none=True)`` works (the next backward
    copies the new gradient into the view once and re-points ``.grad``).
    ``shard_optimizer_state=True``: ZeRO-1 (tutti.torch.zero): each rank
    keeps state for and steps only its partition of the parameters, which
    are then broadcast from their owners."""
    op = _resolve_op(None, op)
    if op not in (Average, _C.ReduceOp.SUM):
        raise ValueError(f"DistributedOptimizer: op must be Average or Sum, got {op}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("DistributedOptimizer: gradient_predivide_factor not supported "
                         f"with op != Average (got gradient_predivide_factor="
                         f"{gradient_predivide_factor})")
    del num_groups, groups, sparse_as_dense
    base = optimizer.__class__
    if shard_optimizer_state:
        from .zero import shard_distributed_optimizer_base
        base = shard_distributed_optimizer_base(optimizer, process_set)
    cls = type(optimizer.__class__.__name__, (base,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression,
               backward_passes_per_step, op, process_set, bucket_cap_mb, optimizer,
               gradient_as_bucket_view, gradient_predivide_factor)
