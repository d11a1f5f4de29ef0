"""Autograd hooks that feed a tutti.Reducer while backward runs.

One GradSync serves DistributedOptimizer (the reduction is waited for in
``optimizer.step()``) and DistributedDataParallel (waited for at the end of
``backward()``, as torch DDP does).

* Each parameter gets a post-accumulation hook (``register_post_accumulate_
  grad_hook`` where torch has it, else a hook on its AccumulateGrad node):
  when its ``.grad`` is final for this pass, ``reducer.grad_ready(i)`` copies
  it into its fusion bucket and a complete bucket starts its all-reduce while
  backward continues.
* The first hook of a pass queues a callback on the autograd engine
  (``Variable._execution_engine.queue_callback``) that runs when this
  backward pass ends: the reducer learns the pass is over.
* Gradients live in tensors registered with the reducer once.  A new
  ``.grad`` tensor (``zero_grad(set_to_none=True)``, the first backward) is
  copied into the registered one, which becomes ``.grad`` again.
* ``gradient_as_bucket_view=True``: the registered tensors ARE slices of the
  reducer's fusion buckets (``reducer.gradient(i)`` through DLPack), so
  autograd accumulates straight into the bucket and the reducer averages in
  place: no copy in, no write-back.  After ``set_to_none`` the new ``.grad``
  is copied into the slice once and ``.grad`` re-pointed at it.  When the
  reducer re-plans its buckets in the learned order (once, at the end of the
  first step) the slices move and ``.grad`` follows them.
* Unused parameters: ``find_unused_parameters`` (DDP) searches the autograd
  graph of each forward's output and the reducer fills the unreachable
  parameters' slots as the backward pass starts; ``static_graph`` lets the
  reducer reuse the first step's unused set without a search.
* Sparse gradients (``torch.nn.Embedding(sparse=True)``): with
  ``sparse_as_dense=True`` autograd adds them into the registered dense
  ``.grad`` (a fresh sparse ``.grad`` after ``set_to_none`` is densified into
  it); without it a tensor hook raises UnsupportedError naming the parameter
  before anything accumulates.
* Accumulation (Horovod's ``backward_passes_per_step``, DDP's ``no_sync()``)
  runs passes inside ``reducer.no_sync()``: no communication.  The pass that
  completes a step reduces; a step that ends with fewer passes reduces what
  was accumulated (Horovod forces the allreduce in ``step()`` too).
* A step with no backward pass on this rank still reduces (this rank's
  gradients count as zeros), so that ranks that ran one are not left
  waiting in their bucket all-reduces; if any rank contributed a gradient
  this rank then raises InvalidArgumentError (the misuse is its own).
"""
import torch

from .. import _C
from ._util import WeakOwner, error, export, group_or_world, stream_of


def _post_accumulate_hook(param, fn):
    """Registers fn() to run after param.grad was accumulated.  Returns the
    objects to keep alive (handle, and the AccumulateGrad node on old torch)."""
    if hasattr(param, "register_post_accumulate_grad_hook"):
        return (param.register_post_accumulate_grad_hook(lambda _p: fn()),)
    with torch.enable_grad():
        acc = param.expand_as(param).grad_fn.next_functions[0][0]
    return (acc.register_hook(lambda *_: fn()), acc)


class GradSync:
    def __init__(self, named_parameters, *, process_set=None, compressor=None,
                 op=_C.ReduceOp.AVG, backward_passes_per_step=1, bucket_cap_mb=None,
                 name="dp", sync_in_backward=False, find_unused_parameters=False,
                 static_graph=False, gradient_as_bucket_view=False,
                 gradient_predivide_factor=1.0, first_bucket_cap_mb=None,
                 sparse_as_dense=False):
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
        self.group = group_or_world(process_set)
        self.name = name
        self.backward_passes_per_step = backward_passes_per_step
        self.sync_in_backward = sync_in_backward
        seen, entries = set(), []
        for pname, p in named_parameters:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                entries.append((pname, p))
        self.names = [n for n, _ in entries]
        self.params = [p for _, p in entries]
        self.as_view = gradient_as_bucket_view
        self.sparse_as_dense = sparse_as_dense
        seeds = []
        for pname, p in entries:
            if p.is_sparse:
                raise error(_C.UnsupportedError, f"parameter '{pname}' is a sparse tensor; "
                            "only dense parameters (with dense or sparse gradients) are "
                            "supported")
            if self.as_view:  # the bucket is the gradient; an existing one seeds it
                seeds.append(None if p.grad is None else
                             self._dense(pname, p.grad).contiguous())
                continue
            buf = torch.zeros_like(p, memory_format=torch.contiguous_format)
            if p.grad is not None:
                buf.copy_(self._dense(pname, p.grad))
            p.grad = buf
            seeds.append(buf)
        self.reducer = _C.Reducer(self.group, bucket_cap_mb=bucket_cap_mb, op=op,
                                  compressor=compressor, name=name,
                                  find_unused_parameters=find_unused_parameters,
                                  static_graph=static_graph,
                                  first_bucket_cap_mb=first_bucket_cap_mb,
                                  gradient_as_bucket_view=gradient_as_bucket_view,
                                  gradient_predivide_factor=gradient_predivide_factor)
        # The compressor in use (None: plain all-reduce); a Stateful whose
        # state_dict() a checkpoint must carry.
        self.compressor = self.reducer.options["compressor"]
        for pname, p, g in zip(self.names, self.params, seeds):
            self.reducer.add_parameter(pname, export(p), g)
        self.reducer.build()
        self.grads = seeds
        self._rebuilds = 0
        if self.as_view:
            self._point_at_buckets()
        self._unused_next = None  # find_unused_parameters: set by DDP's forward
        self._keep = []
        for i, p in enumerate(self.params):
            self._keep.append(_post_accumulate_hook(p, lambda i=i: self._on_grad(i)))
            if not sparse_as_dense:  # refuse sparse gradients before they accumulate
                self._keep.append((p.register_hook(
                    lambda g, n=self.names[i]: self._dense(n, g) if g.is_sparse else None),))
        self._in_pass = False
        self._reducing = False
        self._guard = None
        self._passes = 0       # accumulation passes in this step
        self._pending = False  # a reducing pass ended; synchronize() waits for it
        self._synced = False   # synchronize() reduced since the last step_done()
        self._ready = 0        # hooks that fired in this pass
        self.no_sync_depth = 0
        # The factor the gradients of the next passes carry (the AMP loss
        # scale: a float, or a GradScaler's device tensor), handed in by the
        # loss scaler whose scaled loss reaches these parameters (amp.py,
        # tagged below); None: not loss-scaled.
        self.loss_scale = None
        for p in self.params:
            p._tutti_grad_sync = WeakOwner(self)

    # ---- the autograd side ------------------------------------------------------

    def _dense(self, pname, g):
        """A sparse gradient (torch.nn.Embedding(sparse=True)) densified with
        sparse_as_dense=True, else UnsupportedError naming the parameter."""
        if not g.is_sparse:
            return g
        if not self.sparse_as_dense:
            raise error(_C.UnsupportedError,
                        f"parameter '{pname}' has a sparse gradient: pass "
                        "DistributedOptimizer(..., sparse_as_dense=True) to reduce it as a "
                        "dense tensor (tutti does not allgather sparse gradients)")
        return g.to_dense()

    def _on_grad(self, i):
        if not self._in_pass:
            self._begin_pass()
        p, buf = self.params[i], self.grads[i]
        g = p.grad
        if g is not buf and g.is_sparse:  # sparse_as_dense after set_to_none
            buf.copy_(self._dense(self.names[i], g))
            p.grad = g = buf
        if g is not buf:
            if g.data_ptr() != buf.data_ptr() or g.shape != buf.shape:
                buf.copy_(g)
            p.grad = buf
        self._ready += 1
        self.reducer.grad_ready(i, stream_of(buf))

    def _point_at_buckets(self):
        """View mode: self.grads and every .grad become the buckets' slices."""
        self.grads = [torch.from_dlpack(self.reducer.gradient(i))
                      for i in range(len(self.params))]
        for p, g in zip(self.params, self.grads):
            p.grad = g

    def set_unused(self, indices):
        """find_unused_parameters: the parameters the next backward pass will
        not reach (DDP's forward searches the graph)."""
        self._unused_next = indices

    def _begin_pass(self):
        if self._pending:
            raise error(_C.InvalidArgumentError,
                        "Gradients were computed more than backward_passes_per_step "
                        f"({self.backward_passes_per_step}) times before call to step(). "
                        "Increase backward_passes_per_step to accumulate gradients locally.")
        self._in_pass = True
        self._ready = 0
        scale = self.loss_scale
        if self.compressor is not None and scale is not None:
            if torch.is_tensor(scale):  # a GradScaler's device-side scale
                scale = float(scale.item())
            self.reducer.set_gradient_scale(scale)
        torch.autograd.Variable._execution_engine.queue_callback(self._end_pass)
        self._reducing = (self.no_sync_depth == 0 and
                          self._passes + 1 >= self.backward_passes_per_step)
        if not self._reducing:
            self._guard = self.reducer.no_sync()
            self._guard.__enter__()
        unused, self._unused_next = self._unused_next, None
        if unused and self._reducing:
            for i in unused:
                self.reducer.mark_unused(i, stream_of(self.grads[i]))

    def _end_pass(self):
        self._in_pass = False
        if self._reducing:
            self._pending = True
            if self.sync_in_backward:
                self.synchronize()
            return
        try:
            self.reducer.synchronize()  # an accumulation pass: no communication
        finally:
            self._guard.__exit__(None, None, None)
            self._guard = None
        if self.no_sync_depth == 0:
            self._passes += 1

    # ---- the step side ------------------------------------------------------------

    @property
    def pending(self):
        """True between a reducing backward pass and synchronize()."""
        return self._pending

    def synchronize(self):
        """Waits for the gradient reduction and writes the averages into every
        parameter's ``.grad``.  Returns True when something was reduced."""
        if self._in_pass:
            raise error(_C.InvalidArgumentError,
                        "synchronize()/step() called while a backward pass is running")
        if not self._pending and self._passes == 0:
            if self._synced:
                return False  # this step's reduction was already waited for
            return self._synchronize_without_backward()
        buf = next((g for g in self.grads if g.is_cuda), None)
        stream = stream_of(buf) if buf is not None else 0
        try:
            reduced = self.reducer.synchronize(stream)
        finally:
            self._pending = False
            self._passes = 0
            self._synced = True
        if self.as_view:
            rebuilds = self.reducer.stats()["bucket_rebuilds"]
            if rebuilds != self._rebuilds:  # the learned order moved the slices
                self._rebuilds = rebuilds
                self._point_at_buckets()
                return reduced
        if self._ready < len(self.params):
            # Unused parameters also hold the (zero or accumulated) average.
            for p, g in zip(self.params, self.grads):
                if p.grad is not g:
                    p.grad = g
        return reduced

    def _synchronize_without_backward(self):
        """step()/synchronize() with no backward pass on this rank since the
        last step.  Ranks that ran one wait in their bucket all-reduces: join
        them with zeros (the reducer fills every slot no pass produced), so
        none of them hangs, then raise here if some rank contributed a
        gradient (the average holds it).  When no rank ran a backward the
        average is zero, nothing is raised, and a ``.grad`` that is None
        stays None."""
        buf = next((g for g in self.grads if g.is_cuda), None)
        stream = stream_of(buf) if buf is not None else 0
        try:
            self.reducer.synchronize(stream)
        finally:
            self._synced = True
        if self.as_view:
            rebuilds = self.reducer.stats()["bucket_rebuilds"]
            if rebuilds != self._rebuilds:  # the learned order moved the slices
                self._rebuilds = rebuilds
                self.grads = [torch.from_dlpack(self.reducer.gradient(i))
                              for i in range(len(self.params))]
                for p, g in zip(self.params, self.grads):
                    if p.grad is not None:
                        p.grad = g
        nonzero = next((n for n, g in zip(self.names, self.grads) if bool(g.any())), None)
        if nonzero is None:
            return False
        self._synced = False  # the step this rank skipped is over
        raise error(_C.InvalidArgumentError,
                    f"{self.name}: step() (or synchronize()) without a backward pass on "
                    "this rank since the last step, while other ranks of group "
                    f"'{self.group.name}' reduced gradients ('{nonzero}' is not zero): "
                    "their average counted this rank's gradients as zeros. Every rank "
                    "must run loss.backward() before step(), or none may")

    def step_done(self):
        """The optimizer stepped: the next synchronize() belongs to a new
        step (without a backward pass before it, the misuse above)."""
        self._synced = False

    def broadcast_parameters(self, root_rank=0):
        """Collective: copies every registered parameter from root_rank."""
        self.reducer.broadcast_parameters(root_rank)

    def close(self):
        """Removes the hooks (the reducer is released with this object)."""
        for kept in self._keep:
            kept[0].remove()
        self._keep = []
