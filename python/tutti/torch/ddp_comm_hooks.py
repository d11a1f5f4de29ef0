"""Communication hooks for ``tutti.torch.DistributedDataParallel.
register_comm_hook`` that run tutti's collectives and compressors.

torch's hooks have the same names and contracts (``hook(state, bucket) ->
Future`` whose value is the bucket's average):

* ``allreduce_hook(group, bucket)``: the average (a tutti all-reduce, op
  Average, in the bucket's dtype).
* ``fp16_compress_hook(group, bucket)`` / ``bf16_compress_hook``: the bucket
  cast to float16/bfloat16 and divided by the group size, summed in that
  dtype, cast back (torch's recipe: division before the sum).
* ``compressor_hook(CompressorState(...), bucket)``: one of tutti's
  compressors (``Compression.topk/powersgd/onebit/fp16/bf16/auto``) per
  bucket, with its error-feedback residuals and PowerSGD factors in the
  state (``state.state_dict()`` for checkpoints), the Inf/NaN agreement of
  error-feedback compressors, and the AMP loss scale the gradients carry.
  ``PowerSGDState``/``powerSGD_hook`` take torch's PowerSGD arguments.

* ``hook_with_zero_step(hook, ddp, zero)`` /
  ``hook_with_zero_step_interleaved``: torch's ``ddp_zero_hook`` wrappers,
  ``hook`` plus the step of a ``ZeroRedundancyOptimizer(overlap_with_ddp=
  True)`` inside backward (_zero_overlap.py).

``group`` (the hooks' state): a tutti.ProcessGroup, an ``hvd.ProcessSet``,
or None for the DDP's own group.  The Futures these hooks return are
completed by the DDP (``bucket.defer``) before the next bucket's hook and
when backward ends; a custom hook may chain them with ``.then()``.
"""
import torch

from .. import _C
from ._util import error, export, group_or_world, stream_of
from .compression import Compression, Compressor, as_compressor


def _group(state, bucket):
    if state is None:
        return bucket.process_group
    return group_or_world(state, "ddp_comm_hooks")


def _allreduce_future(group, bucket, tensor, op, finish):
    """Starts ``tensor``'s all-reduce; the Future's value is
    ``finish(tensor)`` once the DDP completes it."""
    src = export(tensor)
    work = group.allreduce(src, op=op, name=f"ddp comm hook bucket{bucket.index()}",
                           async_op=True, stream=stream_of(src))
    fut = torch.futures.Future()

    def complete():
        work.wait()
        fut.set_result(finish(tensor))
    bucket.defer(fut, complete)
    return fut


def allreduce_hook(process_group, bucket):
    """The bucket's average over the group (torch's default behaviour)."""
    buf = bucket.buffer()
    return _allreduce_future(_group(process_group, bucket), bucket, buf,
                             _C.ReduceOp.AVG, lambda t: t)


def _cast_hook(dtype):
    def hook(process_group, bucket):
        group = _group(process_group, bucket)
        buf = bucket.buffer()
        low = buf.to(dtype).div_(group.size)

        def decompress(t):
            buf.copy_(t)
            return buf
        return _allreduce_future(group, bucket, low, _C.ReduceOp.SUM, decompress)
    return hook


fp16_compress_hook = _cast_hook(torch.float16)
fp16_compress_hook.__doc__ = ("The bucket cast to float16, divided by the group size, "
                              "summed, and cast back (torch's fp16_compress_hook).")
fp16_compress_hook.__qualname__ = "fp16_compress_hook"
bf16_compress_hook = _cast_hook(torch.bfloat16)
bf16_compress_hook.__doc__ = ("The bucket cast to bfloat16, divided by the group size, "
                              "summed, and cast back (torch's bf16_compress_hook).")
bf16_compress_hook.__qualname__ = "bf16_compress_hook"


class CompressorState:
    """State for :func:`compressor_hook`: one tutti compressor per bucket
    (made from ``compression``, a ``Compression.*`` choice or a name), each
    driven by a one-bucket tutti.Reducer over the bucket's gradients.

    ``process_group``: as the other hooks' state (None: the DDP's group).
    ``compressors``: {bucket index: tutti.Compressor}, filled at the first
    backward.  ``state_dict()``/``load_state_dict()``: every bucket's
    compressor and step counter, keyed "bucket<k>/..." (load after the first
    backward, or before it: a loaded state waits for its bucket)."""

    def __init__(self, compression, process_group=None):
        if not isinstance(compression, (str, Compressor)):
            raise TypeError("CompressorState: compression must be a Compression.* choice "
                            f"or a compressor name, got {compression!r}")
        self.compression = compression
        self.process_group = process_group
        self.compressors = {}
        self._reducers = {}
        self._loaded = {}

    def _reducer(self, bucket):
        k = bucket.index()
        r = self._reducers.get(k)
        if r is not None:
            return r
        group = _group(self.process_group, bucket)
        comp = as_compressor(self.compression)
        if isinstance(comp, str):
            comp = _C.make_compressor(comp)
        r = _C.Reducer(group, bucket_cap_mb=1e9, first_bucket_cap_mb=1e9, compressor=comp,
                       name=f"ddp comm hook bucket{k}", learn_bucket_order=False)
        for n, (p, g) in enumerate(zip(bucket.parameters(), bucket.gradients())):
            r.add_parameter(f"bucket{k}.{n}", export(p), g)
        r.build()
        self._reducers[k], self.compressors[k] = r, r.options["compressor"]
        if k in self._loaded:
            self._load(k, self._loaded.pop(k))
        return r

    def state_dict(self):
        out = {}
        for k, r in self._reducers.items():
            for name, v in r.state_dict().items():
                out[f"bucket{k}/reducer/{name}"] = v
            for name, v in self.compressors[k].state_dict().items():
                out[f"bucket{k}/compressor/{name}"] = v
        return out

    def load_state_dict(self, state_dict):
        by_bucket = {}
        for key, v in state_dict.items():
            head, _, rest = key.partition("/")
            by_bucket.setdefault(int(head[len("bucket"):]), {})[rest] = v
        for k, sd in by_bucket.items():
            if k in self._reducers:
                self._load(k, sd)
            else:
                self._loaded[k] = sd

    def _load(self, k, sd):
        part = {"reducer": {}, "compressor": {}}
        for key, v in sd.items():
            which, _, name = key.partition("/")
            part[which][name] = v
        self._reducers[k].load_state_dict(part["reducer"])
        self.compressors[k].load_state_dict(part["compressor"])


def compressor_hook(state, bucket):
    """Runs ``state``'s compressor for this bucket (a CompressorState): the
    bucket's gradients are replaced by the compressor's average in place."""
    r = state._reducer(bucket)
    if bucket.loss_scale is not None:
        scale = bucket.loss_scale
        r.set_gradient_scale(float(scale.item()) if torch.is_tensor(scale) else float(scale))
    grads = bucket.gradients()
    for n, g in enumerate(grads):
        r.grad_ready(n, stream_of(g))  # the last one launches the bucket
    fut = torch.futures.Future()
    buf = bucket.buffer()

    def complete():
        r.synchronize(stream_of(buf))
        fut.set_result(buf)
    bucket.defer(fut, complete)
    return fut


class PowerSGDState(CompressorState):
    """torch's ``PowerSGDState`` arguments over tutti's PowerSGD compressor:
    ``matrix_approximation_rank`` -> rank, ``start_powerSGD_iter`` -> the
    step compression starts (plain all-reduce before), ``min_compression_rate``
    -> the least compression worth it, ``random_seed`` -> the initial
    factors' seed.  Other torch arguments (``use_error_feedback``,
    ``warm_start``, ...) are accepted and ignored: tutti's PowerSGD always
    keeps error feedback and warm-starts its factors."""

    def __init__(self, process_group=None, matrix_approximation_rank=1,
                 start_powerSGD_iter=1000, min_compression_rate=2, random_seed=0,
                 **_ignored):
        super().__init__(Compression.powersgd(rank=matrix_approximation_rank,
                                              start_step=start_powerSGD_iter,
                                              min_compression=float(min_compression_rate),
                                              seed=random_seed),
                         process_group)


powerSGD_hook = compressor_hook


def _zero_hook(hook, ddp, zero, shard_buckets, interleaved, call):
    overlap = getattr(zero, "_overlap", None)
    if overlap is None:
        raise error(ValueError,
                    f"{call}: the ZeroRedundancyOptimizer must be constructed with "
                    "overlap_with_ddp=True to use this hook (as torch requires)")
    if not callable(hook):
        raise TypeError(f"{call}: hook must be callable, got {hook!r}")

    def hook_with_zero(state, bucket):
        overlap.check_scale(bucket)  # before any collective: every rank raises here
        return overlap.on_bucket(bucket, hook(state, bucket), interleaved)
    hook_with_zero.__qualname__ = f"{call.partition('(')[0]}({_hook_name(hook)})"
    overlap.bind(ddp, hook_with_zero, shard_buckets, call)
    return hook_with_zero


def _hook_name(hook):
    return getattr(hook, "__qualname__", None) or repr(hook)


def hook_with_zero_step(hook, ddp, zero, shard_buckets=False):
    """torch's ``ddp_zero_hook.hook_with_zero_step``: ``hook`` (e.g.
    ``allreduce_hook``) plus the step of ``zero``, a
    ``ZeroRedundancyOptimizer(..., overlap_with_ddp=True)`` over ``ddp``'s
    parameters.  Register it with ``ddp.register_comm_hook(state, ...)``.
    After the warm-up passes (2; 3 with ``static_graph=True``: only
    ``hook``), once the last bucket's all-reduce completed, each rank steps
    the buckets it owns (bucket i: rank i mod W; ``shard_buckets=True``
    splits buckets over ranks, torch's rule) and the owners broadcast them;
    backward returns with the step done.  The backward computation runs
    uninterrupted, the step follows it (torch: preferable when communication
    is slow compared to computation)."""
    return _zero_hook(hook, ddp, zero, shard_buckets, False, "hook_with_zero_step()")


def hook_with_zero_step_interleaved(hook, ddp, zero, shard_buckets=False):
    """torch's ``hook_with_zero_step_interleaved``: as ``hook_with_zero_step``,
    but each bucket's step and broadcast run as soon as that bucket's
    all-reduce completed (a continuation of its Future, which tutti's DDP
    completes before the next bucket's hook), interleaving the optimizer
    with the rest of backward (torch: preferable when communication is fast
    compared to computation)."""
    return _zero_hook(hook, ddp, zero, shard_buckets, True,
                      "hook_with_zero_step_interleaved()")
