"""Gradient compressors for :class:`tutti.Reducer` (``compressor=``).

A compressor replaces each fused bucket's all-reduce and returns the average,
bit-identical on every rank.  Its ``state_dict()`` (error-feedback residuals,
PowerSGD factors) is what a checkpoint must carry to resume exactly.
"""
from . import _C

Compressor = _C.Compressor

#: The names tutti's C++ factory accepts.
NAMES = ("none", "fp16", "bf16", "topk", "powersgd", "onebit", "auto")


def available():
    """True when this build includes the compression layer's algorithms."""
    return hasattr(_C, "make_compressor")


def make_compressor(name, **options):
    """A new compressor by name (see :data:`NAMES`).  Options (defaults from
    the TUTTI_* settings): ``topk_ratio``, ``powersgd_rank``,
    ``powersgd_start_step``, ``powersgd_min_compression``, ``onebit_chunk``,
    ``auto_probe_steps``, ``seed``."""
    if not available():
        raise _C.UnsupportedError(
            f"rank {_C.rank() if _C.initialized() else 0}: compressor '{name}': "
            "this build of tutti has no compression algorithms "
            "(the compression layer has not been merged)")
    return _C.make_compressor(name, **options)


__all__ = ["Compressor", "NAMES", "available", "make_compressor"]
