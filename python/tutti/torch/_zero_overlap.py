"""ZeroRedundancyOptimizer(overlap_with_ddp=True): the optimizer step runs
inside tutti.torch.DistributedDataParallel's comm hook, bucket by bucket
(``ddp_comm_hooks.hook_with_zero_step`` / ``hook_with_zero_step_interleaved``
build the hook; this module holds the state they share with the optimizer).

Life cycle, as torch's:

* Warm-up: the first ``warmup`` reducing backward passes (2, or 3 with
  ``static_graph=True``: the passes after which torch's DDP has rebuilt its
  buckets) only run the wrapped hook; parameters are not updated.  The last
  warm-up pass records every bucket's parameters, and when its last bucket's
  all-reduce completed the partition is made (``initialize``).  tutti's
  buckets are fixed when the hook is registered, so the count is kept for
  parity with torch, not because tutti needs it: a script written for torch
  sees the same number of updates.
* Partition (whole buckets, torch's rules): bucket i goes to rank i mod W;
  with ``shard_buckets=True`` the buckets, smallest first, are cut into runs
  of parameters below total/W elements, each run to the least-loaded rank
  not yet holding part of that bucket.  Every run's parameters become views
  of one flat tensor (on every rank), the unit of the broadcast.
* After warm-up, once bucket k's Future completed (its all-reduce is done),
  the owner of each run of bucket k steps those parameters with the reduced
  gradients (the local ``optimizer_class`` over just them), and every run is
  broadcast from its owner.  The continuation runs where the DDP completes
  the Future: before the next bucket's hook, or when backward ends -- the
  same point of every rank's sequence of collectives, so the broadcasts
  match.  The last continuation waits for every broadcast: when backward
  returns, the step is done.
"""
import warnings

import torch

from .. import _C
from ._util import error, stream_of, wire

_CALL = "ZeroRedundancyOptimizer(overlap_with_ddp=True)"

# torch accepts an optimizer class here only if it has a functional
# equivalent (torch.distributed.optim.functional_optim_map): these update
# each parameter from its own gradient and state, so stepping a bucket's
# parameters at a time is the same as one step over all of them.
PER_PARAMETER_OPTIMIZERS = tuple(getattr(torch.optim, n) for n in (
    "SGD", "Adam", "AdamW", "Adagrad", "Adamax", "RMSprop", "Rprop", "Adadelta"))


def check_optimizer_class(optimizer_class):
    if optimizer_class not in PER_PARAMETER_OPTIMIZERS:
        names = ", ".join(c.__name__ for c in PER_PARAMETER_OPTIMIZERS)
        raise error(ValueError,
                    f"{_CALL}: optimizer_class {getattr(optimizer_class, '__name__', optimizer_class)}"
                    f" is not supported: the step runs bucket by bucket, which equals one step "
                    f"only for optimizers that update each parameter on its own (torch accepts "
                    f"those with a functional equivalent: {names})")


def _value(fut):
    v = fut.value()
    return v[0] if isinstance(v, (list, tuple)) and len(v) == 1 else v


class _Run:
    """Parameters bucket[offset:offset + len(params)] that ``rank`` updates;
    ``flat`` holds their data (the parameters are views of it)."""

    def __init__(self, bucket, offset, params, rank):
        self.bucket, self.offset, self.params, self.rank = bucket, offset, params, rank
        self.flat = None


class Overlap:
    """The overlap state of one ZeroRedundancyOptimizer."""

    def __init__(self, zero):
        self.zero = zero
        self.ddp = None          # the DDP hook_with_zero_step was made for
        self.hook = None         # the hook it returned
        self.shard_buckets = False
        self.warmup = None       # reducing passes without updates
        self.passes = 0          # reducing passes whose hook ran
        self.recorded = []       # [bucket] -> parameters, in the last warm-up pass
        self.initialized = False
        self.runs = []           # [bucket] -> runs in rank order
        self.seen = []           # bucket indices of this pass
        self.futures = {}        # non-interleaved: bucket -> (bucket, Future)
        self.handles = []        # broadcasts in flight
        self.pending_load = None

    # ---- binding (hook_with_zero_step) -------------------------------------------

    def bind(self, ddp, hook, shard_buckets, call):
        if self.ddp is not None:
            raise error(_C.InvalidArgumentError,
                        f"{call}: this ZeroRedundancyOptimizer already has a hook "
                        "(one hook_with_zero_step* per optimizer)")
        group = getattr(ddp, "process_group", None)
        if not hasattr(ddp, "register_comm_hook") or group is None:
            raise error(TypeError, f"{call}: ddp must be a tutti.torch.DistributedDataParallel, "
                        f"got {type(ddp).__name__}")
        if group.size != self.zero.world_size or group.rank != self.zero.rank:
            raise error(_C.InvalidArgumentError,
                        f"{call}: the DDP's group (rank {group.rank} of {group.size}) is not "
                        f"the optimizer's (rank {self.zero.rank} of {self.zero.world_size})")
        self.ddp, self.hook, self.shard_buckets = ddp, hook, bool(shard_buckets)
        self.warmup = 3 if getattr(ddp, "static_graph", False) else 2

    def check_step(self):
        """ZeroRedundancyOptimizer.step() in overlap mode: torch's warning,
        or an error when no hook can ever update the parameters."""
        runner = getattr(self.ddp, "_comm_hook", None) if self.ddp is not None else None
        if self.hook is None or runner is None or runner.hook is not self.hook:
            what = ("no hook_with_zero_step(hook, ddp, zero) was made for it"
                    if self.hook is None else
                    "the hook_with_zero_step(...) made for it is not registered on its "
                    "DistributedDataParallel")
            raise error(_C.InvalidArgumentError,
                        f"{_CALL}.step(): {what}, so no parameter would ever be updated.  "
                        "Call ddp.register_comm_hook(None, hook_with_zero_step(allreduce_hook, "
                        "ddp, zero)) (tutti.torch.ddp_comm_hooks) before the first forward; the "
                        "step then runs inside backward and step() is not needed")
        warnings.warn("ZeroRedundancyOptimizer(overlap_with_ddp=True).step() does nothing: the "
                      "step runs inside backward (torch: step() should not be included in the "
                      "training loop when overlap_with_ddp=True)", stacklevel=3)

    # ---- per bucket (called by the hooks) ------------------------------------------

    def check_scale(self, bucket):
        """Scaled gradients (a tutti loss scaler handed its scale to the DDP)
        would be stepped before any unscale or overflow check."""
        if self.initialized and bucket.loss_scale is not None:
            raise error(_C.InvalidArgumentError,
                        f"{_CALL}: bucket {bucket.index()}'s gradients carry an AMP loss scale; "
                        "the step runs inside backward, before any unscale or Inf/NaN check "
                        "(torch's overlap has none either).  Use overlap_with_ddp=False with "
                        "the loss scaler")

    def on_bucket(self, bucket, fut, interleaved):
        """Returns the Future the hook hands to the DDP for ``bucket``."""
        k = bucket.index()
        if k == 0:
            self.passes += 1
            self.seen = []
            self.futures = {}
        if not self.initialized:
            if self.passes < self.warmup:
                return fut
            if k == 0:
                self.recorded = []
            self.recorded.append(bucket.parameters())
            if not bucket.is_last():
                return fut

            def initialize(f):
                self.initialize()
                return f.value()
            return fut.then(initialize)
        self._check_bucket(k, bucket)
        self.seen.append(k)
        if interleaved:
            def step_bucket(f):
                self._step_and_broadcast(k, bucket, _value(f))
                if bucket.is_last():
                    self._finish()
                return f.value()
            return fut.then(step_bucket)
        self.futures[k] = (bucket, fut)
        if not bucket.is_last():
            return fut

        def step_all(f):
            for j in range(len(self.runs)):
                b, fj = self.futures[j]
                if not fj.done():
                    raise error(_C.InvalidArgumentError,
                                f"hook_with_zero_step: the Future of bucket {j} is not complete "
                                f"when the last bucket's is: the wrapped hook must complete its "
                                "Futures in bucket order (tutti.torch.ddp_comm_hooks' do)")
                self._step_and_broadcast(j, b, _value(fj))
            self._finish()
            return f.value()
        return fut.then(step_all)

    def _check_bucket(self, k, bucket):
        if k != len(self.seen) or k >= len(self.runs):
            raise error(_C.InvalidArgumentError,
                        f"{_CALL}: bucket {k} arrived after buckets {self.seen} of "
                        f"{len(self.runs)}: the DDP's buckets changed since the partition was made")
        params = bucket.parameters()
        expected = [p for run in sorted(self.runs[k], key=lambda r: r.offset)
                    for p in run.params]
        if len(params) != len(expected) or any(a is not b for a, b in zip(params, expected)):
            raise error(_C.InvalidArgumentError,
                        f"{_CALL}: bucket {k} holds other parameters than when the partition "
                        "was made (warm-up)")

    def _step_and_broadcast(self, k, bucket, value):
        zero = self.zero
        for run in self.runs[k]:
            if run.rank != zero.rank:
                continue
            flat = value.reshape(-1)
            views = bucket.views(flat)[run.offset:run.offset + len(run.params)]
            zero._step_subset(run.params, [v.to(p.dtype) for p, v in zip(run.params, views)])
        g = zero._group
        if g.size == 1:
            return
        for run in self.runs[k]:
            self.handles.append(g.broadcast(wire(run.flat), root=run.rank, async_op=True,
                                            name=f"ZeroRedundancyOptimizer overlap bucket {k} "
                                                 f"from rank {run.rank}",
                                            stream=stream_of(run.flat)))

    def _finish(self):
        handles, self.handles = self.handles, []
        for h in handles:
            h.wait()
        self.futures = {}

    # ---- partition -----------------------------------------------------------------------

    def initialize(self):
        """The partition from the recorded buckets; the parameters become
        views of their run's flat tensor; the local optimizer is built."""
        zero = self.zero
        ours = {id(p) for p in zero._all_params}
        bucketed = set()
        for k, params in enumerate(self.recorded):
            for p in params:
                if id(p) not in ours:
                    raise error(ValueError,
                                f"{_CALL}: a parameter of shape {tuple(p.shape)} in DDP bucket "
                                f"{k} was not passed to the ZeroRedundancyOptimizer")
                bucketed.add(id(p))
        for i, p in enumerate(zero._all_params):
            if p.requires_grad and id(p) not in bucketed:
                raise error(_C.InvalidArgumentError,
                            f"{_CALL}: parameter {i} (shape {tuple(p.shape)}) requires grad but "
                            "is in none of the DDP's buckets: it would never be updated (pass "
                            "the DDP module's parameters)")
        if self.shard_buckets:
            self.runs, assigned = self._sharded_runs()
        else:
            self.runs = [[_Run(k, 0, list(ps), k % zero.world_size)]
                         for k, ps in enumerate(self.recorded)]
            assigned = [runs[0] for runs in self.runs]
        per_rank = [[] for _ in range(zero.world_size)]  # in assignment order, as torch
        for run in assigned:
            per_rank[run.rank].extend(run.params)
        for runs in self.runs:
            for run in runs:
                self._flatten(run)
        self.recorded = []
        self.initialized = True
        zero._overlap_partition(per_rank)
        if self.pending_load is not None:
            state, self.pending_load = self.pending_load, None
            zero.load_state_dict(state)

    def _sharded_runs(self):
        """torch's shard_buckets=True assignment (see the module docstring):
        (runs per bucket in rank order, runs in assignment order)."""
        w = self.zero.world_size
        total = sum(p.numel() for ps in self.recorded for p in ps)
        threshold = total / w
        sizes = [0] * w
        runs = [[] for _ in self.recorded]
        assigned = []

        def least(exclude):
            best = None
            for r in range(w):
                if r not in exclude and (best is None or sizes[r] < sizes[best]):
                    best = r
            return best

        def assign(k, start, params, size):
            r = least({run.rank for run in runs[k]})
            runs[k].append(_Run(k, start, params, r))
            assigned.append(runs[k][-1])
            sizes[r] += size
        by_size = sorted(range(len(self.recorded)),
                         key=lambda k: sum(p.numel() for p in self.recorded[k]))
        for k in by_size:
            params = self.recorded[k]
            start, size = 0, 0
            for j, p in enumerate(params):
                if size + p.numel() >= threshold and j > start:
                    assign(k, start, params[start:j], size)
                    start, size = j, 0
                size += p.numel()
            assign(k, start, params[start:], size)
        for k in range(len(runs)):
            runs[k].sort(key=lambda run: run.rank)
        return runs, assigned

    @staticmethod
    def _flatten(run):
        first = run.params[0]
        flat = torch.empty(sum(p.numel() for p in run.params), dtype=first.dtype,
                           device=first.device)
        offset = 0
        with torch.no_grad():
            for p in run.params:
                n = p.numel()
                flat[offset:offset + n].copy_(p.data.reshape(-1))
                p.data = flat[offset:offset + n].view_as(p.data)
                offset += n
        run.flat = flat
