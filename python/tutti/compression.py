"""Gradient compressors for :class:`tutti.Reducer` (``compressor=``).

A compressor replaces each fused bucket's all-reduce and returns the average,
bit-identical on every rank.  Its ``state_dict()`` (error-feedback residuals,
PowerSGD factors) is what a checkpoint must carry to resume exactly.
"""
from . import _C

Compressor = _C.Compressor

#: The names tutti's C++ factory accepts.
NAMES = ("none", "fp16", "bf16", "topk", "powersgd", "onebit", "auto")


make_compressor = _C.make_compressor

__all__ = ["Compressor", "NAMES", "make_compressor"]
