"""Small helpers shared by the tutti.torch modules."""
import weakref

import torch

from .. import _C


def require_init(call):
    """Raises, naming the Python call (``hvd.allreduce(...)``), when
    hvd.init() has not run: Horovod's users read "call hvd.init() first",
    not the C++ ``tutti::init()``."""
    if not _C.initialized():
        raise _C.InvalidArgumentError(
            f"{call}: tutti.torch is not initialised: call hvd.init() first")


def group_or_world(process_set, call="hvd"):
    """A tutti.ProcessGroup: the world for None, the group of a Horovod
    ``hvd.ProcessSet`` (InvalidArgumentError on a rank outside it), a
    tutti.ProcessGroup as given (``call`` names the Python call in errors)."""
    if process_set is None:
        require_init(call)
        return _C.world()
    group_of = getattr(process_set, "_hvd_group", None)
    return group_of(call) if group_of is not None else process_set


def group_root(process_set, root_rank, call):
    """root_rank in the group's numbering: a ProcessSet takes world ranks
    (Horovod's convention), a tutti.ProcessGroup its own ranks."""
    to_set = getattr(process_set, "_set_rank_of", None)
    return to_set(root_rank, call) if to_set is not None else root_rank


def stream_of(tensor):
    """The cudaStream_t (as an int) tutti should order a CUDA tensor's work
    on: the current stream of its device.  0 for host tensors."""
    if tensor.is_cuda:
        return torch.cuda.current_stream(tensor.device).cuda_stream
    return 0


def export(tensor):
    """The tensor as tutti sees it: torch refuses DLPack export of tensors
    that require grad; .detach() shares the memory."""
    return tensor.detach() if tensor.requires_grad else tensor


# dtypes tutti's core lacks, moved bit for bit as a same-size dtype it has
# (a view: no copy, in-place operations write through).
_MOVE_AS = {torch.bool: torch.uint8, torch.int16: torch.float16}


def wire(tensor):
    """``tensor`` (already exported) as a dtype tutti moves: bool as uint8,
    int16 as float16 bits.  For data movement only (broadcast, allgather,
    alltoall); reductions go through reduce_in()."""
    as_dtype = _MOVE_AS.get(tensor.dtype)
    return tensor if as_dtype is None else tensor.view(as_dtype)


_MOVE_CODE = {torch.bool: 1, torch.int16: 2}


def agree_moved_dtype(group, tensor, call):
    """Before moving a bool or int16 tensor as a view: every rank must have
    the same dtype, which the view hides from tutti's agreement check (an
    int16 on one rank and a float16 on another would both travel as
    float16 and the bits would be misread without an error).  One 2-int64
    all-reduce, only for these dtypes; a rank that moves a native dtype
    meanwhile issues a different collective, which the agreement check
    refuses (MismatchError on both)."""
    code = _MOVE_CODE.get(tensor.dtype)
    if code is None or group.size == 1:
        return
    seen = torch.tensor([code, -code], dtype=torch.int64)
    group.allreduce(seen, op="max", name=f"{call} {tensor.dtype} check")
    if int(seen[0]) != code or -int(seen[1]) != code:
        names = {c: str(d) for d, c in _MOVE_CODE.items()}
        raise error(_C.MismatchError,
                    f"{call}: ranks passed different dtypes ({names[-int(seen[1])]} and "
                    f"{names[int(seen[0])]}); this rank has {tensor.dtype}")


def reduce_in(tensor, op, call):
    """(tensor to reduce, op, dtype to cast the result back to or None) for
    dtypes tutti cannot reduce natively.  int16 is widened to int32 (exact;
    the cast back wraps as int16 arithmetic would).  bool reduces as uint8
    0/1 with Sum/Max as logical or and Min/Product as logical and (torch's
    bool arithmetic); Average of bools has no bool result and raises."""
    if tensor.dtype == torch.int16:
        return tensor.to(torch.int32), op, torch.int16
    if tensor.dtype == torch.bool:
        if op in (_C.ReduceOp.SUM, _C.ReduceOp.MAX):
            return tensor.to(torch.uint8), _C.ReduceOp.MAX, torch.bool
        if op in (_C.ReduceOp.MIN, _C.ReduceOp.PROD):
            return tensor.to(torch.uint8), _C.ReduceOp.MIN, torch.bool
        raise error(_C.InvalidArgumentError,
                    f"{call}: op={op} on a bool tensor has no bool result; "
                    "use op=hvd.Sum (logical or), hvd.Min (logical and) or "
                    "convert the tensor first")
    return tensor, op, None


def error(cls, message):
    """A tutti error raised from Python, with the rank prefix tutti's C++
    errors carry."""
    rank = _C.rank() if _C.initialized() else 0
    return cls(f"rank {rank}: {message}")


class WeakOwner:
    """A weak reference for tagging tensors with the live object that owns
    them (a parameter's GradSync): call it for the object, or None once it
    is gone.  Pickles (torch.save of a module, torch 2's Parameter state)
    and copies as None: the owner is a live process-group object, not
    model state."""

    __slots__ = ("_ref",)

    def __init__(self, owner):
        self._ref = weakref.ref(owner)

    def __call__(self):
        return self._ref()

    def __reduce__(self):
        return (type(None), ())


def tensors_in(obj):
    """The tensors in a forward's output (tensors, sequences, mappings)."""
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from tensors_in(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from tensors_in(o)


def graph_leaves(obj):
    """The leaf tensors (parameters) the autograd graph of the tensors in
    ``obj`` reaches: the variables of its AccumulateGrad nodes, and leaves
    that require grad returned as they are.  {id(tensor): tensor}."""
    stack, seen, reached = [], set(), {}
    for t in tensors_in(obj):
        if t.grad_fn is not None:
            stack.append(t.grad_fn)
        elif t.requires_grad:
            reached[id(t)] = t
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)  # an AccumulateGrad node
        if var is not None:
            reached[id(var)] = var
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return reached
