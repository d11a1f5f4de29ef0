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
from ._util import (agree_moved_dtype, error, export, group_or_world, group_root, reduce_in,
                    require_init, stream_of, wire)

Average = _C.ReduceOp.AVG
Sum = _C.ReduceOp.SUM
Min = _C.ReduceOp.MIN
Max = _C.ReduceOp.MAX
Product = _C.ReduceOp.PROD


class _AdasumOp:
    def __repr__(self):
        return "Adasum"


#: Horovod's Adasum reduction (Maleki et al., MLSys 2021), run by tutti's C++
#: ``adasum_allreduce``: pairs combine as (1 - a.b/2|a|^2) a + (1 - a.b/2|b|^2) b
#: in a recursive-doubling tree, with dot products per tensor.  Power-of-two
#: group sizes only; float tensors.  Blocking: ``*_async`` with Adasum runs
#: the reduction before returning a completed handle.  docs/python.md.
Adasum = _AdasumOp()


def _resolve_op(average, op, call="hvd.allreduce()"):
    if op is not None and average is not None:
        raise ValueError(f"{call}: pass either op= or the deprecated average=, not both")
    if op is None:
        op = Average if average is None or average else Sum
    return op


def _no_adasum(op, call):
    if op is Adasum:
        raise error(_C.UnsupportedError,
                    f"{call}: op=Adasum is an all-reduce; use hvd.allreduce() or "
                    "hvd.grouped_allreduce()")
    return op


class _Done:
    """The work of an operation that completed before its handle was made."""

    def wait(self):
        pass

    def test(self):
        return True


def _adasum_(tensors, name, process_set, call):
    """Adasum of the tensors (exported, contiguous, one dtype and device) in
    place, with one dot product per tensor."""
    g = group_or_world(process_set, call)
    if tensors:
        g.adasum_allreduce(tensors, name=name or "", stream=stream_of(tensors[0]))


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

def _allreduce_start(src, out, op, name, process_set, call):
    """Submits src (exported, contiguous) -> out (may be src); dtypes tutti
    cannot reduce go through a converted copy (_util.reduce_in).  Returns
    (work, finish(out) -> result) without the postscale."""
    g = group_or_world(process_set, call)
    wide, wide_op, back = reduce_in(src, op, call)
    if back is None:
        work = g.allreduce(src, op=op, out=None if out is src else out, name=name or "",
                           async_op=True, stream=stream_of(src))
        return work, lambda t: t
    work = g.allreduce(wide, op=wide_op, name=name or "", async_op=True,
                       stream=stream_of(wide))

    def finish(t):
        with torch.no_grad():
            t.copy_(wide.to(back))
        return t
    return work, finish


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None):
    """Starts an in-place all-reduce; returns a Handle."""
    op = _resolve_op(average, op, "hvd.allreduce_async_()")
    _scale_(tensor, prescale_factor)
    src = export(tensor)
    if op is Adasum:
        if not src.is_contiguous():
            raise error(_C.InvalidArgumentError,
                        "hvd.allreduce_async_(): op=Adasum needs a contiguous tensor")
        _adasum_([src], name, process_set, "hvd.allreduce_async_()")
        return Handle(_Done(), _scale_(tensor, postscale_factor))
    work, finish = _allreduce_start(src, src, op, name, process_set, "hvd.allreduce_async_()")
    return Handle(work, tensor, lambda t: _scale_(finish(t), postscale_factor))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """All-reduces ``tensor`` in place (default op: Average) and returns it."""
    return allreduce_async_(tensor, average, name, op, prescale_factor,
                            postscale_factor, process_set).wait()


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None):
    """Starts an out-of-place all-reduce; ``synchronize(handle)`` returns a new
    tensor (``tensor`` is unchanged)."""
    op = _resolve_op(average, op, "hvd.allreduce_async()")
    src = export(tensor).contiguous()
    if prescale_factor != 1.0:
        src = src * prescale_factor
    if op is Adasum:
        out = src.clone(memory_format=torch.contiguous_format)
        _adasum_([out], name, process_set, "hvd.allreduce_async()")
        return Handle(_Done(), _scale_(out, postscale_factor))
    out = torch.empty_like(src, memory_format=torch.contiguous_format)
    work, finish = _allreduce_start(src, out, op, name, process_set, "hvd.allreduce_async()")
    return Handle(work, out, lambda t: _scale_(finish(t), postscale_factor))


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
    require_init("hvd.allreduce()")
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


def _allgather_start(tensor, name, process_set, call):
    """(work, output, rows) of an allgather along dimension 0."""
    g = group_or_world(process_set, call)
    src = export(tensor).contiguous()
    rows = _row_counts(src, g, name)
    inner = 1
    for d in src.shape[1:]:
        inner *= int(d)
    out = src.new_empty((sum(rows),) + tuple(src.shape[1:]))
    agree_moved_dtype(g, src, call)
    work = g.allgatherv(wire(src), wire(out), [r * inner for r in rows], name=name or "",
                        async_op=True, stream=stream_of(src))
    return work, out, rows


def allgather_async(tensor, name=None, process_set=None):
    """Starts an allgather along dimension 0 (first dimensions may differ
    across ranks; the others must agree)."""
    work, out, rows = _allgather_start(tensor, name, process_set, "hvd.allgather()")
    handle = Handle(work, out)
    handle.rows = rows
    return handle


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        handle = allgather_async(tensor, name, process_set)
        g = group_or_world(process_set, "hvd.allgather()")
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
    require_init("hvd.allgather()")
    if tensor.requires_grad and torch.is_grad_enabled():
        return _AllgatherFn.apply(tensor, name, process_set)
    return allgather_async(tensor, name, process_set).wait()


# ---- broadcast ----------------------------------------------------------------

def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """Starts an in-place broadcast from root_rank; returns a Handle."""
    g = group_or_world(process_set, "hvd.broadcast()")
    root = group_root(process_set, root_rank, "hvd.broadcast()")
    agree_moved_dtype(g, tensor, "hvd.broadcast()")
    work = g.broadcast(wire(export(tensor)), root=root, name=name or "", async_op=True,
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
        if group_or_world(ps).rank != group_root(ps, root, "hvd.broadcast()"):
            reduced.zero_()
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=None):
    """A new tensor holding root_rank's ``tensor``.  Differentiable."""
    require_init("hvd.broadcast()")
    if tensor.requires_grad and torch.is_grad_enabled():
        return _BroadcastFn.apply(tensor, root_rank, name, process_set)
    return broadcast_async(tensor, root_rank, name, process_set).wait()


# ---- alltoall, reducescatter, barrier -------------------------------------------

def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """Starts an alltoall (see alltoall); ``synchronize(handle)`` returns
    ``(output, received_splits)`` as Horovod's does.  The splits exchange
    (a few int64s) happens before this returns; the data moves async."""
    call = "hvd.alltoall()"
    g = group_or_world(process_set, call)
    src = export(tensor).contiguous()
    n = src.shape[0] if src.dim() else 1
    if splits is None:
        if n % g.size:
            raise error(_C.InvalidArgumentError,
                        f"{call}: {n} rows are not divisible by the group size {g.size}; "
                        "pass splits=")
        send = torch.full((g.size,), n // g.size, dtype=torch.int64)
        out = torch.empty_like(src)
        agree_moved_dtype(g, src, call)
        work = g.alltoall(wire(src), wire(out), name=name or "", async_op=True,
                          stream=stream_of(src))
        return Handle(work, out, lambda t: (t, send.clone()))
    send = torch.as_tensor(splits, dtype=torch.int64).reshape(-1).contiguous()
    if send.numel() != g.size or int(send.sum()) != n or bool((send < 0).any()):
        raise error(_C.InvalidArgumentError,
                    f"{call}: splits {send.tolist()} must have one non-negative "
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
    agree_moved_dtype(g, src, call)
    work = g.alltoall(wire(padded), wire(got), name=name or "", async_op=True,
                      stream=stream_of(src))
    return Handle(work, got, lambda t: (torch.cat([t[i, :int(recv[i])] for i in range(g.size)]),
                                        recv))


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Sends ``splits[j]`` rows (dimension 0) of ``tensor`` to rank j and
    receives rank i's rows for this rank, in rank order.  Without splits the
    rows are divided equally.  Returns the output, and with ``splits`` also
    the received splits (Horovod's convention)."""
    out, recv = alltoall_async(tensor, splits, name, process_set).wait()
    return out if splits is None else (out, recv)


def _reducescatter_rows(n, p):
    """Horovod's split of n rows over p ranks: the first n % p get one more."""
    return [n // p + (1 if r < n % p else 0) for r in range(p)]


def _reducescatter_start(tensor, name, op, process_set, prescale_factor, call):
    """(work, padded output, finish) of one reducescatter."""
    g = group_or_world(process_set, call)
    src = export(tensor).contiguous()
    if prescale_factor != 1.0:
        src = src * prescale_factor
    wide, wide_op, back = reduce_in(src, op, call)
    n, p = wide.shape[0], g.size
    rows = _reducescatter_rows(n, p)
    width = max(rows)
    if n % p == 0:
        padded = wide
    else:
        padded = wide.new_zeros((p * width,) + tuple(wide.shape[1:]))
        begin = 0
        for r in range(p):
            padded[r * width:r * width + rows[r]] = wide[begin:begin + rows[r]]
            begin += rows[r]
    out = wide.new_empty((width,) + tuple(wide.shape[1:]))
    work = g.reduce_scatter(padded, out, op=wide_op, name=name or "", async_op=True,
                            stream=stream_of(src))
    mine = rows[g.rank]
    return work, out, lambda t: t[:mine] if back is None else t[:mine].to(back)


def reducescatter_async(tensor, name=None, op=Average, process_set=None,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter (see reducescatter); ``synchronize(handle)``
    returns this rank's block."""
    op = _no_adasum(_resolve_op(None, op, "hvd.reducescatter()"), "hvd.reducescatter()")
    work, out, finish = _reducescatter_start(tensor, name, op, process_set, prescale_factor,
                                             "hvd.reducescatter()")
    return Handle(work, out, lambda t: _scale_(finish(t), postscale_factor))


def reducescatter(tensor, name=None, op=Average, process_set=None, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces ``tensor`` over the group (default op: Average) and returns
    this rank's block of dimension 0; when the rows do not divide evenly the
    first ranks get one more row (Horovod's split)."""
    return reducescatter_async(tensor, name, op, process_set, prescale_factor,
                               postscale_factor).wait()


# ---- grouped operations (Horovod's grouped_*) --------------------------------------

class GroupHandle:
    """Handles of a grouped operation: ``synchronize(handle)`` returns the
    list of outputs in the order of the input tensors."""

    def __init__(self, parts, assemble=None):
        self._parts = parts
        self._assemble = assemble
        self._out = None

    def wait(self):
        if self._out is None:
            outs = [p.wait() for p in self._parts]
            self._out = self._assemble(outs) if self._assemble is not None else outs
        return self._out

    def poll(self):
        return all(p.poll() for p in self._parts)


def _grouped_allreduce_start(tensors, op, name, pre, post, process_set, in_place, call):
    """Fuses the tensors of each (dtype, device) into one buffer, one
    all-reduce per buffer; returns a GroupHandle whose outputs are new
    tensors (or, in place, the inputs overwritten)."""
    tensors = list(tensors)
    buckets = {}
    for k, t in enumerate(tensors):
        if not torch.is_tensor(t):
            raise TypeError(f"{call}: item {k} is a {type(t).__name__}, not a tensor")
        buckets.setdefault((t.dtype, t.device), []).append(k)
    results = [None] * len(tensors)
    parts = []
    if op is Adasum:  # one call per (dtype, device), one dot product per tensor
        for b, idx in enumerate(buckets.values()):
            work = [_scale_(export(tensors[k]).clone(memory_format=torch.contiguous_format),
                            pre) for k in idx]
            _adasum_(work, f"{name or 'grouped_allreduce'}.{b}", process_set, call)
            for k, w in zip(idx, work):
                _scale_(w, post)
                if in_place:
                    with torch.no_grad():
                        tensors[k].copy_(w)
                results[k] = tensors[k] if in_place else w
        return GroupHandle([], lambda _: list(results))
    for b, idx in enumerate(buckets.values()):
        flat = torch.cat([export(tensors[k]).reshape(-1) for k in idx])
        _scale_(flat, pre)
        work, finish = _allreduce_start(flat, flat, op, f"{name or 'grouped_allreduce'}.{b}",
                                        process_set, call)

        def unpack(t, idx=idx, finish=finish):
            t = _scale_(finish(t), post)
            offset = 0
            for k in idx:
                n = tensors[k].numel()
                piece = t[offset:offset + n].view(tensors[k].shape)
                if in_place:
                    with torch.no_grad():
                        tensors[k].copy_(piece)
                    piece = tensors[k]
                results[k] = piece
                offset += n
            return t
        parts.append(Handle(work, flat, unpack))
    return GroupHandle(parts, lambda _: list(results))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None):
    """Starts an all-reduce of every tensor of the list (default op:
    Average), fused per dtype and device; ``synchronize(handle)`` returns
    the list of new tensors."""
    op = _resolve_op(average, op, "hvd.grouped_allreduce_async()")
    return _grouped_allreduce_start(tensors, op, name, prescale_factor, postscale_factor,
                                    process_set, False, "hvd.grouped_allreduce_async()")


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None):
    """In-place grouped_allreduce_async: the tensors are overwritten."""
    op = _resolve_op(average, op, "hvd.grouped_allreduce_async_()")
    return _grouped_allreduce_start(tensors, op, name, prescale_factor, postscale_factor,
                                    process_set, True, "hvd.grouped_allreduce_async_()")


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None):
    """All-reduces every tensor of the list in place; returns the list."""
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                    postscale_factor, process_set).wait()


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """The all-reduce of every tensor of the list, as a list of new tensors
    (default op: Average).  Differentiable: with tensors that require grad
    each goes through allreduce()'s autograd."""
    tensors = list(tensors)
    op = _resolve_op(average, op, "hvd.grouped_allreduce()")
    if compression is not None or (torch.is_grad_enabled()
                                   and any(t.requires_grad for t in tensors)):
        outs = []
        for k, t in enumerate(tensors):
            outs.append(allreduce(t, None, f"{name or 'grouped_allreduce'}.{k}",
                                     compression, op, prescale_factor, postscale_factor,
                                     process_set))
        return outs
    return _grouped_allreduce_start(tensors, op, name, prescale_factor, postscale_factor,
                                    process_set, False, "hvd.grouped_allreduce()").wait()


def grouped_allgather_async(tensors, name=None, process_set=None):
    """Starts an allgather of every tensor of the list; ``synchronize``
    returns the list of gathered tensors."""
    return GroupHandle([
        Handle(*_allgather_start(t, f"{name or 'grouped_allgather'}.{k}", process_set,
                                 "hvd.grouped_allgather()")[:2])
        for k, t in enumerate(tensors)])


def grouped_allgather(tensors, name=None, process_set=None):
    """Every tensor of the list gathered along dimension 0 (as allgather)."""
    return grouped_allgather_async(tensors, name, process_set).wait()


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=None,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter of every tensor of the list; ``synchronize``
    returns the list of this rank's blocks."""
    call = "hvd.grouped_reducescatter()"
    op = _no_adasum(_resolve_op(None, op, call), call)
    parts = []
    for k, t in enumerate(tensors):
        work, out, finish = _reducescatter_start(
            t, f"{name or 'grouped_reducescatter'}.{k}", op, process_set, prescale_factor, call)
        parts.append(Handle(work, out, lambda o, f=finish: _scale_(f(o), postscale_factor)))
    return GroupHandle(parts)


def grouped_reducescatter(tensors, name=None, op=Average, process_set=None,
                          prescale_factor=1.0, postscale_factor=1.0):
    """The reducescatter of every tensor of the list (default op: Average)."""
    return grouped_reducescatter_async(tensors, name, op, process_set, prescale_factor,
                                       postscale_factor).wait()


def barrier(process_set=None):
    """Blocks until every rank of the group arrives."""
    group_or_world(process_set, "hvd.barrier()").barrier()


def join(device=-1, process_set=None):
    """Horovod's ``hvd.join()`` for uneven inputs: a rank that ran out of
    data calls it; it blocks until every rank of the set has called it and
    meanwhile takes part in the collectives the other ranks still run (on
    the set and on its same-membership splits, such as DDP's and
    DistributedOptimizer's reducer channels), contributing the reduction's
    identity (zeros for Sum/Average, one for Product, +inf/-inf for
    Min/Max).  An Average still divides by the full set size: joined ranks
    count as zeros (torch DDP Join's ``divide_by_initial_world_size``).
    Served: all-reduces, barriers and broadcasts from a rank that has not
    joined; any other collective raises MismatchError on the running ranks.
    Returns the rank that joined last (ties: the highest), the same on
    every rank.  ``device`` is accepted for Horovod's signature (tutti
    serves host tensors; a set with CUDA tensors raises UnsupportedError).
    docs/python.md, "Uneven inputs"."""
    del device
    return group_or_world(process_set, "hvd.join()").join()
