"""Mixed precision on any DLPack tensors (numpy, PyTorch, CuPy, JAX).

    scaler = tutti.amp.DynamicLossScaler()          # GradScaler defaults
    loss = loss * scaler.scale; backward()
    skip = scaler.unscale_and_check(grads, names=names, groups=[dp_group])
    if not skip:
        tutti.amp.clip_grad_norm(grads, 1.0)
        optimizer_step()
    scaler.update()

Every function takes a list of tensors that all live on the host or all on
one CUDA device; float32, float16 and bfloat16 may be mixed in one list.
Calls that may issue collectives (``groups``/``group`` arguments) must be
made by every rank of those groups in the same order.  The GIL is released
while tutti works.
"""
from ._C.amp import (  # noqa: F401  (the public API)
    ClipResult,
    DynamicLossScaler,
    NonFiniteReport,
    ScaleUpdate,
    check_finite,
    clip_grad_norm,
    copy_master_to_model,
    grad_norm,
    model_grads_to_master,
    multi_tensor_norms,
    scale_copy,
    unscale_and_check,
)

__all__ = [
    "ClipResult",
    "DynamicLossScaler",
    "NonFiniteReport",
    "ScaleUpdate",
    "check_finite",
    "clip_grad_norm",
    "copy_master_to_model",
    "grad_norm",
    "model_grads_to_master",
    "multi_tensor_norms",
    "scale_copy",
    "unscale_and_check",
]
