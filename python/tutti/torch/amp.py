"""Loss scaling for torch with the overflow decision agreed across ranks.

* :class:`LossScaler` -- ``torch.cuda.amp.GradScaler``'s interface (scale,
  unscale_, step, update, get_scale, state_dict) over tutti's C++
  DynamicLossScaler: one fused unscale + NaN/Inf pass over all gradients,
  the skip decision all-reduced (MAX) over the given groups, and
  hysteresis/bounds options.  Works for host and CUDA gradients.
* :class:`GradScaler` -- a subclass of ``torch.cuda.amp.GradScaler`` (CUDA;
  torch's own kernels) whose per-device ``found_inf`` flags are all-reduced
  (MAX) over the group before ``step()`` decides, so every rank skips the
  same steps even when ranks see different overflows (compressors that
  drop values, tensor-parallel shards).  torch 1.13's GradScaler disables
  itself without CUDA; on the CPU use LossScaler.

With a tutti ``DistributedOptimizer`` both call ``optimizer.synchronize()``
before unscaling and step inside ``skip_synchronize()``, Horovod's recipe.

Both hand the scale they apply to the gradient sync (the reducer of a
DistributedOptimizer or DistributedDataParallel) of the parameters their
scaled loss reaches, so error-feedback compressors keep residuals in the
units the gradients carry (tutti.Reducer.set_gradient_scale): each scaler
feeds only its own models' reducers (see _ScaleHandoff).
"""
import contextlib
import math

import torch

from .. import _C
from ._util import graph_leaves, group_or_world, stream_of

_READY, _UNSCALED, _STEPPED = 0, 1, 2


def _distributed(optimizer):
    return hasattr(optimizer, "_tutti")


def _synchronized(optimizer):
    """Waits for a DistributedOptimizer's gradient reduction."""
    if _distributed(optimizer):
        optimizer.synchronize()


@contextlib.contextmanager
def _no_second_sync(optimizer):
    if _distributed(optimizer):
        with optimizer.skip_synchronize():
            yield
    else:
        yield


class _ScaleHandoff:
    """The gradient syncs (tutti.torch._grad_sync.GradSync, which tags its
    parameters with ``_tutti_grad_sync``) whose gradients one scaler scales,
    and the hand-over of its scale to them before their backward pass.

    Until the scaler's first update() every scale() searches the autograd
    graph of its outputs for tagged parameters (so the first step's
    reduction already knows its scale); afterwards the syncs found so far
    get the scale without a search.  unscale_(optimizer) also adopts the
    syncs of the optimizer's parameters (a DistributedOptimizer, or a plain
    optimizer over a DistributedDataParallel's parameters)."""

    def __init__(self):
        self._syncs = []      # weak references
        self.searching = True

    def adopt(self, params):
        for p in params:
            ref = getattr(p, "_tutti_grad_sync", None)
            if ref is not None and ref() is not None and \
                    not any(r() is ref() for r in self._syncs):
                self._syncs.append(ref)

    def hand(self, outputs, scale):
        """Before the backward of ``outputs`` (scaled by ``scale``)."""
        if self.searching:
            self.adopt(graph_leaves(outputs).values())
        for ref in self._syncs:
            sync = ref()
            if sync is not None:
                sync.loss_scale = scale


def _params_of(optimizer):
    return (p for group in optimizer.param_groups for p in group["params"])


def agree_found_inf(found_inf_per_device, process_set=None):
    """All-reduces (MAX) the found_inf flags of a GradScaler step over the
    group and writes the agreed value back into every flag tensor.  One
    collective per call; every rank must call it."""
    flags = list(found_inf_per_device.values())
    if flags:
        agreed = flags[0].detach().clone()
        for f in flags[1:]:
            agreed = torch.maximum(agreed, f.to(agreed.device))
    else:
        agreed = torch.zeros(1, dtype=torch.float32)
    group_or_world(process_set).allreduce(agreed, op="max", name="GradScaler found_inf",
                                          stream=stream_of(agreed))
    for f in flags:
        f.copy_(agreed.to(f.device))
    return agreed


class GradScaler(torch.cuda.amp.GradScaler):
    """``torch.cuda.amp.GradScaler`` with the inf/NaN decision agreed across
    ``process_set`` (default: the world)."""

    def __init__(self, *args, process_set=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._tutti_group = process_set
        self._handoff = _ScaleHandoff()

    def scale(self, outputs):
        """GradScaler.scale; also hands the scale (a device tensor, read only
        by reducers with an error-feedback compressor) to the gradient sync
        of the parameters ``outputs`` reaches, so residuals follow backoffs
        and growth as with LossScaler."""
        scaled = super().scale(outputs)
        if self.is_enabled():
            self._handoff.hand(outputs, self._scale)
        return scaled

    def update(self, new_scale=None):
        """GradScaler.update (ends the first step's graph search)."""
        self._handoff.searching = False
        return super().update(new_scale)

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        per_device = super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        agree_found_inf(per_device, self._tutti_group)
        return per_device

    def unscale_(self, optimizer):
        """GradScaler.unscale_ after a DistributedOptimizer's reduction."""
        self._handoff.adopt(_params_of(optimizer))
        _synchronized(optimizer)
        return super().unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        """GradScaler.step with the agreed found_inf (no second reduction)."""
        _synchronized(optimizer)
        with _no_second_sync(optimizer):
            return super().step(optimizer, *args, **kwargs)


class LossScaler:
    """A GradScaler-compatible loss scaler over tutti's C++ DynamicLossScaler.

    ``groups``: the tutti.ProcessGroups whose ranks must take the same skip
    decision (default: the DistributedOptimizer's group, else the world); for
    a data x tensor-parallel mesh pass ``[mesh.dp_group, mesh.tp_group]``.
    ``precision='bfloat16'`` keeps the scale at 1 and only skips NaN/Inf
    steps.  ``min_scale`` defaults to 0 (GradScaler has no lower bound);
    ``hysteresis``, ``max_scale``, ``at_min_scale`` and
    ``max_consecutive_skips`` are the C++ scaler's options."""

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True, *, precision="float16", groups=None,
                 hysteresis=1, consecutive_hysteresis=False, min_scale=0.0,
                 max_scale=math.inf, at_min_scale="error", max_consecutive_skips=0):
        self._enabled = enabled
        self._groups = groups
        self._scaler = _C.amp.DynamicLossScaler(
            precision=precision, init_scale=init_scale, growth_factor=growth_factor,
            backoff_factor=backoff_factor, growth_interval=growth_interval,
            hysteresis=hysteresis, consecutive_hysteresis=consecutive_hysteresis,
            min_scale=min_scale, max_scale=max_scale, at_min_scale=at_min_scale,
            max_consecutive_skips=max_consecutive_skips, state_prefix="loss_scaler")
        self._stage = {}
        self._handoff = _ScaleHandoff()

    @property
    def scaler(self):
        """The underlying tutti.amp.DynamicLossScaler (a Stateful)."""
        return self._scaler

    def is_enabled(self):
        """False when constructed with enabled=False (every call is a no-op)."""
        return self._enabled

    def get_scale(self):
        """The current loss scale (1.0 when disabled)."""
        return self._scaler.scale if self._enabled else 1.0

    def scale(self, outputs):
        """outputs * scale (a tensor, or an iterable of tensors)."""
        if not self._enabled:
            return outputs
        s = self._scaler.scale
        self._handoff.hand(outputs, s)  # for compressors' residuals (_grad_sync)
        if torch.is_tensor(outputs):
            return outputs * s
        return type(outputs)(o * s for o in outputs)

    def _groups_for(self, optimizer):
        if self._groups is not None:
            return self._groups if isinstance(self._groups, (list, tuple)) else [self._groups]
        if _distributed(optimizer):
            return [optimizer.process_set]
        return [group_or_world(None)]

    def unscale_(self, optimizer):
        """Divides the optimizer's gradients by the scale in place (one fused
        pass) and records whether any rank saw NaN/Inf."""
        if not self._enabled:
            return
        if self._stage.get(id(optimizer), _READY) == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer "
                               "since the last update().")
        if self._stage.get(id(optimizer)) == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        self._handoff.adopt(_params_of(optimizer))
        _synchronized(optimizer)
        # Messages name the parameters (a DistributedOptimizer knows them).
        known = {}
        if _distributed(optimizer):
            known = {id(p): n for n, p in zip(optimizer._tutti.names, optimizer._tutti.params)}
        grads, names = [], []
        for gi, group in enumerate(optimizer.param_groups):
            for pi, p in enumerate(group["params"]):
                if p.grad is not None:
                    grads.append(p.grad)
                    names.append(known.get(id(p), f"param_groups[{gi}][{pi}]"))
        stream = next((stream_of(g) for g in grads if g.is_cuda), 0)
        self._scaler.unscale_and_check(grads, names=names, groups=self._groups_for(optimizer),
                                       stream=stream)
        self._stage[id(optimizer)] = _UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """optimizer.step() unless the agreed check found NaN/Inf."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if self._stage.get(id(optimizer)) == _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if self._stage.get(id(optimizer), _READY) == _READY:
            self.unscale_(optimizer)
        result = None
        if not self._scaler.found_non_finite:
            with _no_second_sync(optimizer):
                result = optimizer.step(*args, **kwargs)
        self._stage[id(optimizer)] = _STEPPED
        return result

    def update(self, new_scale=None):
        """Ends the step: backs off after an agreed overflow, grows after
        growth_interval clean steps.  ``new_scale`` sets the scale directly
        and, as in torch, leaves the growth and hysteresis trackers as they
        were (the step still counts, and an agreed overflow still counts as
        skipped)."""
        if not self._enabled:
            return None
        self._handoff.searching = False
        if new_scale is None:
            result = self._scaler.update()
            self._stage.clear()
            return result
        value = float(new_scale.item() if torch.is_tensor(new_scale) else new_scale)
        before = {k: v.copy() for k, v in self._scaler.state_dict().items()}
        result = self._scaler.update()  # ends the step: counters, found flag
        self._stage.clear()
        sd = self._scaler.state_dict()
        for tracker in ("growth_tracker", "hysteresis_tracker"):
            key = f"loss_scaler/{tracker}"
            sd[key][0] = before[key][0]
        sd["loss_scaler/scale"][0] = value
        self._scaler.load_state_dict(sd)
        return result

    @property
    def skipped_steps(self):
        return self._scaler.skipped_steps

    def state_dict(self):
        """The scaler's state (numpy copies), restorable bit-exactly."""
        return self._scaler.state_dict() if self._enabled else {}

    def load_state_dict(self, state_dict):
        """Accepts this class's state_dict(), or a torch GradScaler's
        ({"scale", "_growth_tracker", ...}) when migrating."""
        if not self._enabled:
            return
        if "scale" in state_dict:
            sd = self._scaler.state_dict()
            sd["loss_scaler/scale"][0] = float(state_dict["scale"])
            sd["loss_scaler/growth_tracker"][0] = int(state_dict.get("_growth_tracker", 0))
            state_dict = sd
        self._scaler.load_state_dict(state_dict)

