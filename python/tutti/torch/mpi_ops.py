"""Horovod's collective operations on torch tensors, over tutti.

Out-of-place forms (``allreduce``, ``allgather``, ``broadcast``) are
differentiable like Horovod's: allreduce's gradient is the allreduce of the
output gradient with the same op, allgather's the averaged output gradient's
rows of this rank, broadcast's the averaged gradient on the root and zero
elsewhere.  In-place forms (trailing underscore) and ``*_async`` handles
work on any contiguous tensor; CUDA tensors are ordered on the current
stream.  ``process_set`` takes a :class:`tutti.ProcessGroup`.
"""
import torch

from .. import _C
from ._util import error, export, group_or_world, stream_of

Average = _C.ReduceOp.AVG
Sum = _C.ReduceOp.SUM
Min = _C.ReduceOp.MIN
Max = _C.ReduceOp.MAX
Product = _C.ReduceOp.PROD


class _AdasumOp:
    def __repr__(self):
        return "Adasum"


#: Horovod's Adasum reduction.  Not implemented by tutti: using it raises
#: UnsupportedError.
Adasum = _AdasumOp()


def _resolve_op(average, op):
    if op is not None and average is not None:
        raise ValueError("allreduce: pass either op= or the deprecated average=, not both")
    if op is None:
        op = Average if average is None or average else Sum
    if op is Adasum:
        raise error(_C.UnsupportedError, "allreduce: op=Adasum is not supported by tutti")
    return op


class Handle:
    """An operation in flight (Horovod's handle).  ``synchronize(handle)``
    waits and returns the output; ``poll(handle)`` tests."""

    def __init__(self, work, output, finish=None):
        self._work = work
        self._output = output
        self._finish = finish
        self._done = False

    def wait(self):
        """Blocks until done and returns the output tensor."""
        if not self._done:
            self._work.wait()
            if self._finish is not None:
                self._output = self._finish(self._output)
            self._done = True
        return self._output

    def poll(self):
        """True once the operation completed (raises its error if it failed)."""
        return self._done or self._work.test()


def synchronize(handle):
    """Waits for an async operation and returns its output tensor."""
    return handle.wait()


def poll(handle):
    """True once the async operation completed."""
    return handle.poll()


def _scale_(tensor, factor):
    if factor != 1.0:
        with torch.no_grad():
            tensor.mul_(factor)
    return tensor


# ---- allreduce ----------------------------------------------------------------

def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None):
    """Starts an in-place all-reduce; returns a Handle."""
    op = _resolve_op(average, op)
    _scale_(tensor, prescale_factor)
    work = group_or_world(process_set).allreduce(
        export(tensor), op=op, name=name or "", async_op=True, stream=stream_of(tensor))
    return Handle(work, tensor, lambda t: _scale_(t, postscale_factor))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """All-reduces ``tensor`` in place (default op: Average) and returns it."""
    return allreduce_async_(tensor, average, name, op, prescale_factor,
                            postscale_factor, process_set).wait()


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None):
    """Starts an out-of-place all-reduce; ``synchronize(handle)`` returns a new
    tensor (``tensor`` is unchanged)."""
    op = _resolve_op(average, op)
    src = export(tensor).contiguous()
    if prescale_factor != 1.0:
        src = src * prescale_factor
    out = torch.empty_like(src, memory_format=torch.contiguous_format)
    work = group_or_world(process_set).allreduce(
        src, op=op, out=out, name=name or "", async_op=True, stream=stream_of(src))
    return Handle(work, out, lambda t: _scale_(t, postscale_factor))


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, pre, post, process_set):
        ctx.args = (name, op, pre, post, process_set)
        return allreduce_async(tensor, None, name, op, pre, post, process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        name, op, pre, post, ps = ctx.args
        return (allreduce_async(grad, None, name and name + ".grad", op, pre, post, ps).wait(),
                None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=None, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """A new tensor holding the reduction of ``tensor`` over the group
    (default op: Average).  ``compression``: ``Compression.none``, ``fp16`` or
    ``bf16`` (per-tensor casts; the bucket compressors such as topk only work
    inside DistributedOptimizer / DistributedDataParallel).  Differentiable."""
    op = _resolve_op(average, op)
    if compression is not None:
        compressed, ctx = compression.compress(tensor)
    else:
        compressed, ctx = tensor, None
    if compressed.requires_grad and torch.is_grad_enabled():
        out = _AllreduceFn.apply(compressed, name, op, prescale_factor, postscale_factor,
                                 process_set)
    else:
        out = allreduce_async(compressed, None, name, op, prescale_factor,
                              postscale_factor, process_set).wait()
    return compression.decompress(out, ctx) if compression is not None else out


# ---- allgather ----------------------------------------------------------------

def _row_counts(tensor, group, name):
    """Every rank's first dimension (allgather of one int64)."""
    mine = torch.tensor([tensor.shape[0] if tensor.dim() else 1], dtype=torch.int64)
    every = torch.empty(group.size, dtype=torch.int64)
    group.allgather(mine, every, name=(name or "allgather") + " rows")
    return every.tolist()


def allgather_async(tensor, name=None, process_set=None):
    """Starts an allgather along dimension 0 (first dimensions may differ
    across ranks; the others must agree)."""
    g = group_or_world(process_set)
    src = export(tensor).contiguous()
    rows = _row_counts(src, g, name)
    inner = 1
    for d in src.shape[1:]:
        inner *= int(d)
    out = src.new_empty((sum(rows),) + tuple(src.shape[1:]))
    work = g.allgatherv(src, out, [r * inner for r in rows], name=name or "",
                        async_op=True, stream=stream_of(src))
    handle = Handle(work, out)
    handle.rows = rows
    return handle


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        handle = allgather_async(tensor, name, process_set)
        g = group_or_world(process_set)
        ctx.args = (name, process_set)
        ctx.begin = sum(handle.rows[:g.rank])
        ctx.count = handle.rows[g.rank]
        return handle.wait()

    @staticmethod
    def backward(ctx, grad):
        name, ps = ctx.args
        reduced = allreduce_async(grad, None, name and name + ".grad", Average, 1.0, 1.0,
                                  ps).wait()
        return reduced.narrow(0, ctx.begin, ctx.count), None, None


def allgather(tensor, name=None, process_set=None):
    """Concatenation of every rank's ``tensor`` along dimension 0, in rank
    order.  Differentiable."""
    if tensor.requires_grad and torch.is_grad_enabled():
        return _AllgatherFn.apply(tensor, name, process_set)
    return allgather_async(tensor, name, process_set).wait()


# ---- broadcast ----------------------------------------------------------------

def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """Starts an in-place broadcast from root_rank; returns a Handle."""
    work = group_or_world(process_set).broadcast(
        export(tensor), root=root_rank, name=name or "", async_op=True,
        stream=stream_of(tensor))
    return Handle(work, tensor)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """Overwrites ``tensor`` with root_rank's, in place; returns it."""
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """Starts an out-of-place broadcast; synchronize(handle) returns a new
    tensor holding root_rank's."""
    out = export(tensor).clone(memory_format=torch.contiguous_format)
    return broadcast_async_(out, root_rank, name, process_set)


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.args = (root_rank, name, process_set)
        return broadcast_async(tensor, root_rank, name, process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        root, name, ps = ctx.args
        reduced = allreduce_async(grad, None, name and name + ".grad", Average, 1.0, 1.0,
                                  ps).wait()
        if group_or_world(ps).rank != root:
            reduced.zero_()
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=None):
    """A new tensor holding root_rank's ``tensor``.  Differentiable."""
    if tensor.requires_grad and torch.is_grad_enabled():
        return _BroadcastFn.apply(tensor, root_rank, name, process_set)
    return broadcast_async(tensor, root_rank, name, process_set).wait()


# ---- alltoall, reducescatter, barrier -------------------------------------------

def alltoall(tensor, splits=None, name=None, process_set=None):
    """Sends ``splits[j]`` rows (dimension 0) of ``tensor`` to rank j and
    receives rank i's rows for this rank, in rank order.  Without splits the
    rows are divided equally.  Returns the output, and with ``splits`` also
    the received splits (Horovod's convention)."""
    g = group_or_world(process_set)
    src = export(tensor).contiguous()
    n = src.shape[0]
    if splits is None:
        if n % g.size:
            raise error(_C.InvalidArgumentError,
                        f"alltoall: {n} rows are not divisible by the group size {g.size}; "
                        "pass splits=")
        out = torch.empty_like(src)
        g.alltoall(src, out, name=name or "", stream=stream_of(src))
        return out
    send = torch.as_tensor(splits, dtype=torch.int64).reshape(-1).contiguous()
    if send.numel() != g.size or int(send.sum()) != n or bool((send < 0).any()):
        raise error(_C.InvalidArgumentError,
                    f"alltoall: splits {send.tolist()} must have one non-negative "
                    f"entry per rank ({g.size}) summing to the {n} rows")
    recv = torch.empty_like(send)
    g.alltoall(send, recv, name=(name or "alltoall") + " splits")
    # Pad every block to the largest one anywhere, exchange, then unpad.
    longest = torch.tensor([int(send.max()) if g.size else 0], dtype=torch.int64)
    g.allreduce(longest, op="max", name=(name or "alltoall") + " block")
    width = int(longest[0])
    inner = tuple(src.shape[1:])
    padded = src.new_zeros((g.size, width) + inner)
    offsets = [0] + torch.cumsum(send, 0).tolist()
    for j in range(g.size):
        padded[j, :int(send[j])] = src[offsets[j]:offsets[j + 1]]
    got = torch.empty_like(padded)
    g.alltoall(padded, got, name=name or "", stream=stream_of(src))
    out = torch.cat([got[i, :int(recv[i])] for i in range(g.size)]) if g.size else got
    return out, recv


def reducescatter(tensor, name=None, op=Average, process_set=None):
    """Reduces ``tensor`` over the group and returns this rank's block of
    dimension 0; when the rows do not divide evenly the first ranks get one
    more row (Horovod's split)."""
    op = _resolve_op(None, op)
    g = group_or_world(process_set)
    src = export(tensor).contiguous()
    n, p = src.shape[0], g.size
    rows = [n // p + (1 if r < n % p else 0) for r in range(p)]
    width = max(rows)
    if n % p == 0:
        padded = src
    else:
        padded = src.new_zeros((p * width,) + tuple(src.shape[1:]))
        begin = 0
        for r in range(p):
            padded[r * width:r * width + rows[r]] = src[begin:begin + rows[r]]
            begin += rows[r]
    out = src.new_empty((width,) + tuple(src.shape[1:]))
    g.reduce_scatter(padded, out, op=op, name=name or "", stream=stream_of(src))
    return out[:rows[g.rank]]


def barrier(process_set=None):
    """Blocks until every rank of the group arrives."""
    group_or_world(process_set).barrier()
