"""Framework-agnostic array helpers: allocate outputs in the caller's
framework without tutti depending on any of them at build time."""


def _module_of(x):
    return type(x).__module__.split(".")[0]


def framework(x):
    """'numpy', 'torch', 'cupy', 'jax' or the producing module's name."""
    mod = _module_of(x)
    if mod in ("jaxlib", "jax"):
        return "jax"
    return mod


def is_immutable(x):
    """JAX arrays cannot be written in place."""
    return framework(x) == "jax"


def empty(shape, like):
    """An uninitialised contiguous array of `shape` with like's dtype and
    device, from like's framework."""
    fw = framework(like)
    if fw == "torch":
        import torch
        return torch.empty(tuple(shape), dtype=like.dtype, device=like.device)
    if fw == "cupy":
        import cupy
        with cupy.cuda.Device(like.device.id):
            return cupy.empty(tuple(shape), dtype=like.dtype)
    if fw == "jax":
        # Filled through numpy, then handed to JAX (see from_numpy_like).
        import numpy
        return numpy.empty(tuple(shape), dtype=numpy.dtype(like.dtype))
    import numpy
    return numpy.empty(tuple(shape), dtype=like.dtype)


def empty_like(x):
    return empty(tuple(x.shape), x)


def copy(x):
    """A contiguous, writable copy in x's framework (numpy for JAX inputs)."""
    fw = framework(x)
    if fw == "torch":
        return x.detach().clone().contiguous()
    if fw == "cupy":
        import cupy
        return cupy.ascontiguousarray(x.copy())
    import numpy
    return numpy.array(x, copy=True, order="C")


def finish(result, like):
    """Converts a numpy result back to like's framework where needed (JAX)."""
    if framework(like) == "jax":
        import jax.numpy as jnp
        return jnp.asarray(result)
    return result
