"""Tensor parallelism for torch: autograd Functions over tutti's region
operators and nn.Modules over its parallel layers (Megatron-LM style).

Region functions (``copy_to_tp(x, mesh)``, ``gather_from_tp``, ...) call
tutti's forward and, in backward, its conjugate.  The layers own their
parameter shards in C++; each ``nn.Parameter`` shares that memory
(``torch.from_dlpack``), so optimizers update what the C++ GEMMs read.
Build a layer on its final device and dtype (``.to()``/``.half()`` would
replace the parameter storage the C++ layer reads).  Backward asks the layer
for this call's weight gradient and returns it to autograd, so ``.grad``
accumulation, hooks and DistributedOptimizer work as for any module (one
extra copy of the weight gradient per call).

Parameters carry their sharding: ``p.tutti_shard`` ({global_shape, dim,
offset, group, flat}) and ``p.tp_replicated``.  Every rank of the TP group
runs the same forward/backward calls in the same order (they communicate).
"""
import functools
import weakref

import torch

from .. import _C
from ..tensor_parallel import REGIONS
from ._util import error, export, stream_of

_tp = _C.tensor_parallel


def _shape_rule(region):
    """Output shape of a region's forward from its input shape and tp_size."""
    def last(scale):
        return lambda s, p: s[:-1] + (scale(s[-1], p),)

    def first(scale):
        return lambda s, p: (scale(s[0], p),) + s[1:]

    rules = {
        "copy_to_tp": lambda s, p: s,
        "reduce_from_tp": lambda s, p: s,
        "gather_from_tp": last(lambda n, p: n * p),
        "scatter_to_tp": last(_split),
        "gather_from_sequence_parallel": first(lambda n, p: n * p),
        "reduce_scatter_to_sequence_parallel": first(_split),
        "scatter_to_sequence_parallel": first(_split),
    }
    return rules[region]


def _split(n, p):
    """n / p for an output shape.  Sizes p does not divide are left to the C++
    call to refuse: its errors fail fast across the TP group (a Python raise
    here, on one rank only, would leave the peers waiting in the collective)."""
    return n // p


def _make_region(region):
    forward_op = getattr(_tp, region + "_forward")
    backward_op = getattr(_tp, region + "_backward")
    rule = _shape_rule(region)

    class Region(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, mesh, name):
            x = export(x).contiguous()
            shape = tuple(x.shape)
            ctx.mesh, ctx.name, ctx.shape = mesh, name, shape
            out = x.new_empty(rule(shape, mesh.tp_size))
            forward_op(mesh, x, out, name=name, stream=stream_of(x))
            return out

        @staticmethod
        def backward(ctx, grad):
            grad = grad.contiguous()
            grad_in = grad.new_empty(ctx.shape)
            backward_op(ctx.mesh, grad, grad_in, name=ctx.name, stream=stream_of(grad))
            return grad_in, None, None

    Region.__name__ = Region.__qualname__ = "".join(w.title() for w in region.split("_"))

    def apply(x, mesh, name=""):
        return Region.apply(x, mesh, name)

    apply.__name__ = region
    apply.__doc__ = (f"{region}(x, mesh, name=''): tutti's {region} region as a "
                     "differentiable function over mesh's TP group.")
    return apply


for _region in REGIONS:
    globals()[_region] = _make_region(_region)
del _region


def _share(view, tp_replicated, shard):
    """An nn.Parameter over memory a tutti layer owns."""
    p = torch.nn.Parameter(torch.from_dlpack(view))
    p.tutti_shard = shard
    p.tp_replicated = tp_replicated
    return p


def _layer_params(module, layer):
    for info in layer.parameters():
        attr = info["name"].rsplit(".", 1)[-1]
        setattr(module, attr, _share(info["value"], info["tp_replicated"], info["shard"]))


class _LayerFn(torch.autograd.Function):
    """Forward/backward of a tutti layer; weight gradients go to autograd."""

    @staticmethod
    def forward(ctx, x, layer, out_shape, *params):
        x = export(x).contiguous()
        out = x.new_empty(out_shape) if x.is_floating_point() else params[0].new_empty(out_shape)
        layer.forward(x, out)
        ctx.layer = layer
        ctx.save_for_backward(x)
        ctx.nparams = len(params)
        return out

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        layer = ctx.layer
        grad = grad.contiguous()
        layer.zero_grad()
        if isinstance(layer, _tp.VocabParallelEmbedding):
            layer.backward(x, grad)
            grad_x = None
        else:
            grad_x = torch.empty_like(x) if ctx.needs_input_grad[0] else None
            layer.backward(x, grad, grad_x)
        grads = [torch.from_dlpack(layer.weight_grad).clone()]
        if ctx.nparams > 1:
            grads.append(torch.from_dlpack(layer.bias_grad).clone())
        return (grad_x, None, None) + tuple(grads)


class _TPModule(torch.nn.Module):
    def __init__(self, layer, mesh, seed):
        super().__init__()
        if seed is not None:
            layer.init_from_seed(seed)
        self.layer = layer
        self.mesh = mesh
        _layer_params(self, layer)
        if not hasattr(self, "bias"):
            self.bias = None

    def _params(self):
        return [p for p in (self.weight, getattr(self, "bias", None)) if p is not None]


def _layer_kwargs(dtype, device):
    return dict(dtype=dtype, device=str(device),
                stream=stream_of(torch.empty(0, device=device)))


class ColumnParallelLinear(_TPModule):
    """Y = X W^T + b with W [out, in] split by output features over the TP
    group.  ``gather_output``: the output is the full [..., out] (else this
    rank's [..., out/p], the input a RowParallelLinear expects)."""

    def __init__(self, in_features, out_features, mesh, bias=True, gather_output=True,
                 sequence_parallel=False, dtype=torch.float32, device="cpu",
                 name="column_parallel_linear", seed=None):
        layer = _tp.ColumnParallelLinear(mesh, in_features, out_features, name=name,
                                         bias=bias, gather_output=gather_output,
                                         sequence_parallel=sequence_parallel,
                                         **_layer_kwargs(dtype, device))
        super().__init__(layer, mesh, seed)

    def forward(self, x):
        """x [..., in] (sequence parallel: [s/p, ..., in]) -> the layer's output."""
        p = self.mesh.tp_size
        s = tuple(x.shape)
        out = s[:-1] + (self.layer.out_features if self.layer.gather_output
                        else self.layer.out_features_per_rank,)
        if self.layer.sequence_parallel:
            out = (s[0] * p,) + out[1:]
        return _LayerFn.apply(x, self.layer, out, *self._params())


class RowParallelLinear(_TPModule):
    """Y = X W^T + b with W split by input features; the partial products are
    summed over the TP group and b (replicated) is added once.
    ``input_is_parallel``: the input is this rank's [..., in/p] slice."""

    def __init__(self, in_features, out_features, mesh, bias=True, input_is_parallel=False,
                 sequence_parallel=False, dtype=torch.float32, device="cpu",
                 name="row_parallel_linear", seed=None):
        layer = _tp.RowParallelLinear(mesh, in_features, out_features, name=name, bias=bias,
                                      input_is_parallel=input_is_parallel,
                                      sequence_parallel=sequence_parallel,
                                      **_layer_kwargs(dtype, device))
        super().__init__(layer, mesh, seed)

    def forward(self, x):
        """x [..., in/p] (input_is_parallel) or [..., in] -> [..., out]."""
        s = tuple(x.shape)
        out = s[:-1] + (self.layer.out_features,)
        if self.layer.sequence_parallel:
            out = (_split(s[0], self.mesh.tp_size),) + out[1:]
        return _LayerFn.apply(x, self.layer, out, *self._params())


class VocabParallelEmbedding(_TPModule):
    """An embedding table split by vocabulary rows over the TP group."""

    def __init__(self, num_embeddings, embedding_dim, mesh, sequence_parallel=False,
                 dtype=torch.float32, device="cpu", name="vocab_parallel_embedding", seed=None):
        layer = _tp.VocabParallelEmbedding(mesh, num_embeddings, embedding_dim, name=name,
                                           sequence_parallel=sequence_parallel,
                                           **_layer_kwargs(dtype, device))
        super().__init__(layer, mesh, seed)
        self.embedding_dim = embedding_dim
        self.sequence_parallel = sequence_parallel

    def forward(self, ids):
        """ids [...] (int32/int64, the same on every TP rank) -> [..., dim]."""
        s = tuple(ids.shape)
        if self.sequence_parallel:
            s = (_split(s[0], self.mesh.tp_size),) + s[1:]
        return _LayerFn.apply(ids, self.layer, s + (self.embedding_dim,), self.weight)


class _CrossEntropyFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, module, call):
        logits = export(logits).contiguous()
        targets = targets.contiguous()
        mean = torch.empty(1, dtype=torch.float32, device=logits.device)
        module.ce.forward(logits, targets, None, mean)
        ctx.save_for_backward(logits, targets)
        ctx.module, ctx.call = module, call
        return mean[0]

    @staticmethod
    def backward(ctx, grad):
        logits, targets = ctx.saved_tensors
        if ctx.module._calls != ctx.call:
            raise error(_C.InvalidArgumentError,
                        "VocabParallelCrossEntropy: backward of an earlier forward; the "
                        "layer keeps the statistics of its latest forward only (use one "
                        "module per loss that is alive at the same time)")
        grad_logits = torch.empty_like(logits)
        module = ctx.module
        module.ce.backward(logits, targets, grad_logits, float(grad))
        return grad_logits, None, None, None


class VocabParallelCrossEntropy(torch.nn.Module):
    """Mean softmax cross-entropy over logits whose vocabulary dimension is
    split over the TP group (the output of a ColumnParallelLinear without
    gather_output); no rank holds the full logits.  Returns a float32 scalar
    (the mean over targets != ignore_index).  Backward reads the scalar
    gradient to the host (a sync on CUDA)."""

    def __init__(self, vocab_size, mesh, ignore_index=-100, device="cpu",
                 name="vocab_parallel_cross_entropy"):
        super().__init__()
        self.ce = _tp.VocabParallelCrossEntropy(
            mesh, vocab_size, name=name, ignore_index=ignore_index,
            stream=stream_of(torch.empty(0, device=device)))
        self._calls = 0

    def forward(self, logits, targets):
        """logits [..., V/p] (this rank's vocabulary slice), targets [...] -> mean loss."""
        self._calls += 1
        return _CrossEntropyFn.apply(logits, targets, self, self._calls)


def _note_backward(param_ref, grad):
    p = param_ref()
    if p is not None:
        p._tutti_sp_pending = True


def mark_sequence_parallel(*params):
    """Mark parameters in the sequence-parallel region that are not TP-sharded
    (LayerNorm weight and bias, any parameter applied to [s/p, b, h]
    activations): each TP rank's gradient covers only its sequence slice.
    Sets Megatron's ``p.sequence_parallel = True`` (and ``p.tp_replicated``)
    and a gradient hook that notes each backward, so that
    :func:`clip_grad_norm_` refuses their gradients until
    :func:`allreduce_sequence_parallel_grads` has summed them.  Returns the
    parameters."""
    for p in params:
        if not isinstance(p, torch.nn.Parameter):
            raise error(_C.InvalidArgumentError,
                        f"mark_sequence_parallel: expected nn.Parameter, got {type(p).__name__}")
        if getattr(p, "tutti_shard", None) is not None and not p.tp_replicated:
            raise error(_C.InvalidArgumentError,
                        "mark_sequence_parallel: a TP-sharded parameter "
                        f"{tuple(p.shape)} has complete gradients already")
        p.sequence_parallel = True
        p.tp_replicated = True
        if not getattr(p, "_tutti_sp_hooked", False):
            p._tutti_sp_hooked = True
            p._tutti_sp_pending = False
            p.register_hook(functools.partial(_note_backward, weakref.ref(p)))
    return params


def _sp_params(parameters):
    if isinstance(parameters, torch.nn.Module):
        parameters = parameters.parameters()
    elif isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    return [p for p in parameters
            if getattr(p, "sequence_parallel", False) and p.grad is not None]


def allreduce_sequence_parallel_grads(parameters, mesh):
    """Sum the gradients of the sequence-parallel parameters among
    ``parameters`` (a module or an iterable; those with
    ``p.sequence_parallel``, see :func:`mark_sequence_parallel`) in place over
    mesh's TP group, as Megatron's finalize step does for LayerNorm
    gradients.  Call it once per optimizer step, after the last micro-batch's
    backward and before clipping and ``step()`` (gradients accumulated over
    micro-batches are partial sums; reducing after each would count earlier
    micro-batches tp_size times).  Order relative to data-parallel averaging
    does not matter.  One all-reduce per (dtype, device), coalesced.
    Collective over the TP group: every TP rank passes the same model."""
    params = _sp_params(parameters)
    buckets = {}
    for p in params:
        buckets.setdefault((p.grad.dtype, p.grad.device), []).append(p)
    for group in buckets.values():
        grads = [p.grad for p in group]
        flat = torch.cat([g.reshape(-1) for g in grads])
        _tp.allreduce_sequence_parallel_grads(mesh, [flat], stream=stream_of(flat))
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    for p in params:
        p._tutti_sp_pending = False


def clip_grad_norm_(parameters, max_norm, mesh, norm_type=2.0, error_if_nonfinite=False):
    """torch.nn.utils.clip_grad_norm_ for a tensor-parallel model: the norm of
    the whole model replica, combining shards over the TP group and counting
    replicated parameters (``p.tp_replicated``; parameters that are not tutti
    TP shards count as replicated) once.  Collective over the TP group.
    Sequence-parallel parameters (:func:`mark_sequence_parallel`) count once
    after :func:`allreduce_sequence_parallel_grads`; before it their
    gradients are partial and clipping raises InvalidArgumentError rather
    than return a wrong norm.  Returns the total norm as a tensor."""
    params = [p for p in parameters if p.grad is not None]
    pending = [i for i, p in enumerate(params) if getattr(p, "_tutti_sp_pending", False)]
    if pending:
        shapes = ", ".join(f"#{i} {tuple(params[i].shape)}" for i in pending[:4])
        raise error(_C.InvalidArgumentError,
                    f"clip_grad_norm_: sequence-parallel parameters ({shapes}) hold "
                    "partial per-rank gradients since their last backward; call "
                    "tp.allreduce_sequence_parallel_grads(model, mesh) first")
    grads = [p.grad for p in params]
    replicated = [bool(getattr(p, "tp_replicated", True)) for p in params]
    stream = next((stream_of(g) for g in grads if g.is_cuda), 0)
    res = _C.amp.clip_grad_norm(grads, max_norm, norm_type=norm_type, group=mesh.tp_group,
                                replicated=replicated, error_if_nonfinite=error_if_nonfinite,
                                stream=stream)
    return torch.tensor(res.total_norm)


__all__ = list(REGIONS) + ["ColumnParallelLinear", "RowParallelLinear",
                           "VocabParallelEmbedding", "VocabParallelCrossEntropy",
                           "mark_sequence_parallel", "allreduce_sequence_parallel_grads",
                           "clip_grad_norm_"]
