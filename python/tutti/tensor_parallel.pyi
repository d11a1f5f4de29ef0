# Type stubs for tutti.tensor_parallel (tutti._C.tensor_parallel).
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from tutti._C import ProcessMesh as ProcessMesh
from tutti._C import Stateful, TensorView
from tutti._C import _Tensor as Tensor

REGIONS: Tuple[str, ...]

def _region(mesh: ProcessMesh, input: Tensor, output: Tensor, *, name: str = "",
            stream: int = 0) -> None: ...

copy_to_tp_forward = _region
copy_to_tp_backward = _region
reduce_from_tp_forward = _region
reduce_from_tp_backward = _region
gather_from_tp_forward = _region
gather_from_tp_backward = _region
scatter_to_tp_forward = _region
scatter_to_tp_backward = _region
gather_from_sequence_parallel_forward = _region
gather_from_sequence_parallel_backward = _region
reduce_scatter_to_sequence_parallel_forward = _region
reduce_scatter_to_sequence_parallel_backward = _region
scatter_to_sequence_parallel_forward = _region
scatter_to_sequence_parallel_backward = _region

class _LayerParams:
    @property
    def weight(self) -> TensorView: ...
    @property
    def weight_grad(self) -> TensorView: ...
    def zero_grad(self) -> None: ...
    def init_from_seed(self, seed: int) -> None: ...
    def parameters(self) -> List[Dict[str, Any]]: ...

class TensorParallelLinear(Stateful, _LayerParams):
    @property
    def bias(self) -> Optional[TensorView]: ...
    @property
    def bias_grad(self) -> Optional[TensorView]: ...
    def load_from_full(self, full_weight: Any, full_bias: Any = None) -> None: ...
    @property
    def in_features(self) -> int: ...
    @property
    def out_features(self) -> int: ...

class ColumnParallelLinear(TensorParallelLinear):
    def __init__(self, mesh: ProcessMesh, in_features: int, out_features: int, *,
                 name: str = "column_parallel_linear", bias: bool = True,
                 gather_output: bool = True, sequence_parallel: bool = False,
                 dtype: Any = "float32", device: Any = "cpu", stream: int = 0) -> None: ...
    @property
    def gather_output(self) -> bool: ...
    @property
    def out_features_per_rank(self) -> int: ...
    @property
    def sequence_parallel(self) -> bool: ...
    def forward(self, input: Tensor, output: Tensor) -> None: ...
    def backward(self, input: Tensor, grad_output: Tensor,
                 grad_input: Optional[Tensor] = None) -> None: ...

class RowParallelLinear(TensorParallelLinear):
    def __init__(self, mesh: ProcessMesh, in_features: int, out_features: int, *,
                 name: str = "row_parallel_linear", bias: bool = True,
                 input_is_parallel: bool = False, sequence_parallel: bool = False,
                 dtype: Any = "float32", device: Any = "cpu", stream: int = 0) -> None: ...
    @property
    def input_is_parallel(self) -> bool: ...
    @property
    def in_features_per_rank(self) -> int: ...
    @property
    def sequence_parallel(self) -> bool: ...
    def forward(self, input: Tensor, output: Tensor) -> None: ...
    def backward(self, input: Tensor, grad_output: Tensor,
                 grad_input: Optional[Tensor] = None) -> None: ...

class VocabParallelEmbedding(Stateful, _LayerParams):
    def __init__(self, mesh: ProcessMesh, vocab_size: int, embedding_dim: int, *,
                 name: str = "vocab_parallel_embedding", sequence_parallel: bool = False,
                 dtype: Any = "float32", device: Any = "cpu", stream: int = 0) -> None: ...
    def forward(self, ids: Tensor, output: Tensor) -> None: ...
    def backward(self, ids: Tensor, grad_output: Tensor) -> None: ...
    def load_from_full(self, full_weight: Any) -> None: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def vocab_start(self) -> int: ...
    @property
    def vocab_per_rank(self) -> int: ...

class VocabParallelCrossEntropy:
    def __init__(self, mesh: ProcessMesh, vocab_size: int, *,
                 name: str = "vocab_parallel_cross_entropy", ignore_index: int = -100,
                 stream: int = 0) -> None: ...
    def forward(self, logits: Tensor, targets: Tensor, losses: Optional[Tensor],
                mean_loss: Tensor) -> None: ...
    def backward(self, logits: Tensor, targets: Tensor, grad_logits: Tensor,
                 grad_scale: float = 1.0) -> None: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def vocab_start(self) -> int: ...
    @property
    def vocab_per_rank(self) -> int: ...

def grad_norm_squared(mesh: ProcessMesh,
                      layers: Sequence[Union[TensorParallelLinear, VocabParallelEmbedding]],
                      stream: int = 0) -> float: ...

def allreduce_sequence_parallel_grads(mesh: ProcessMesh, grads: Sequence[Any],
                                      stream: int = 0) -> None: ...

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
