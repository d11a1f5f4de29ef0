"""Horovod's elastic State, ObjectState and TorchState on tutti checkpoints.

save()/restore() keep Horovod's in-memory copy; commit() also writes it as a
tutti checkpoint (a durable commit a restarted job resumes from), then checks
for host updates.
"""
import base64
import copy
import pickle

import torch

from ... import _C
from .. import checkpoint as _torch_ckpt
from .._util import error
from ..functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from . import _runtime
from .sampler import ElasticSampler

_FORMAT = 1


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's name: the job's hosts changed (tutti-run asked for a resize,
    or a rank received a preemption notice).  ``elastic.run`` answers it by
    committing and exiting with 75, and tutti-run starts the job again at the
    new size.  ``skip_sync`` is Horovod's field (unused: a relaunched job
    always loads and syncs)."""

    def __init__(self, skip_sync=False, reason="", committed=False):
        super().__init__(reason or "the job's hosts were updated")
        self.skip_sync = skip_sync
        self.reason = reason
        self.committed = committed


class HorovodInternalError(_C.CommError):
    """Horovod's name for a failed collective.  tutti raises CommError,
    TimeoutError or AbortedError for a broken communicator (this class is a
    CommError, for code that raises it); ``elastic.run`` treats all of them
    as this error: nothing in the process can repair the communicator, so
    the process ends and tutti-run restarts the job from the last commit."""


def _encode(value, where):
    """JSON data as is; anything else pickled (as Horovod's ObjectState
    broadcasts it)."""
    try:
        return {"json": _torch_ckpt._json_safe(value, where)}
    except _C.InvalidArgumentError:
        try:
            return {"pickle": base64.b64encode(pickle.dumps(value)).decode()}
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise error(_C.InvalidArgumentError,
                        f"elastic state: {where} ({type(value).__name__}) is neither JSON data "
                        f"nor picklable: {e}") from e


def _decode(entry):
    if "json" in entry:
        return _torch_ckpt._from_json(entry["json"])
    return pickle.loads(base64.b64decode(entry["pickle"]))


class State:
    """Horovod's elastic State: reset callbacks, commit, host-update checks.
    Subclasses implement save/restore/sync and the durable parts."""

    def __init__(self):
        self._reset_callbacks = []
        self._commit_step = 0      # the checkpoint step of the last durable commit
        self._started = False

    def register_reset_callbacks(self, callbacks):
        """Functions called (in order, no arguments) after a reset: when the
        job resumes after a restart or at another world size."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Collective: keeps the state in memory (restore() goes back to
        it), writes it as a tutti checkpoint, then check_host_updates()."""
        self._agree()
        self.save()
        self._durable_save()
        self.check_host_updates(_committed=True)

    def check_host_updates(self, _committed=False):
        """Collective: raises HostsUpdatedInterrupt on every rank when
        tutti-run asked for a resize ($TUTTI_ELASTIC_DIR/resize-requested)
        or any rank received a preemption notice."""
        reason = _runtime.host_updates()
        if reason is not None:
            raise HostsUpdatedInterrupt(False, reason, committed=_committed)

    @property
    def commit_step(self):
        """The checkpoint step of the last durable commit (0: none)."""
        return self._commit_step

    # ---- used by elastic.run --------------------------------------------------------
    def _begin(self, restart_count):
        """Once per process: load the newest commit; reset callbacks after a
        restart or a size change.  Then sync() and keep the copy restore()
        returns to."""
        if not self._started:
            self._started = True
            res = self._durable_load()
            resized = res is not None and res["saved_world_size"] != _C.size()
            if res is not None and _C.rank() == 0:
                _runtime.log(f"resumed from commit {self._commit_step} ({res['name']}, "
                             f"saved by {res['saved_world_size']} ranks, now {_C.size()})")
            if restart_count > 0 or resized:
                self.on_reset()
        self.sync()
        self.save()

    def _leave(self, interrupt):
        """After a HostsUpdatedInterrupt: commit (unless that raised it),
        let the checkpoint land, exit with 75 (SystemExit)."""
        if not interrupt.committed:
            self._agree()
            self.save()
            self._durable_save()
        _runtime.manager().wait()
        if _C.rank() == 0:
            _runtime.log(f"{interrupt.reason}: state committed as step {self._commit_step}; "
                         "exiting with 75 so tutti-run starts the job again")
        _runtime.exit_for_restart()

    def _finish(self):
        if _runtime._objects["manager"] is not None:
            _runtime.manager().wait()
        _runtime.finish()

    # ---- subclass interface ---------------------------------------------------------
    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError

    def _agree(self):
        """Collective agreement needed before a commit (samplers)."""

    def _durable_save(self):
        raise NotImplementedError

    def _durable_load(self):
        raise NotImplementedError


class ObjectState(State):
    """Horovod's ObjectState(bcast_object, get_rank, **kwargs): plain
    attributes (``state.epoch``), broadcast from rank 0 by sync(), committed
    as JSON (else pickled) in the checkpoint's metadata."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        super().__init__()
        self._bcast_object = bcast_object or broadcast_object
        self._get_rank = get_rank or _C.rank
        self._object_names = list(kwargs)
        self._saved_objects = {}
        for name, value in kwargs.items():
            setattr(self, name, value)

    def _objects(self):
        return {name: getattr(self, name) for name in self._object_names}

    def save(self):
        self._saved_objects = copy.deepcopy(self._objects())

    def restore(self):
        for name, value in copy.deepcopy(self._saved_objects).items():
            setattr(self, name, value)

    def sync(self):
        if self._object_names:
            for name, value in self._bcast_object(self._objects(), 0).items():
                setattr(self, name, value)

    def _meta(self, mgr):
        if not self._started:
            # A commit outside run() (nothing loaded): after the newest
            # checkpoint in the directory, so it becomes the latest.
            self._commit_step = max(self._commit_step, mgr.latest_step() or 0)
        return {"tutti.elastic": _FORMAT, "commit": self._commit_step + 1,
                "world_size": _C.size(),
                "objects": {n: _encode(v, f"state.{n}") for n, v in self._objects().items()}}

    def _load_meta(self, meta, name):
        if not isinstance(meta, dict) or "tutti.elastic" not in meta:
            raise error(_C.CheckpointError,
                        f"checkpoint {name} was not written by tutti.torch.elastic "
                        "(no elastic state in its metadata)")
        objects = meta.get("objects", {})
        missing = [n for n in self._object_names if n not in objects]
        if missing:
            raise error(_C.CheckpointError,
                        f"checkpoint {name} holds no state for {missing} (it has "
                        f"{sorted(objects)}); this job's state has other attributes")
        for n in self._object_names:
            setattr(self, n, _decode(objects[n]))
        self._commit_step = int(meta["commit"])

    def _durable_save(self):
        mgr = _runtime.manager()
        meta = self._meta(mgr)
        _torch_ckpt.save(mgr, meta["commit"], rng=False, metadata=meta)
        if not _runtime._config["async_commit"]:
            mgr.wait()
        self._commit_step = meta["commit"]

    def _durable_load(self):
        res = _torch_ckpt.load(_runtime.manager(), rng=False)
        if res is not None:
            self._load_meta(res["metadata"], res["name"])
        return res


class TorchState(ObjectState):
    """Horovod's TorchState(model=None, optimizer=None, **kwargs): modules,
    optimizers and ElasticSamplers among the arguments are handled as such
    (state_dicts kept in memory, broadcast by sync(), written as tensors in
    the commit); the rest are ObjectState attributes.  One optimizer at
    most; several modules are committed together (as a ModuleDict)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        everything = dict(kwargs)
        if model is not None:
            everything["model"] = model
        if optimizer is not None:
            everything["optimizer"] = optimizer
        self._model_names = [k for k, v in everything.items() if isinstance(v, torch.nn.Module)]
        self._optimizer_names = [k for k, v in everything.items()
                                 if isinstance(v, torch.optim.Optimizer)]
        self._sampler_names = [k for k, v in everything.items() if isinstance(v, ElasticSampler)]
        if len(self._optimizer_names) > 1:
            raise error(_C.UnsupportedError,
                        f"TorchState: one optimizer per state (a tutti checkpoint holds one); "
                        f"got {self._optimizer_names}")
        special = set(self._model_names + self._optimizer_names + self._sampler_names)
        super().__init__(**{k: v for k, v in everything.items() if k not in special})
        for name in special:
            setattr(self, name, everything[name])
        self._saved_models, self._saved_optimizer, self._saved_samplers = {}, None, {}
        # The signal handlers go in now: a SIGUSR1 from tutti-run must be a
        # notice, not the default action (death).
        _runtime.monitor()

    def _model(self):
        models = [getattr(self, n) for n in self._model_names]
        if not models:
            return None
        if len(models) == 1:
            return models[0]
        return torch.nn.ModuleDict(dict(zip(self._model_names, models)))

    def _optimizer(self):
        return getattr(self, self._optimizer_names[0]) if self._optimizer_names else None

    def _samplers(self):
        return {n: getattr(self, n) for n in self._sampler_names}

    def save(self):
        super().save()
        self._saved_models = {
            n: {k: v.detach().clone() for k, v in getattr(self, n).state_dict().items()}
            for n in self._model_names}
        opt = self._optimizer()
        self._saved_optimizer = copy.deepcopy(opt.state_dict()) if opt is not None else None
        self._saved_samplers = {n: s._snapshot() for n, s in self._samplers().items()}

    def restore(self):
        """Goes back to the last save()/commit() in memory (Horovod's
        restore; no communication)."""
        super().restore()
        for n, sd in self._saved_models.items():
            getattr(self, n).load_state_dict(sd)
        if self._saved_optimizer is not None:
            self._optimizer().load_state_dict(copy.deepcopy(self._saved_optimizer))
        for n, snap in self._saved_samplers.items():
            getattr(self, n)._restore_snapshot(snap)

    def sync(self):
        """Collective: rank 0's models, optimizer state and attributes on
        every rank; the samplers agree on what was processed."""
        for n in self._model_names:
            broadcast_parameters(getattr(self, n).state_dict(), root_rank=0)
        opt = self._optimizer()
        if opt is not None:
            broadcast_optimizer_state(opt, root_rank=0)
        for s in self._samplers().values():
            s.sync()
        super().sync()

    def _agree(self):
        for s in self._samplers().values():
            s._agree()

    def _durable_save(self):
        mgr = _runtime.manager()
        meta = self._meta(mgr)
        position = {n: s.state_dict() for n, s in self._samplers().items()}
        _torch_ckpt.save(mgr, meta["commit"], model=self._model(), optimizer=self._optimizer(),
                         data_position=position, metadata=meta)
        if not _runtime._config["async_commit"]:
            mgr.wait()
        self._commit_step = meta["commit"]

    def _durable_load(self):
        res = _torch_ckpt.load(_runtime.manager(), model=self._model(),
                               optimizer=self._optimizer())
        if res is None:
            return None
        self._load_meta(res["metadata"], res["name"])
        position = res["data_position"] or {}
        for n, s in self._samplers().items():
            if n not in position:
                raise error(_C.CheckpointError,
                            f"checkpoint {res['name']} holds no position for sampler '{n}'")
            s.load_state_dict(position[n])
        return res


__all__ = ["State", "ObjectState", "TorchState", "HostsUpdatedInterrupt",
           "HorovodInternalError"]
