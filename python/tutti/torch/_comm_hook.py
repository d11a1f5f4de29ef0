"""DistributedDataParallel.register_comm_hook: torch DDP's communication-hook
contract over tutti's bucket plan.

Once a hook is registered the C++ reducer no longer sees gradients (its
autograd hooks are removed); this module keeps the reducer's bucket plan
(taken at registration: the first plan, in reverse parameter order) and
drives the buckets itself:

* Each bucket owns one flat buffer (the dtype and device of its
  parameters).  As a parameter's gradient becomes final it is copied into
  its slot (``gradient_as_bucket_view``: ``.grad`` IS the slot).
* Buckets are handed to ``hook(state, bucket)`` in index order (bucket i
  only after bucket i-1), as soon as all of its gradients are ready, while
  backward continues -- the same order on every rank, so the collectives a
  hook issues match.  A bucket still incomplete when backward ends (unused
  parameters) is handed over then; an unused parameter contributes its
  current ``.grad`` (zero after ``zero_grad``).
* tutti's hooks (ddp_comm_hooks) start their collective and register the
  step that completes it with the bucket (``bucket.defer``).  Deferred
  steps run in launch order before the next bucket's hook and when backward
  ends, so at most one hook's collectives are in flight (a compressor's run
  on its own thread can never interleave with the next bucket's).
* When backward ends every Future must be complete; its value (a tensor,
  or a one-tensor list, of the bucket's numel) is copied into the bucket and
  from there into every ``.grad``.
"""
import torch

from .. import _C
from ._grad_sync import _post_accumulate_hook
from ._util import error


class GradBucket:
    """torch.distributed.GradBucket's interface for one tutti bucket."""

    def __init__(self, index, buffer, params, offsets, is_last, group, loss_scale, defer):
        self._index = index
        self._buffer = buffer
        self._params = params
        self._offsets = offsets
        self._is_last = is_last
        self.process_group = group   # the DDP's tutti.ProcessGroup
        self.loss_scale = loss_scale  # the AMP scale the gradients carry, or None
        self._defer = defer

    def index(self):
        """The bucket's index (0 is the first handed over: the last layers)."""
        return self._index

    def buffer(self):
        """The flat buffer holding the bucket's gradients (this rank's)."""
        return self._buffer

    def set_buffer(self, tensor):
        """Replaces what buffer() returns (e.g. with a cast copy)."""
        self._buffer = tensor

    def parameters(self):
        """The bucket's parameters, in slot order."""
        return list(self._params)

    def gradients(self):
        """Views of buffer() shaped as each parameter (slot order)."""
        return self.views(self._buffer)

    def views(self, flat):
        """A bucket-sized flat tensor (e.g. the hook's result) viewed as each
        parameter, slot order (tutti's; gradients() is views(buffer()))."""
        return [flat[o:o + p.numel()].view(p.shape)
                for p, o in zip(self._params, self._offsets)]

    def is_last(self):
        """True for the last bucket of the backward pass."""
        return self._is_last

    def defer(self, future, complete):
        """tutti hooks: ``complete()`` finishes ``future`` (set_result); the
        DDP runs it in launch order before the next bucket's hook."""
        self._defer(future, complete)


class HookRunner:
    """Feeds a GradSync's parameters to a comm hook bucket by bucket (the
    GradSync's reducer hooks are removed; see the module docstring)."""

    def __init__(self, sync, state, hook, as_view, static_graph):
        self.sync, self.state, self.hook, self.as_view = sync, state, hook, as_view
        self.static_graph = static_graph
        self.params = sync.params
        index = {n: i for i, n in enumerate(sync.names)}
        plan = sync.reducer.buckets
        sync.close()
        self.buckets, self.where = [], [None] * len(self.params)
        for k, b in enumerate(plan):
            ids = [index[s["name"]] for s in b["slots"]]
            p0 = self.params[ids[0]]
            buf = torch.zeros(b["numel"], dtype=p0.dtype, device=p0.device)
            offs = [s["offset"] for s in b["slots"]]
            self.buckets.append((ids, offs, buf))
            for i, o in zip(ids, offs):
                self.where[i] = (k, o)
        if as_view:
            for i, p in enumerate(self.params):
                v = self._slot(i)
                if p.grad is not None:
                    v.copy_(p.grad)
                p.grad = v
        self._keep = [_post_accumulate_hook(p, lambda i=i: self._on_grad(i))
                      for i, p in enumerate(self.params)]
        self._in_pass = False
        self._unused_next = None
        self._static_unused = None  # static_graph: the first step's unused set

    def _slot(self, i):
        k, o = self.where[i]
        p = self.params[i]
        return self.buckets[k][2][o:o + p.numel()].view(p.shape)

    def set_unused(self, indices):
        self._unused_next = indices

    # ---- backward ----------------------------------------------------------------

    def _begin_pass(self):
        self._in_pass = True
        self._reducing = self.sync.no_sync_depth == 0
        torch.autograd.Variable._execution_engine.queue_callback(self._end_pass)
        self._ready = [False] * len(self.params)
        self._missing = [len(ids) for ids, _, _ in self.buckets]
        self._next = 0
        self._futures = [None] * len(self.buckets)
        self._pending = []
        unused, self._unused_next = self._unused_next, None
        if self.static_graph and self._static_unused is not None:
            unused = self._static_unused
        if self._reducing:
            for i in unused or ():
                self._mark_ready(i)

    def _on_grad(self, i):
        if not self._in_pass:
            self._begin_pass()
        if not self._reducing:
            if self.as_view:  # a new .grad (set_to_none) accumulates in the view
                self._into_slot(i)
            return
        if self._ready[i] and self.static_graph:
            raise error(_C.InvalidArgumentError,
                        f"DistributedDataParallel(static_graph=True): parameter "
                        f"'{self.sync.names[i]}' was unused in the first step and "
                        "has a gradient now")
        self._mark_ready(i)

    def _into_slot(self, i):
        """Puts the parameter's .grad (None: zero) into its slot; in view
        mode .grad becomes the slot."""
        p, slot = self.params[i], self._slot(i)
        g = p.grad
        if g is None:
            slot.zero_()
        elif g.data_ptr() != slot.data_ptr():
            slot.copy_(g)
        if self.as_view:
            p.grad = slot

    def _mark_ready(self, i):
        if self._ready[i]:
            return
        self._ready[i] = True
        self._into_slot(i)
        k = self.where[i][0]
        self._missing[k] -= 1
        while self._next < len(self.buckets) and self._missing[self._next] == 0:
            self._launch(self._next)
            self._next += 1

    def _launch(self, k):
        self._drain()
        ids, offs, buf = self.buckets[k]
        bucket = GradBucket(k, buf, [self.params[i] for i in ids], offs,
                            k == len(self.buckets) - 1, self.sync.group,
                            self.sync.loss_scale, self._defer)
        try:
            fut = self.hook(self.state, bucket)
        except BaseException:
            self._in_pass = False  # autograd drops the queued _end_pass
            raise
        if not isinstance(fut, torch._C.Future):  # .then() gives the C type
            self._in_pass = False
            raise error(_C.InvalidArgumentError,
                        f"DistributedDataParallel comm hook {_name(self.hook)} returned "
                        f"{type(fut).__name__} for bucket {k}: it must return a "
                        "torch.futures.Future whose value is the bucket's tensor")
        self._futures[k] = fut

    def _defer(self, future, complete):
        self._pending.append(complete)

    def _drain(self):
        pending, self._pending = self._pending, []
        for complete in pending:
            complete()

    def _end_pass(self):
        self._in_pass = False
        if not self._reducing:
            return
        if self.static_graph and self._static_unused is None:
            self._static_unused = [i for i, r in enumerate(self._ready) if not r]
        for i, r in enumerate(self._ready):
            if not r:
                self._mark_ready(i)
        self._drain()
        for k, (ids, offs, buf) in enumerate(self.buckets):
            self._write_back(k, ids, buf, self._futures[k])

    def _write_back(self, k, ids, buf, fut):
        if not fut.done():
            raise error(_C.InvalidArgumentError,
                        f"DistributedDataParallel comm hook {_name(self.hook)}: the Future "
                        f"of bucket {k} is not complete when backward ends (a hook must "
                        "return a completed Future, or one of tutti.torch.ddp_comm_hooks')")
        value = fut.value()
        if isinstance(value, (list, tuple)) and len(value) == 1:
            value = value[0]
        if not torch.is_tensor(value) or value.numel() != buf.numel():
            what = (f"{value.dtype}[{value.numel()}]" if torch.is_tensor(value)
                    else type(value).__name__)
            raise error(_C.InvalidArgumentError,
                        f"DistributedDataParallel comm hook {_name(self.hook)}: bucket {k} "
                        f"has {buf.numel()} elements; its Future returned {what}")
        if value.data_ptr() != buf.data_ptr():
            buf.copy_(value.reshape(-1))
        if self.as_view:
            return
        for i in ids:
            p, v = self.params[i], self._slot(i)
            if p.grad is None:
                p.grad = v.clone()
            else:
                p.grad.copy_(v)


def _name(hook):
    return getattr(hook, "__qualname__", None) or repr(hook)
