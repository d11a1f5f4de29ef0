"""Megatron-style tensor parallelism on a :class:`tutti.ProcessMesh`.

Region operators come in forward/backward pairs that write into
caller-provided outputs (``copy_to_tp_forward(mesh, x, out)``); the layers
own their parameter shards (``layer.weight`` is a zero-copy
:class:`tutti.TensorView`; ``torch.from_dlpack(layer.weight)`` shares it).
There is no autograd here: ``tutti.torch.tensor_parallel`` wraps these in
``torch.autograd.Function``s.  Every rank of the TP group makes the same calls
in the same order (they issue collectives).
"""
from ._C import ProcessMesh  # noqa: F401
from ._C.tensor_parallel import (  # noqa: F401  (the public API)
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelLinear,
    VocabParallelCrossEntropy,
    VocabParallelEmbedding,
    allreduce_sequence_parallel_grads,
    copy_to_tp_backward,
    copy_to_tp_forward,
    gather_from_sequence_parallel_backward,
    gather_from_sequence_parallel_forward,
    gather_from_tp_backward,
    gather_from_tp_forward,
    grad_norm_squared,
    reduce_from_tp_backward,
    reduce_from_tp_forward,
    reduce_scatter_to_sequence_parallel_backward,
    reduce_scatter_to_sequence_parallel_forward,
    scatter_to_sequence_parallel_backward,
    scatter_to_sequence_parallel_forward,
    scatter_to_tp_backward,
    scatter_to_tp_forward,
)

#: Names of the region operators; each has ``<name>_forward`` and
#: ``<name>_backward`` taking ``(mesh, input, output, *, name="", stream=0)``.
REGIONS = ("copy_to_tp", "reduce_from_tp", "gather_from_tp", "scatter_to_tp",
           "gather_from_sequence_parallel", "reduce_scatter_to_sequence_parallel",
           "scatter_to_sequence_parallel")

__all__ = [
    "ProcessMesh",
    "REGIONS",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TensorParallelLinear",
    "VocabParallelCrossEntropy",
    "VocabParallelEmbedding",
    "allreduce_sequence_parallel_grads",
    "copy_to_tp_backward",
    "copy_to_tp_forward",
    "gather_from_sequence_parallel_backward",
    "gather_from_sequence_parallel_forward",
    "gather_from_tp_backward",
    "gather_from_tp_forward",
    "grad_norm_squared",
    "reduce_from_tp_backward",
    "reduce_from_tp_forward",
    "reduce_scatter_to_sequence_parallel_backward",
    "reduce_scatter_to_sequence_parallel_forward",
    "scatter_to_sequence_parallel_backward",
    "scatter_to_sequence_parallel_forward",
    "scatter_to_tp_backward",
    "scatter_to_tp_forward",
]
