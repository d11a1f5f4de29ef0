"""Horovod's ``Compression`` namespace, backed by tutti's compressors.

``Compression.none`` and ``Compression.fp16`` behave as in Horovod; tutti
adds ``bf16``, ``topk``, ``powersgd``, ``onebit`` and ``auto``.  Passed to
``DistributedOptimizer``/``DistributedDataParallel``, a compression becomes a
C++ compressor that replaces each fused bucket's all-reduce (error feedback
and PowerSGD factors live in its state).  Call one to change its options:
``Compression.topk(ratio=0.05)``, ``Compression.powersgd(rank=2)``.
"""
import torch

from .. import compression as _compression

# Short option names -> CompressorOptions fields.
_ALIASES = {
    "ratio": "topk_ratio",
    "rank": "powersgd_rank",
    "start_step": "powersgd_start_step",
    "min_compression": "powersgd_min_compression",
    "chunk": "onebit_chunk",
    "probe_steps": "auto_probe_steps",
}


class Compressor:
    """A compression algorithm by name with its options."""

    def __init__(self, name, cast=None, **options):
        self.name = name
        self._cast = cast
        self.options = {_ALIASES.get(k, k): v for k, v in options.items()}

    def __call__(self, **options):
        """A copy with some options changed."""
        return Compressor(self.name, self._cast, **{**self.options, **options})

    def __repr__(self):
        opts = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"Compression.{self.name}({opts[2:]})" if opts else f"Compression.{self.name}"

    # Horovod's per-tensor interface (hvd.allreduce(..., compression=)).
    def compress(self, tensor):
        """(compressed tensor, context) for a single allreduce: a cast for
        fp16/bf16, the tensor itself for none."""
        if self.name == "none":
            return tensor, None
        if self._cast is None:
            raise ValueError(
                f"Compression.{self.name} compresses gradient buckets inside "
                "DistributedOptimizer/DistributedDataParallel; a single allreduce "
                "takes Compression.none, fp16 or bf16")
        if tensor.dtype.is_floating_point and tensor.dtype != self._cast:
            return tensor.to(self._cast), tensor.dtype
        return tensor, None

    def decompress(self, tensor, ctx):
        """The inverse of compress(): back to the original dtype."""
        return tensor if ctx is None else tensor.to(ctx)

    def make(self):
        """What the Reducer's ``compressor=`` takes: a new tutti compressor,
        or "none" (explicitly no compression)."""
        if self.name == "none":
            return "none"
        return _compression.make_compressor(self.name, **self.options)


class Compression:
    """Horovod-compatible compression choices."""

    none = Compressor("none")
    fp16 = Compressor("fp16", cast=torch.float16)
    bf16 = Compressor("bf16", cast=torch.bfloat16)
    topk = Compressor("topk")
    powersgd = Compressor("powersgd")
    onebit = Compressor("onebit")
    auto = Compressor("auto")


def as_compressor(compression):
    """The Reducer's ``compressor=`` for a Compression.* choice, a name
    ('fp16'), a tutti.Compressor, or None (the TUTTI_COMPRESSION setting)."""
    if compression is None:
        return None
    if isinstance(compression, str):
        return compression
    if isinstance(compression, Compressor):
        return compression.make()
    if isinstance(compression, _compression.Compressor):
        return compression
    raise TypeError(f"compression must be a Compression.* choice, got {compression!r}")
