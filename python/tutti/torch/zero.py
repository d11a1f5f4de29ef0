"""A sharded optimizer (ZeRO stage 1) over tutti's collectives, with
``torch.distributed.optim.ZeroRedundancyOptimizer``'s interface.

* The parameters are partitioned over the ranks of the process group with
  PyTorch's sorted-greedy rule: within each parameter group, largest first,
  each parameter goes to the rank whose partition holds the fewest elements
  so far (the lowest rank on ties); the sizes carry over from one group to
  the next.  A parameter is never split, so the update a rank computes is
  the one the unsharded optimizer computes, bit for bit.
* Each rank builds ``optimizer_class`` over its partition only (the same
  parameter groups, with this rank's parameters), so it holds optimizer
  state for about 1/W of the elements.
* ``step()`` runs the local optimizer, then every parameter is broadcast from
  its owner: one broadcast per parameter, or, with
  ``parameters_as_bucket_view=True``, one per (device, owner) over a flat
  bucket the parameters' ``.data`` point into.
* ``consolidate_state_dict(to)`` gathers the ranks' local states on ``to``
  (point-to-point, on the host), where ``state_dict()`` then returns the
  unsharded optimizer's state dict (global parameter indices).
  ``load_state_dict()`` takes such a dict from any world size and keeps the
  entries of this rank's partition.

``overlap_with_ddp=True`` (torch's semantics; _zero_overlap.py): the
partition follows tutti.torch.DistributedDataParallel's buckets and the step
runs inside backward, in the comm hook that
``ddp_comm_hooks.hook_with_zero_step*`` builds.

``shard_distributed_optimizer_base()`` serves ``DistributedOptimizer(...,
shard_optimizer_state=True)``: gradients averaged by the reducer as usual,
then this class's step.
"""
import copy
import io
import warnings

import torch

from .. import _C
from ._util import error, export, group_or_world, group_root, stream_of, wire
from ._zero_overlap import Overlap, check_optimizer_class

_CALL = "ZeroRedundancyOptimizer"


def _to_cpu(obj):
    """A copy of a (nested) state with every tensor moved to the host."""
    if torch.is_tensor(obj):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def _serialize(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _deserialize(data):
    return torch.load(io.BytesIO(data.numpy().tobytes()), map_location="cpu")


def _is_trainable(p):
    return p.requires_grad


class ZeroRedundancyOptimizer(torch.optim.Optimizer):
    """Wraps ``optimizer_class`` and shards its state over the ranks of
    ``process_group`` (ZeRO-1), as ``torch.distributed.optim.
    ZeroRedundancyOptimizer`` does.

    ``params``: tensors or parameter-group dicts, all of one dtype and device
    type (ValueError otherwise, as torch).  ``process_group``: a tutti.torch
    ``ProcessSet``, a ``tutti.ProcessGroup``, or None for the world.
    ``parameters_as_bucket_view``: each rank's parameters on a device live
    in one flat bucket (``p.data`` is a view into it) broadcast as one
    tensor.  ``overlap_with_ddp=True``: the step runs inside the backward
    of a tutti.torch.DistributedDataParallel whose comm hook is
    ``ddp_comm_hooks.hook_with_zero_step(hook, ddp, zero)`` (or its
    ``_interleaved`` twin); one parameter group, an optimizer_class that
    updates each parameter on its own (torch's list), and
    ``parameters_as_bucket_view`` is ignored (torch's warning); ``step()``
    does nothing; the partition and ``self.optim`` exist after the hook's
    warm-up passes.  ``**defaults`` go to ``optimizer_class``.

    The local optimizer is ``self.optim``; ``self.state`` stays empty.
    Gradients must already be averaged over the group when ``step()`` runs
    (DistributedDataParallel, or DistributedOptimizer's sharded mode)."""

    def __init__(self, params, optimizer_class, process_group=None,
                 parameters_as_bucket_view=False, overlap_with_ddp=False, **defaults):
        if overlap_with_ddp:
            check_optimizer_class(optimizer_class)
            if parameters_as_bucket_view:
                warnings.warn("ZeroRedundancyOptimizer: parameters_as_bucket_view=True is "
                              "ignored since overlap_with_ddp=True; the parameters are "
                              "flattened per DDP bucket instead (as torch)", stacklevel=2)
                parameters_as_bucket_view = False
        self._initialized = False
        self._overlap = None
        params = self._check_params(params)
        super().__init__(params, defaults)
        self._all_params = [p for g in self.param_groups for p in g["params"]]
        self._check_same_type()
        if overlap_with_ddp and len(self.param_groups) != 1:
            raise error(ValueError,
                        f"{_CALL}(overlap_with_ddp=True) supports a single parameter group "
                        f"(as torch's), got {len(self.param_groups)}")
        self.process_group = process_group
        self._group = group_or_world(process_group, _CALL)
        self.world_size = self._group.size
        self.rank = self._group.rank
        self.parameters_as_bucket_view = bool(parameters_as_bucket_view)
        self._partition = None  # [rank][group index] -> list of parameters
        self._owner = {}        # id(parameter) -> rank
        self._index = {}        # id(parameter) -> global index
        self._optimizer_class, self._defaults = optimizer_class, defaults
        self._trainable = [_is_trainable(p) for p in self._all_params]
        if overlap_with_ddp:  # partition and local optimizer: after the warm-up
            self._index = {id(p): i for i, p in enumerate(self._all_params)}
            self.optim = None
            self._overlap = Overlap(self)
        else:
            self._repartition()
            self.optim = optimizer_class(self._local_groups(), **defaults)
            self._sync_groups(self.optim.param_groups, self.param_groups)
        self._buckets = []  # [(device, [bucket of rank r or None])]
        self._build_buckets()
        self._all_state_dicts = []
        self._consolidated_to = None
        self._loaded = None
        self._initialized = True

    # ---- construction helpers ----------------------------------------------------

    @staticmethod
    def _check_params(params):
        if torch.is_tensor(params):
            raise error(TypeError,
                        f"{_CALL}: params should be an iterable of tensors or dicts, "
                        f"got a {torch.typename(params)}")
        params = list(params)
        if not params:
            raise error(ValueError, f"{_CALL} got an empty parameter list")
        for item in params:
            if isinstance(item, dict):
                continue
            if not torch.is_tensor(item):
                raise error(TypeError,
                            f"{_CALL}: params should be an iterable of tensors or "
                            f"dicts, got an item of type {type(item).__name__}")
        return params

    def _check_same_type(self):
        first = self._all_params[0]
        for p in self._all_params:
            if p.is_sparse:
                raise error(ValueError, f"{_CALL} supports only dense parameters")
            if p.dtype != first.dtype or p.device.type != first.device.type:
                raise error(ValueError,
                            f"{_CALL} needs every parameter of one dtype and device "
                            f"type: got {first.dtype} on {first.device.type} and "
                            f"{p.dtype} on {p.device.type}")

    def _repartition(self):
        """PyTorch's sorted-greedy partition of every parameter group."""
        w = self.world_size
        sizes = [0] * w
        self._partition = [[] for _ in range(w)]
        for group in self.param_groups:
            per_rank = [[] for _ in range(w)]
            for p in sorted(group["params"], key=lambda t: t.numel(), reverse=True):
                r = sizes.index(min(sizes))
                per_rank[r].append(p)
                sizes[r] += p.numel()
            for r in range(w):
                self._partition[r].append(per_rank[r])
        self._owner = {id(p): r for r in range(w) for ps in self._partition[r] for p in ps}
        self._all_params = [p for g in self.param_groups for p in g["params"]]
        self._index = {id(p): i for i, p in enumerate(self._all_params)}

    def _local_groups(self, rank=None):
        """This rank's parameter groups: each group's settings, its params."""
        r = self.rank if rank is None else rank
        out = []
        for group, mine in zip(self.param_groups, self._partition[r]):
            g = copy.copy(group)
            g["params"] = list(mine)
            out.append(g)
        return out

    @staticmethod
    def _sync_groups(src, dst):
        """Copies every setting but 'params' from src groups to dst groups."""
        for s, d in zip(src, dst):
            for k, v in s.items():
                if k != "params":
                    d[k] = v

    def _build_buckets(self):
        """parameters_as_bucket_view: one flat tensor per (device, rank) of
        that rank's trainable parameters; their .data become views into it."""
        if not self.parameters_as_bucket_view:
            return
        devices = []
        for p in self._all_params:
            if p.device not in devices:
                devices.append(p.device)
        self._buckets = []
        for device in devices:
            per_rank = []
            for r in range(self.world_size):
                params = [p for ps in self._partition[r] for p in ps if p.device == device]
                live = [p for p in params if _is_trainable(p)]
                for p in params:
                    if not _is_trainable(p):  # out of any old bucket
                        p.data = p.data.detach().clone()
                total = sum(p.numel() for p in live)
                if total == 0:
                    per_rank.append(None)
                    continue
                bucket = torch.empty(total, dtype=live[0].dtype, device=device)
                offset = 0
                for p in live:
                    n = p.numel()
                    bucket[offset:offset + n].copy_(p.data.reshape(-1))
                    p.data = bucket[offset:offset + n].view_as(p.data)
                    offset += n
                per_rank.append(bucket)
            self._buckets.append((device, per_rank))

    # ---- torch.optim.Optimizer interface -------------------------------------------

    def add_param_group(self, param_group):
        """Adds a group on every rank (collective in effect: every rank must
        call it with the same parameters).  The earlier groups keep their
        owners; the new group's parameters are partitioned greedily."""
        if self._initialized and self._overlap is not None:
            raise error(_C.InvalidArgumentError,
                        f"{_CALL}(overlap_with_ddp=True) supports a single parameter group "
                        "(as torch's): add_param_group() is refused")
        super().add_param_group(param_group)
        if not self._initialized:
            return
        self._repartition()
        self.optim.add_param_group(self._local_groups()[-1])
        self._sync_groups(self.optim.param_groups, self.param_groups)  # its defaults
        self._trainable = [_is_trainable(p) for p in self._all_params]
        self._build_buckets()

    def step(self, closure=None, **kwargs):
        """Steps this rank's partition with the local optimizer, then
        broadcasts every parameter from its owner.  Returns the closure's
        loss, as torch optimizers do.  With overlap_with_ddp=True: warns and
        returns None (the step ran in backward), as torch; raises when no
        registered hook_with_zero_step could ever update the parameters."""
        if self._overlap is not None:
            self._overlap.check_step()
            return None
        trainable = [_is_trainable(p) for p in self._all_params]
        if trainable != self._trainable:  # parameters were frozen or unfrozen
            self._trainable = trainable
            self._build_buckets()
        self._sync_groups(self.param_groups, self.optim.param_groups)
        self._loaded = None
        if closure is None:
            loss = self.optim.step(**kwargs)
        else:
            loss = self.optim.step(closure=closure, **kwargs)
        self._sync_groups(self.optim.param_groups, self.param_groups)
        self._broadcast_params()
        return loss

    def _broadcast_params(self):
        g = self._group
        if g.size == 1:
            return
        works, copies = [], []
        if self.parameters_as_bucket_view:
            for d, (device, per_rank) in enumerate(self._buckets):
                for r, bucket in enumerate(per_rank):
                    if bucket is not None:
                        works.append(g.broadcast(wire(bucket), root=r, async_op=True,
                                                 name=f"{_CALL} bucket {d}.{r}",
                                                 stream=stream_of(bucket)))
        else:
            for r in range(g.size):
                for ps in self._partition[r]:
                    for p in ps:
                        if not _is_trainable(p):
                            continue
                        t = export(p.data)
                        if not t.is_contiguous():
                            t = t.contiguous()
                            copies.append((p, t))
                        works.append(g.broadcast(wire(t), root=r, async_op=True,
                                                 name=f"{_CALL} param {self._index[id(p)]}",
                                                 stream=stream_of(t)))
        for w in works:
            w.wait()
        with torch.no_grad():
            for p, t in copies:
                p.data.copy_(t)

    # ---- overlap_with_ddp (called by _zero_overlap.Overlap) ------------------------------

    def _overlap_partition(self, per_rank):
        """The partition from the DDP's buckets (one group) and the local
        optimizer over this rank's part."""
        self._partition = [[list(ps)] for ps in per_rank]
        self._owner = {id(p): r for r, ps in enumerate(per_rank) for p in ps}
        self.optim = self._optimizer_class(self._local_groups(), **self._defaults)
        self._sync_groups(self.optim.param_groups, self.param_groups)

    def _step_subset(self, params, grads):
        """The local optimizer's step over ``params`` only (this rank's part
        of a bucket), with ``grads`` as their gradients; .grad is restored
        afterwards (the DDP writes the averages there when backward ends)."""
        trainable = [_is_trainable(p) for p in self._all_params]
        if trainable != self._trainable:
            raise error(_C.InvalidArgumentError,
                        f"{_CALL}(overlap_with_ddp=True) does not support changing "
                        "requires_grad at run time (as torch)")
        self._sync_groups(self.param_groups, self.optim.param_groups)
        group = self.optim.param_groups[0]
        kept_params, kept_grads = group["params"], [p.grad for p in params]
        try:
            group["params"] = params
            for p, g in zip(params, grads):
                p.grad = g
            self.optim.step()
        finally:
            group["params"] = kept_params
            for p, g in zip(params, kept_grads):
                p.grad = g
        self._sync_groups(self.optim.param_groups, self.param_groups)
        self._loaded = None

    def _check_overlap_initialized(self, call):
        if self._overlap is not None and not self._overlap.initialized:
            warmup = ("2, or 3 with static_graph=True" if self._overlap.warmup is None
                      else str(self._overlap.warmup))
            raise error(_C.InvalidArgumentError,
                        f"{_CALL}.{call}: with overlap_with_ddp=True the partition follows "
                        "the DDP's buckets and exists only after the warm-up backward passes "
                        f"of hook_with_zero_step ({warmup}; "
                        f"{self._overlap.passes} ran)")

    # ---- state ---------------------------------------------------------------------------

    def consolidate_state_dict(self, to=0):
        """Collective: gathers every rank's local optimizer state on rank
        ``to`` of the group (on the host), where ``state_dict()`` then
        returns the whole state.  Other ranks drop any consolidated copy."""
        self._check_overlap_initialized("consolidate_state_dict()")
        if not isinstance(to, int) or not 0 <= to < self.world_size:
            raise error(_C.InvalidArgumentError,
                        f"{_CALL}.consolidate_state_dict(to={to!r}): `to` must be a rank "
                        f"of the optimizer's group, 0..{self.world_size - 1}")
        self._sync_groups(self.param_groups, self.optim.param_groups)
        g = self._group
        mine = _to_cpu(self.optim.state_dict())
        self._all_state_dicts = []
        self._consolidated_to = to
        if g.rank != to:
            data = _serialize(mine)
            g.send(torch.tensor([data.numel()], dtype=torch.int64), to, tag=0)
            g.send(data, to, tag=1)
            return
        for r in range(g.size):
            if r == g.rank:
                self._all_state_dicts.append(mine)
                continue
            length = torch.zeros(1, dtype=torch.int64)
            g.recv(length, r, tag=0)
            data = torch.empty(int(length[0]), dtype=torch.uint8)
            g.recv(data, r, tag=1)
            self._all_state_dicts.append(_deserialize(data))

    def state_dict(self):
        """The unsharded optimizer's state dict (global parameter indices,
        tensors on the host) as of the last ``consolidate_state_dict()``;
        only on the rank it consolidated to (InvalidArgumentError, a
        RuntimeError, elsewhere, as torch raises)."""
        self._check_overlap_initialized("state_dict()")
        if not self._all_state_dicts:
            where = ("" if self._consolidated_to is None else
                     f" (it was consolidated to rank {self._consolidated_to})")
            raise error(_C.InvalidArgumentError,
                        f"{_CALL}: optimizer state has not been consolidated on this rank "
                        f"(group rank {self.rank}){where}.  Please call "
                        f"`consolidate_state_dict(to={self.rank})` on all ranks beforehand "
                        "if you meant to save the global state.")
        return self._assemble(self._all_state_dicts)

    def _assemble(self, local_state_dicts):
        """The unsharded state dict from every rank's local one."""
        sd = super().state_dict()  # settings and global indices; self.state is empty
        state = {}
        for r, local in enumerate(local_state_dicts):
            if len(local["param_groups"]) != len(self._partition[r]):
                raise error(_C.MismatchError,
                            f"{_CALL}.state_dict(): rank {r}'s consolidated state has "
                            f"{len(local['param_groups'])} parameter groups, the partition "
                            f"{len(self._partition[r])} (add_param_group after consolidating?)")
            for local_group, params in zip(local["param_groups"], self._partition[r]):
                for local_idx, p in zip(local_group["params"], params):
                    if local_idx in local["state"]:
                        state[self._index[id(p)]] = local["state"][local_idx]
        sd["state"] = dict(sorted(state.items()))
        return sd

    def load_state_dict(self, state_dict):
        """Loads an unsharded state dict (``state_dict()``'s, or a plain torch
        optimizer's, saved at any world size): this rank keeps its
        partition's entries; every group's settings are taken.  With
        overlap_with_ddp=True before the warm-up ended, the dict is checked
        and kept, and loaded when the partition is made."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise error(ValueError,
                        f"{_CALL}: loaded state dict has {len(groups)} parameter groups, "
                        f"the optimizer {len(self.param_groups)}")
        for k, (saved, group) in enumerate(zip(groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise error(ValueError,
                            f"{_CALL}: loaded state dict's parameter group {k} has "
                            f"{len(saved['params'])} parameters, the optimizer's "
                            f"{len(group['params'])}")
        if self._overlap is not None and not self._overlap.initialized:
            self._overlap.pending_load = state_dict
            return
        saved_state = state_dict["state"]
        local = {"state": {}, "param_groups": []}
        next_local = 0
        for saved, group, mine in zip(groups, self.param_groups, self._partition[self.rank]):
            position = {id(p): j for j, p in enumerate(group["params"])}
            local_group = {k: v for k, v in saved.items() if k != "params"}
            local_group["params"] = []
            for p in mine:
                saved_idx = saved["params"][position[id(p)]]
                if saved_idx in saved_state:
                    local["state"][next_local] = saved_state[saved_idx]
                local_group["params"].append(next_local)
                next_local += 1
            local["param_groups"].append(local_group)
        self.optim.load_state_dict(local)
        self._sync_groups(self.optim.param_groups, self.param_groups)
        self._loaded = state_dict  # until the next step: broadcast_optimizer_state sends it

    def _tutti_full_state_dict(self):
        """Collective: state_dict() on every rank of the group, from an
        allgather of the local states (tutti.torch.checkpoint.save writes
        the optimizer's state as replicated tensors; like the unsharded
        optimizer's, the whole state is then on every rank for a moment)."""
        from .functions import allgather_object
        self._check_overlap_initialized("state (checkpoint.save)")
        self._sync_groups(self.param_groups, self.optim.param_groups)
        every = allgather_object(_to_cpu(self.optim.state_dict()),
                                 name=f"{_CALL} full state", process_set=self._group)
        return self._assemble(every)

    def _tutti_broadcast_state(self, root_rank, process_set):
        """hvd.broadcast_optimizer_state() of a sharded optimizer: every rank
        loads the root's whole state and keeps its partition.  The root's
        whole state is the dict it last passed to load_state_dict() when no
        step() came since (Horovod's "rank 0 loads a checkpoint, then
        broadcasts"), else every rank's partition consolidated on the root.
        ``root_rank`` counts as ``process_set`` numbers it."""
        call = "hvd.broadcast_optimizer_state()"
        self._check_overlap_initialized(call)
        root = group_root(process_set if process_set is not None else self.process_group,
                          root_rank, call)
        g = self._group
        if not 0 <= root < g.size:
            raise error(_C.InvalidArgumentError,
                        f"{call}: root_rank {root_rank} is not a rank of the optimizer's group "
                        f"(size {g.size})")
        loaded = torch.tensor([int(self._loaded is not None)], dtype=torch.int64)
        g.broadcast(loaded, root=root, name=f"{_CALL} state source")
        if not int(loaded[0]):
            self.consolidate_state_dict(to=root)
        if g.rank == root:
            data = _serialize(self._loaded if int(loaded[0]) else self.state_dict())
            length = torch.tensor([data.numel()], dtype=torch.int64)
        else:
            length = torch.zeros(1, dtype=torch.int64)
        g.broadcast(length, root=root, name=f"{_CALL} state size")
        if g.rank != root:
            data = torch.empty(int(length[0]), dtype=torch.uint8)
        g.broadcast(data, root=root, name=f"{_CALL} state")
        if g.rank != root:
            self.load_state_dict(_deserialize(data))
        self._all_state_dicts = []

    # ---- introspection ------------------------------------------------------------------

    def partition(self, rank=None):
        """The parameters rank ``rank`` (default: this one) updates, one list
        per parameter group."""
        self._check_overlap_initialized("partition()")
        return [list(ps) for ps in self._partition[self.rank if rank is None else rank]]

    def owner(self, param):
        """The group rank that updates ``param``."""
        self._check_overlap_initialized("owner()")
        return self._owner[id(param)]


def shard_distributed_optimizer_base(optimizer, process_set):
    """The base class of ``DistributedOptimizer(optimizer,
    shard_optimizer_state=True)``: a ZeroRedundancyOptimizer over
    ``type(optimizer)`` and its defaults whose constructor takes the
    parameter groups only (as the Horovod wrapper calls it)."""
    optimizer_class = type(optimizer)
    defaults = dict(optimizer.defaults)

    class _Sharded(ZeroRedundancyOptimizer):
        def __init__(self, params):
            ZeroRedundancyOptimizer.__init__(self, params, optimizer_class,
                                             process_group=process_set, **defaults)

    _Sharded.__name__ = _Sharded.__qualname__ = f"Sharded{optimizer_class.__name__}"
    return _Sharded
