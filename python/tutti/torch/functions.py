"""Horovod's helpers: broadcast model parameters, optimizer state and Python
objects from one rank; gather objects from all."""
import io
import pickle

import torch

from .. import _C
from ._util import (agree_moved_dtype, error, export, group_or_world, group_root, stream_of,
                    wire)

# Host tensors are broadcast in packed chunks of at most this many bytes.
_PACK_BYTES = 64 << 20


def _named_tensors(params):
    if isinstance(params, dict):
        return sorted(params.items())
    items = list(params)
    return [p if isinstance(p, tuple) else (None, p) for p in items]


def broadcast_tensors_(tensors, root_rank, process_set=None, name="broadcast"):
    """Overwrites every tensor with root_rank's, in place.  Host tensors of
    one dtype are packed into few broadcasts; CUDA tensors go one by one
    (NCCL, stream-ordered).  Every rank passes the same list (checked:
    a different dtype or size is a MismatchError on every rank).  bool and
    int16 tensors travel bit for bit as uint8 / float16 views."""
    call = f"hvd.{name}()" if name.isidentifier() else name
    g = group_or_world(process_set, call)
    root_rank = group_root(process_set, root_rank, call)
    host = {}
    for i, t in enumerate(tensors):
        if t.is_cuda:
            agree_moved_dtype(g, t, call)
            g.broadcast(wire(export(t)), root=root_rank, name=f"{name} #{i}",
                        stream=stream_of(t))
        else:
            host.setdefault(t.dtype, []).append(t)
    for dtype, ts in host.items():
        chunk, nbytes = [], 0
        for t in ts + [None]:
            if t is None or (chunk and nbytes + t.numel() * t.element_size() > _PACK_BYTES):
                flat = torch.cat([export(c).reshape(-1) for c in chunk])
                agree_moved_dtype(g, flat, call)
                g.broadcast(wire(flat), root=root_rank, name=f"{name} {dtype}")
                if g.rank != root_rank:
                    offset = 0
                    with torch.no_grad():
                        for c in chunk:
                            c.copy_(flat[offset:offset + c.numel()].view_as(c))
                            offset += c.numel()
                chunk, nbytes = [], 0
            if t is not None:
                chunk.append(t)
                nbytes += t.numel() * t.element_size()


def broadcast_parameters(params, root_rank, process_set=None):
    """Overwrites parameters with root_rank's: ``params`` is a state_dict
    (``model.state_dict()``, sorted by name as Horovod does) or an iterable of
    tensors or (name, tensor) pairs (``model.named_parameters()``)."""
    items = _named_tensors(params)
    for n, p in items:
        if not torch.is_tensor(p):
            raise TypeError(f"broadcast_parameters: '{n}' is a {type(p).__name__}, not a tensor")
    broadcast_tensors_([p for _, p in items], root_rank, process_set, "broadcast_parameters")


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """root_rank's ``obj`` (pickled) on every rank."""
    g = group_or_world(process_set, "hvd.broadcast_object()")
    root_rank = group_root(process_set, root_rank, "hvd.broadcast_object()")
    label = name or "broadcast_object"
    if g.rank == root_rank:
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        length = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    g.broadcast(length, root=root_rank, name=label + " size")
    if g.rank != root_rank:
        data = torch.empty(int(length[0]), dtype=torch.uint8)
    g.broadcast(data, root=root_rank, name=label)
    return obj if g.rank == root_rank else pickle.loads(data.numpy().tobytes())


def allgather_object(obj, name=None, process_set=None):
    """Every rank's ``obj``, as a list in rank order."""
    g = group_or_world(process_set, "hvd.allgather_object()")
    label = name or "allgather_object"
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    mine = torch.tensor([data.numel()], dtype=torch.int64)
    sizes = torch.empty(g.size, dtype=torch.int64)
    g.allgather(mine, sizes, name=label + " sizes")
    out = torch.empty(int(sizes.sum()), dtype=torch.uint8)
    g.allgatherv(data, out, sizes.tolist(), name=label)
    objs, offset = [], 0
    for n in sizes.tolist():
        objs.append(pickle.load(io.BytesIO(out[offset:offset + n].numpy().tobytes())))
        offset += n
    return objs


class _TensorSpec:
    """Stands for a tensor in a broadcast structure."""

    def __init__(self, t):
        self.shape, self.dtype, self.cuda = tuple(t.shape), t.dtype, t.is_cuda


def _strip(obj, found):
    if torch.is_tensor(obj):
        found.append(obj)
        return _TensorSpec(obj)
    if isinstance(obj, dict):
        return {k: _strip(v, found) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_strip(v, found) for v in obj)
    return obj


def _fill(obj, tensors):
    if isinstance(obj, _TensorSpec):
        return tensors.pop(0)
    if isinstance(obj, dict):
        return {k: _fill(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_fill(v, tensors) for v in obj)
    return obj


def broadcast_optimizer_state(optimizer, root_rank, process_set=None):
    """Makes every rank's optimizer state (hyper-parameters and per-parameter
    state such as momentum buffers) equal to root_rank's.  The structure
    travels pickled, the tensors by broadcast in place; other ranks then
    ``load_state_dict`` it.  Works whether or not the state exists yet."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    sharded = getattr(optimizer, "_tutti_broadcast_state", None)  # tutti.torch.zero
    if sharded is not None:
        return sharded(root_rank, process_set)
    g = group_or_world(process_set, "hvd.broadcast_optimizer_state()")
    found = []
    structure = _strip(optimizer.state_dict(), found)
    structure = broadcast_object(structure, root_rank, "broadcast_optimizer_state", process_set)
    root = group_root(process_set, root_rank, "hvd.broadcast_optimizer_state()")
    if g.rank == root:
        tensors = found
    else:
        specs = []
        _strip_specs(structure, specs)
        device = _first_param_device(optimizer) if any(s.cuda for s in specs) else "cpu"
        tensors = [torch.empty(s.shape, dtype=s.dtype, device=device if s.cuda else "cpu")
                   for s in specs]
    broadcast_tensors_(tensors, root_rank, process_set, "broadcast_optimizer_state")
    if g.rank != root:
        optimizer.load_state_dict(_fill(structure, list(tensors)))


def _strip_specs(obj, out):
    if isinstance(obj, _TensorSpec):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _strip_specs(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _strip_specs(v, out)


def _first_param_device(optimizer):
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.is_cuda:
                return p.device
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    raise error(_C.UnsupportedError, "broadcast_optimizer_state: the root holds CUDA "
                "state but this rank has no CUDA device")
