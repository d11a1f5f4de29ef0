"""Fused multi-tensor optimizer step on any DLPack tensors (numpy, PyTorch).

    states = [[torch.zeros_like(p), torch.zeros_like(p)] for p in params]
    for t in range(1, steps + 1):
        tutti.optim.step(params, grads, states, kind="adamw", lr=1e-3,
                         weight_decay=0.01, step=t)

One pass updates every float32 parameter and its float32 state tensors in
place with torch.optim.{SGD,Adam,AdamW}'s single-tensor arithmetic
(``foreach=False``, ``amsgrad=False``): ``states[i]`` is ``[momentum_buffer]``
for SGD (may be ``[]``, or ``states`` None, without momentum) and ``[exp_avg, exp_avg_sq]`` for
Adam/AdamW, zero before step 1.  ``step`` is the 1-based number of this
update (Adam's bias correction; for SGD, step 1 initialises the momentum
buffer to the gradient as torch does).  Gradients may be float32, float16 or
bfloat16 and are multiplied by ``grad_scale`` first; ``model_copies[i]``
(float32/float16/bfloat16), when given, receives the rounded new parameter
in the same pass.  All tensors live on the host or on one CUDA device; CUDA
steps are enqueued on ``stream`` (a cudaStream_t as int, 0: the default
stream) without waiting.  See docs/optim.md.
"""
from typing import Any, Optional, Sequence, Tuple

from . import _C

KINDS = ("sgd", "adam", "adamw")


def num_states(kind: str) -> int:
    """State tensors per parameter: 1 for ``"sgd"``, 2 for ``"adam"``/``"adamw"``."""
    return int(_C.optim.num_states(kind))


def step(params: Sequence[Any], grads: Sequence[Any],
         states: Optional[Sequence[Sequence[Any]]], *,
         kind: str = "adam", lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
         eps: float = 1e-8, weight_decay: float = 0.0, momentum: float = 0.0,
         dampening: float = 0.0, nesterov: bool = False, maximize: bool = False,
         step: int = 1, grad_scale: float = 1.0,
         model_copies: Optional[Sequence[Any]] = None, stream: int = 0,
         names: Optional[Sequence[str]] = None) -> None:
    """One fused optimizer step; hyper-parameters as torch.optim's (float32
    values: pass floats representable in float32 for bit-identical results).
    Raises tutti.InvalidArgumentError naming the parameter index (and
    ``names[i]``) for mismatched element counts, dtypes, devices or state
    counts."""
    if kind not in KINDS:
        raise ValueError(f"tutti.optim.step: kind {kind!r} is not one of {KINDS}")
    beta1, beta2 = betas
    state_lists = [] if states is None else [list(s) for s in states]
    _C.optim.step(list(params), list(grads), state_lists, kind=kind, lr=lr,
                  momentum=momentum, dampening=dampening, nesterov=nesterov, beta1=beta1,
                  beta2=beta2, eps=eps, weight_decay=weight_decay, maximize=maximize,
                  step=step, grad_scale=grad_scale,
                  model_copies=None if model_copies is None else list(model_copies),
                  stream=stream, names=None if names is None else list(names))


__all__ = ["KINDS", "num_states", "step"]
