"""Functional collectives on the world group: out-of-place forms return a new
array of the caller's framework; trailing-underscore forms work in place."""
from . import _C
from . import _arrays


def _group(group):
    return group if group is not None else _C.world()


def _writable(tensor, what):
    if _arrays.is_immutable(tensor):
        raise _C.InvalidArgumentError(
            f"rank {_C.rank()}: {what}: JAX arrays are immutable; use the "
            "out-of-place form (it returns a new array)")


def allreduce_(tensor, op="sum", group=None, name="", async_op=False):
    """All-reduce `tensor` in place; returns a Work when async_op."""
    _writable(tensor, "allreduce_")
    return _group(group).allreduce(tensor, op=op, name=name, async_op=async_op)


def allreduce(tensor, op="sum", group=None, name=""):
    """A new array holding the all-reduced `tensor` (tensor is unchanged)."""
    out = _arrays.empty_like(tensor)
    _group(group).allreduce(tensor, op=op, out=out, name=name)
    return _arrays.finish(out, tensor)


def broadcast_(tensor, root=0, group=None, name="", async_op=False):
    """Broadcast `tensor` from `root` in place; returns a Work when async_op."""
    _writable(tensor, "broadcast_")
    return _group(group).broadcast(tensor, root=root, name=name, async_op=async_op)


def broadcast(tensor, root=0, group=None, name=""):
    """A new array holding root's `tensor`."""
    out = _arrays.copy(tensor)
    _group(group).broadcast(out, root=root, name=name)
    return _arrays.finish(out, tensor)


def allgather(tensor, group=None, name=""):
    """Concatenates every rank's tensor along dimension 0.  Ranks may pass
    different first dimensions (the other dimensions must agree)."""
    g = _group(group)
    rows = _arrays.empty((1,), _int64_like(tensor))
    rows[0] = tensor.shape[0] if len(tensor.shape) else 1
    counts_arr = _arrays.empty((g.size,), rows)
    g.allgather(rows, counts_arr, name=(name + "/rows") if name else "allgather rows")
    rows_per_rank = [int(c) for c in _to_list(counts_arr)]
    inner = 1
    for d in tensor.shape[1:]:
        inner *= int(d)
    out_shape = (sum(rows_per_rank),) + tuple(tensor.shape[1:])
    out = _arrays.empty(out_shape, tensor)
    g.allgatherv(tensor, out, [r * inner for r in rows_per_rank], name=name)
    return _arrays.finish(out, tensor)


def reduce_scatter(tensor, op="sum", group=None, name=""):
    """Reduces `tensor` (first dimension divisible by the group size) and
    returns this rank's block."""
    g = _group(group)
    n = tensor.shape[0]
    if n % g.size:
        raise _C.InvalidArgumentError(
            f"rank {g.rank}: reduce_scatter: first dimension {n} is not divisible "
            f"by the group size {g.size}")
    out = _arrays.empty((n // g.size,) + tuple(tensor.shape[1:]), tensor)
    g.reduce_scatter(tensor, out, op=op, name=name)
    return _arrays.finish(out, tensor)


def alltoall(tensor, group=None, name=""):
    """Block j of `tensor` (equal blocks of the flattened array) goes to
    rank j; returns the blocks received, in rank order."""
    out = _arrays.empty_like(tensor)
    _group(group).alltoall(tensor, out, name=name)
    return _arrays.finish(out, tensor)


def barrier(group=None):
    """Blocks until every rank of the group arrives."""
    _group(group).barrier()


def _int64_like(tensor):
    """A tiny int64 array on the host in tensor's framework (numpy for
    others), used for shape exchanges."""
    if _arrays.framework(tensor) == "torch":
        import torch
        return torch.empty(1, dtype=torch.int64)
    import numpy
    return numpy.empty(1, dtype=numpy.int64)


def _to_list(x):
    if hasattr(x, "tolist"):
        return x.tolist()
    return list(x)
