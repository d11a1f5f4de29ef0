"""Save and restore a whole PyTorch training state through tutti's
checkpoint manager: model, optimizer, loss scaler, compressor, RNG states
and the data position.

    mgr = tutti.CheckpointManager(tutti.world(), "/ckpt")
    res = tutti.torch.checkpoint.load(mgr, model=model, optimizer=opt, scaler=scaler)
    start, position = (res["step"], res["data_position"]) if res else (0, None)
    ...
    tutti.torch.checkpoint.save(mgr, step, model=model, optimizer=opt, scaler=scaler,
                                data_position={"epoch": e, "batch": b})

What goes where (component names in the checkpoint):

* ``model/<state_dict key>``: parameters and buffers; tensor-parallel
  parameters carry their sharding (``p.tutti_shard``), so a load reshards
  to another TP size.
* ``optimizer/state/<param index>/<key>``: the optimizer's tensors (shards
  follow their parameter's); its hyper-parameters and non-tensor state go
  in the manifest's metadata as JSON.  A fresh optimizer (no state yet) is
  restored too: the structure is read first, then the tensors.
* ``scaler/...``: a ``tutti.torch.LossScaler``'s C++ state; a torch
  GradScaler's state_dict goes in the metadata.
* ``compressor/...``: error-feedback residuals, PowerSGD factors (default:
  the DistributedOptimizer's compressor); ``reducer/...``: the gradient
  reducer's step counter (which PowerSGD's start step is compared with).
  The residuals are per rank: at another world size every rank starts from
  the mean of the saved ones (docs/compression.md); absent entries are kept
  fresh (with a logged warning).
* ``rng/state``: per rank, torch's CPU and CUDA generators, Python's
  ``random`` and numpy's global generator.  At another world size rank r
  gets rank r's saved state where the saving job had a rank r; a rank with
  no counterpart reseeds deterministically from (step, rank) with
  ``rng_seed(step, rank)`` (a warning says so).
* metadata ``data_position`` (any JSON value) and ``user``.

Every rank calls save/load (collective).  Tensors are copied before an
async save returns.
"""
import base64
import json
import random
import warnings
import zlib

import numpy as np
import torch

from .. import _C
from ._util import error

#: Bytes of RNG state each rank may store.
RNG_BYTES = 1 << 18
_FORMAT = 1


def _json_safe(value, where):
    """Tuples survive as {"__tuple__": [...]}; anything not JSON is an error."""
    if isinstance(value, tuple):
        return {"__tuple__": [_json_safe(v, where) for v in value]}
    if isinstance(value, list):
        return [_json_safe(v, where) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_safe(v, where) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise error(_C.InvalidArgumentError,
                f"checkpoint: {where} holds a {type(value).__name__}, which is not "
                "JSON data (tensors, numbers, strings, lists, tuples, dicts)")


def _from_json(value):
    if isinstance(value, dict):
        if set(value) == {"__tuple__"}:
            return tuple(_from_json(v) for v in value["__tuple__"])
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def _with_shard(tensor, like):
    shard = getattr(like, "tutti_shard", None)
    t = tensor.detach()
    return (t, shard) if shard is not None and tuple(t.shape) == tuple(like.shape) else t


def _model_tensors(model):
    return {name: _with_shard(t, t) for name, t in model.state_dict(keep_vars=True).items()}


def _optimizer_params(optimizer):
    return [p for group in optimizer.param_groups for p in group["params"]]


def _optimizer_save(optimizer):
    full = getattr(optimizer, "_tutti_full_state_dict", None)  # sharded (tutti.torch.zero)
    sd = full() if full is not None else optimizer.state_dict()
    params = _optimizer_params(optimizer)
    tensors, state = {}, {}
    for idx, entries in sd["state"].items():
        out = {}
        for key, v in entries.items():
            if torch.is_tensor(v):
                name = f"state/{idx}/{key}"
                tensors[name] = _with_shard(v, params[idx])
                out[key] = {"tensor": name, "shape": list(v.shape),
                            "dtype": str(v.dtype).replace("torch.", ""),
                            "like_param": tuple(v.shape) == tuple(params[idx].shape)}
            else:
                out[key] = {"value": _json_safe(v, f"optimizer state {idx}/{key}")}
        state[str(idx)] = out
    groups = _json_safe(sd["param_groups"], "optimizer param_groups")
    return tensors, {"state": state, "param_groups": groups}


def _optimizer_tensors_for_load(optimizer, skeleton):
    """Allocates the optimizer's state tensors from the saved structure (like
    their parameter where they had its shape, so TP shards reshard)."""
    params = _optimizer_params(optimizer)
    tensors = {}
    for idx, entries in skeleton["state"].items():
        p = params[int(idx)]
        for key, spec in entries.items():
            if "tensor" not in spec:
                continue
            dtype = getattr(torch, spec["dtype"])
            if spec["like_param"]:
                t = torch.empty(p.shape, dtype=dtype, device=p.device)
            else:
                t = torch.empty(spec["shape"], dtype=dtype,
                                device=p.device if spec["shape"] else "cpu")
            tensors[spec["tensor"]] = _with_shard(t, p)
    return tensors


def _optimizer_restore(optimizer, skeleton, tensors):
    state = {}
    for idx, entries in skeleton["state"].items():
        state[int(idx)] = {
            key: (tensors[spec["tensor"]] if "tensor" in spec else _from_json(spec["value"]))
            for key, spec in entries.items()}
    optimizer.load_state_dict({"state": state,
                               "param_groups": _from_json(skeleton["param_groups"])})


def _rng_blob():
    state = {
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "random": _json_safe(random.getstate(), "random state"),
    }
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy"] = [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode()
                         for s in torch.cuda.get_rng_state_all()]
    data = json.dumps(state).encode()
    if len(data) > RNG_BYTES:
        raise error(_C.InvalidArgumentError,
                    f"checkpoint: RNG state of {len(data)} bytes exceeds RNG_BYTES")
    blob = torch.zeros((1, RNG_BYTES), dtype=torch.uint8)
    blob[0, :len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return blob


def _rng_entry(blob):
    w, r = _C.size(), _C.rank()
    return {"state": (blob, {"global_shape": [w, RNG_BYTES], "dim": 0, "offset": r,
                             "group": "world"})}


def _rng_restore(blob):
    raw = blob.numpy().tobytes().rstrip(b"\0")
    state = json.loads(raw.decode())
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])),
                                         dtype=torch.uint8))
    random.setstate(_from_json(state["random"]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([
            torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)
            for s in state["cuda"]])


def rng_seed(step, rank):
    """The seed of a rank that has no saved RNG state (a grown job)."""
    return zlib.crc32(f"tutti-rng/{int(step)}/{int(rank)}".encode())


def _rng_reseed(seed):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)


def _rng_after_resize(manager, step, saved_world):
    """Collective: every saved row (a read-only load), then this rank's own
    row where the saving job had this rank, else a deterministic reseed."""
    rows = torch.zeros((saved_world, RNG_BYTES), dtype=torch.uint8)
    res = manager.load({"rng": {"state": rows}}, step=step, optional=["rng/"], resume=False)
    rank = _C.rank()
    if "rng/state" in res["skipped"]:
        return "absent"
    if rank < saved_world:
        _rng_restore(rows[rank:rank + 1])
        return "restored"
    seed = rng_seed(step, rank)
    warnings.warn(f"tutti.torch.checkpoint: rank {rank} has no RNG state in checkpoint "
                  f"{res['name']} (saved by {saved_world} ranks): reseeded with "
                  f"rng_seed({step}, {rank}) = {seed}", RuntimeWarning, stacklevel=3)
    _rng_reseed(seed)
    return "reseeded"


def _scaler_component(scaler):
    inner = getattr(scaler, "scaler", None)
    return inner if isinstance(inner, _C.Stateful) else None


def _compressor_of(compressor, optimizer):
    if compressor is not None:
        return compressor
    return getattr(optimizer, "compressor", None) if optimizer is not None else None


def _reducer_of(model, optimizer):
    """The tutti.Reducer of a DistributedOptimizer or DistributedDataParallel."""
    for owner in (optimizer, model):
        r = getattr(owner, "reducer", None)
        if isinstance(r, _C.Reducer):
            return r
    return None


def _add_sync_state(state, model, optimizer, compressor):
    """The compressor's and the reducer's entries, where there are any: save
    and load name the same components."""
    comp = _compressor_of(compressor, optimizer)
    if comp is not None:
        state["compressor"] = comp
    reducer = _reducer_of(model, optimizer)
    if reducer is not None:
        state["reducer"] = reducer


def save(manager, step, *, model=None, optimizer=None, scaler=None, compressor=None,
         data_position=None, rng=True, metadata=None):
    """Collective: saves the training state as checkpoint ``step``."""
    state = {}
    meta = {"tutti.torch": _FORMAT, "data_position": _json_safe(data_position, "data_position"),
            "user": _json_safe(metadata, "metadata")}
    if model is not None:
        state["model"] = _model_tensors(model)
    if optimizer is not None:
        state["optimizer"], meta["optimizer"] = _optimizer_save(optimizer)
    if scaler is not None:
        inner = _scaler_component(scaler)
        if inner is not None:
            state["scaler"] = inner
        else:
            meta["scaler"] = _json_safe(scaler.state_dict(), "scaler state")
    _add_sync_state(state, model, optimizer, compressor)
    if rng:
        state["rng"] = _rng_entry(_rng_blob())
    manager.save(step, state, meta)


def load(manager, *, model=None, optimizer=None, scaler=None, compressor=None, rng=True,
         step=-1, optional=()):
    """Collective: restores the newest checkpoint that verifies (or exactly
    ``step``) into the given objects.  Returns None when there is none, else
    {step, data_position, metadata, name, saved_world_size, skipped}."""
    head = manager.load({}, step=step)  # which checkpoint, and its structure
    if head is None:
        return None
    meta = head["metadata"]
    state = {}
    if model is not None:
        state["model"] = _model_tensors(model)
    opt_tensors = None
    if optimizer is not None:
        if "optimizer" not in meta:
            raise error(_C.CheckpointError,
                        f"checkpoint {head['name']} holds no optimizer state")
        opt_tensors = _optimizer_tensors_for_load(optimizer, meta["optimizer"])
        state["optimizer"] = opt_tensors
    if scaler is not None and _scaler_component(scaler) is not None:
        state["scaler"] = _scaler_component(scaler)
    _add_sync_state(state, model, optimizer, compressor)
    blob = torch.zeros((1, RNG_BYTES), dtype=torch.uint8) if rng else None
    if rng:
        state["rng"] = _rng_entry(blob)
    res = manager.load(state, step=head["step"],
                       optional=list(optional) + ["compressor/", "rng/", "reducer/"])
    if optimizer is not None:
        plain = {k: (v[0] if isinstance(v, tuple) else v) for k, v in opt_tensors.items()}
        _optimizer_restore(optimizer, meta["optimizer"], plain)
    if scaler is not None and _scaler_component(scaler) is None and "scaler" in meta:
        scaler.load_state_dict(_from_json(meta["scaler"]))
    if rng and "rng/state" not in res["skipped"]:
        _rng_restore(blob)
    elif rng and res["saved_world_size"] != _C.size():
        _rng_after_resize(manager, res["step"], res["saved_world_size"])
    return {"step": res["step"], "name": res["name"],
            "data_position": _from_json(meta.get("data_position")),
            "metadata": _from_json(meta.get("user")),
            "saved_world_size": res["saved_world_size"], "skipped": res["skipped"]}


__all__ = ["save", "load", "rng_seed", "RNG_BYTES"]
