"""Horovod's DistributedOptimizer over tutti's gradient reducer."""
import contextlib

import torch

from .. import _C
from ._grad_sync import GradSync
from .compression import Compression, Compressor, as_compressor
from .mpi_ops import Adasum, Average, _resolve_op, grouped_allreduce_
from ._util import error, group_or_world


def _partition(named, groups):
    """Horovod's ``groups=``: None/0 (no explicit groups), an int N (the
    parameters, in order, split into N contiguous groups of near-equal
    length), or a list of lists of parameters (parameters in no list form
    one more group, bucketed as usual).  Returns a list of lists of
    (name, parameter), or None without groups."""
    if groups is None or (isinstance(groups, int) and not isinstance(groups, bool)
                          and groups == 0):
        return None
    if isinstance(groups, int) and not isinstance(groups, bool):
        if groups < 0:
            raise ValueError(f"DistributedOptimizer: groups must be >= 0, got {groups}")
        n = min(groups, len(named)) or 1
        d, r = divmod(len(named), n)
        bounds = [i * d + min(i, r) for i in range(n + 1)]
        return [named[bounds[i]:bounds[i + 1]] for i in range(n) if bounds[i] < bounds[i + 1]]
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, (list, tuple))
                                                         for g in groups):
        raise ValueError("DistributedOptimizer: groups must be an int or a list of lists of "
                         f"parameters, got {type(groups).__name__}")
    by_id = {id(p): (n, p) for n, p in named}
    placed, parts = {}, []
    for k, group in enumerate(groups):
        part = []
        for p in group:
            if id(p) not in by_id:
                raise ValueError(f"DistributedOptimizer: groups[{k}] holds a tensor that is not "
                                 "a parameter of the optimizer (or does not require grad)")
            if id(p) in placed:
                raise ValueError(f"DistributedOptimizer: parameter '{by_id[id(p)][0]}' is in "
                                 f"groups[{placed[id(p)]}] and groups[{k}]")
            placed[id(p)] = k
            part.append(by_id[id(p)])
        if part:
            parts.append(part)
    rest = [(n, p) for n, p in named if id(p) not in placed]
    return parts + ([rest] if rest else [])


class _GroupedSync:
    """Horovod's ``groups=``: one GradSync per group, each on its own
    communicator (a split of the group: the groups' reductions launch at
    rank-dependent times and must not interleave on one communicator).  A
    group's gradients of one dtype and device form one fusion bucket, reduced
    together once all of them are ready; the parameters outside every listed
    group are bucketed as usual."""

    def __init__(self, parts, listed, process_set, bucket_cap_mb, compression, **args):
        base = group_or_world(process_set, "DistributedOptimizer")
        self.group = base
        self.syncs = []
        for k, part in enumerate(parts):
            whole = k < listed  # a listed group: one bucket; the rest: as usual
            comm = base.split(0, base.rank, f"{base.name}.grads{k}")
            self.syncs.append(GradSync(
                part, process_set=comm, compressor=as_compressor(compression),
                bucket_cap_mb=1 << 20 if whole else bucket_cap_mb,
                first_bucket_cap_mb=0 if whole else None,
                name=f"DistributedOptimizer.group{k}", **args))
        self.reducer = self.syncs[0].reducer
        self.compressor = self.syncs[0].compressor

    @property
    def backward_passes_per_step(self):
        return self.syncs[0].backward_passes_per_step

    @backward_passes_per_step.setter
    def backward_passes_per_step(self, passes):
        for s in self.syncs:
            s.backward_passes_per_step = passes

    @property
    def pending(self):
        return any(s.pending for s in self.syncs)

    def synchronize(self):
        # A step without a backward pass on this rank (InvalidArgumentError
        # from a GradSync) still reduces every group first, so that no rank
        # that ran one waits for a group this rank skipped.
        reduced, misuse = False, None
        for s in self.syncs:
            try:
                reduced = s.synchronize() or reduced
            except _C.InvalidArgumentError as e:
                misuse = misuse or e
        if misuse is not None:
            raise misuse
        return reduced

    def step_done(self):
        for s in self.syncs:
            s.step_done()


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed into the wrapped optimizer's class (so isinstance checks and the
    optimizer's own step() keep working)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 op, process_set, bucket_cap_mb, original, gradient_as_bucket_view,
                 gradient_predivide_factor, groups=None, sparse_as_dense=False):
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
        args = dict(op=op, backward_passes_per_step=backward_passes_per_step,
                    gradient_as_bucket_view=gradient_as_bucket_view,
                    gradient_predivide_factor=gradient_predivide_factor,
                    sparse_as_dense=sparse_as_dense)
        parts = _partition([(n, p) for n, p in named if p.requires_grad], groups)
        if parts is None:
            self._tutti = GradSync(named, process_set=process_set,
                                   compressor=as_compressor(compression),
                                   bucket_cap_mb=bucket_cap_mb, name="DistributedOptimizer",
                                   **args)
        else:
            if compression is not None and not (isinstance(compression, (str, Compressor))):
                raise error(_C.InvalidArgumentError,
                            "DistributedOptimizer(groups=...): compression must be a "
                            "Compression.* choice or a name (each group gets its own "
                            f"compressor), got {compression!r}")
            listed = len(parts) if isinstance(groups, int) else sum(
                1 for g in groups if len(g))
            self._tutti = _GroupedSync(parts, listed, process_set, bucket_cap_mb,
                                       compression, **args)
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
        loss = super(self.__class__, self).step(closure)
        self._tutti.step_done()
        return loss

    def zero_grad(self, *args, **kwargs):
        if self._tutti.pending:
            raise error(_C.InvalidArgumentError,
                        "optimizer.zero_grad() was called after loss.backward() but before "
                        "optimizer.step() or optimizer.synchronize(). This is prohibited "
                        "as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """Horovod's Adasum optimizer: each rank applies the wrapped optimizer to
    its own gradients, and the ranks combine the resulting parameter
    *updates* (deltas) with Adasum, one dot product per parameter; every
    rank then holds start + adasum(deltas).  Gradients themselves are never
    reduced (synchronize() has nothing to wait for)."""

    def __init__(self, params, compression, backward_passes_per_step, process_set, original):
        super(self.__class__, self).__init__(params)
        if original.state:
            self.load_state_dict(original.state_dict())
        if compression is not None and not (
                isinstance(compression, Compressor) and compression.name in ("none", "fp16",
                                                                             "bf16")):
            raise error(_C.InvalidArgumentError,
                        "DistributedOptimizer(op=Adasum): compression must be "
                        "Compression.none, fp16 or bf16 (a cast of the deltas), got "
                        f"{compression!r}")
        self._compression = compression or Compression.none
        self._process_set = process_set
        self.backward_passes_per_step = backward_passes_per_step
        self._should_synchronize = True

    @property
    def process_set(self):
        return group_or_world(self._process_set, "DistributedOptimizer")

    def set_backward_passes_per_step(self, passes):
        if passes < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {passes}")
        self.backward_passes_per_step = passes

    def synchronize(self):
        """Nothing to wait for: with Adasum the deltas are combined in step()."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Accepted for Horovod compatibility (synchronize() is a no-op here)."""
        yield

    def step(self, closure=None):
        """Local step, then the Adasum of every parameter's delta."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        with torch.no_grad():
            starts = [p.detach().clone() for p in params]
            super(self.__class__, self).step()
            deltas, ctxs = [], []
            for p, start in zip(params, starts):
                delta, ctx = self._compression.compress(p.detach() - start)
                deltas.append(delta)
                ctxs.append(ctx)
            grouped_allreduce_(deltas, name="DistributedOptimizer.adasum", op=Adasum,
                               process_set=self._process_set)
            for p, start, delta, ctx in zip(params, starts, deltas, ctxs):
                p.copy_(start + self._compression.decompress(delta, ctx))
        return loss


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
    size (default TUTTI_BUCKET_MB).  ``groups`` (Horovod's; ``num_groups``
    its deprecated spelling): an int N splits the parameters in order into
    N groups, a list of lists of parameters names the groups; each group's
    gradients are reduced together (one fusion bucket per dtype and device,
    on its own split communicator) once all of them are ready.
    ``sparse_as_dense=True``: sparse gradients (``Embedding(sparse=True)``)
    are densified and reduced; without it they raise UnsupportedError
    naming the parameter.
    ``gradient_predivide_factor=f`` (Horovod's): each rank's gradients are
    divided by f before the sum and the sum by size / f after it (f = 1: sum,
    then divide; f = size: divide first; see docs/data_parallel.md for which
    is more accurate).  Needs ``op=Average`` (ValueError otherwise, as in
    Horovod).  With ``Compression.fp16``/``bf16`` the gradients are divided
    by f before the cast and by size / f after the conversion back, as in
    Horovod (f = 1 keeps the cast's own split: divide by the size before
    it, so a float16 sum cannot overflow); ``Compression.none`` as without
    compression; the other compressions average in float32 themselves and
    refuse a factor other than 1 (InvalidArgumentError).  ``op=Adasum`` (Horovod's): each
    rank steps the wrapped optimizer on its own gradients and the parameter
    updates are combined with Adasum in ``step()`` (no overlap with
    backward; power-of-two sizes; compression none/fp16/bf16 only; see
    docs/python.md for the learning rate).
    ``gradient_as_bucket_view=True``: every ``.grad`` is a view into the
    reducer's fusion bucket (as torch DDP's option): no copy into the bucket
    and none back; ``zero_grad(set_to_none=True)`` works (the next backward
    copies the new gradient into the view once and re-points ``.grad``).
    ``shard_optimizer_state=True``: ZeRO-1 (tutti.torch.zero): each rank
    keeps state for and steps only its partition of the parameters, which
    are then broadcast from their owners."""
    op = _resolve_op(None, op)
    if op is Adasum:
        if shard_optimizer_state:
            raise ValueError("DistributedOptimizer: shard_optimizer_state not supported "
                             "with op=Adasum")
        if gradient_predivide_factor != 1.0:
            raise ValueError("DistributedOptimizer: gradient_predivide_factor not supported "
                             "with op=Adasum")
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1, got "
                             f"{backward_passes_per_step}")
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
                   dict(_DistributedAdasumOptimizer.__dict__))
        return cls(optimizer.param_groups, compression, backward_passes_per_step,
                   process_set, optimizer)
    if op not in (Average, _C.ReduceOp.SUM):
        raise ValueError(f"DistributedOptimizer: op must be Average or Sum, got {op}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("DistributedOptimizer: gradient_predivide_factor not supported "
                         f"with op != Average (got gradient_predivide_factor="
                         f"{gradient_predivide_factor})")
    if num_groups and groups is None:  # Horovod's deprecated spelling
        groups = num_groups
    base = optimizer.__class__
    if shard_optimizer_state:
        from .zero import shard_distributed_optimizer_base
        base = shard_distributed_optimizer_base(optimizer, process_set)
    cls = type(optimizer.__class__.__name__, (base,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression,
               backward_passes_per_step, op, process_set, bucket_cap_mb, optimizer,
               gradient_as_bucket_view, gradient_predivide_factor, groups, sparse_as_dense)
