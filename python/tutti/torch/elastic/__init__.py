"""Horovod elastic on tutti: ``import tutti.torch as hvd`` and a Horovod
elastic training script runs under ``tutti-run`` unchanged.

    import tutti.torch as hvd
    hvd.init()
    sampler = hvd.elastic.ElasticSampler(dataset)
    loader = torch.utils.data.DataLoader(dataset, batch_size=B, sampler=sampler)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, sampler=sampler,
                                   epoch=0, batch=0)
    state.register_reset_callbacks([lambda: set_lr(base_lr * hvd.size())])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader, start=state.batch):
                ...
                state.sampler.record_batch(...)
                if state.batch % 10 == 0:
                    state.commit()
            state.batch = 0
            state.sampler.set_epoch(state.epoch + 1)
            state.commit()

    train(state)

Horovod re-forms the job in-process; tutti checkpoints and restarts it
(docs/python_checkpoint.md, "Elastic (Horovod-compatible)"):

* ``state.commit()`` keeps the state in memory (``restore()`` returns to
  it), writes it as a tutti checkpoint to the memory tier (node-local
  shared memory that a restart reloads from RAM, copied to a buddy on the
  next host) and, when TUTTI_CKPT_DIR or ``configure(ckpt_dir=)`` is set,
  to that directory as the safety net (every TUTTI_COMMIT_DURABLE_EVERY-th
  commit; a restart loads the newest commit complete in either), then
  ``check_host_updates()``.
* ``check_host_updates()`` raises ``HostsUpdatedInterrupt`` on every rank
  when tutti-run wrote ``$TUTTI_ELASTIC_DIR/resize-requested`` or a rank
  received a preemption notice (SIGUSR1 from tutti-run, cloud metadata, the
  trigger file); ``run`` then commits and exits with 75 and tutti-run
  starts the job again at the new size.
* A broken communicator (``HorovodInternalError``: tutti's CommError,
  TimeoutError, AbortedError) ends the process (with
  TUTTI_EXIT_ON_COMM_FAILURE, tutti-run's default, tutti itself exits 76);
  tutti-run restarts the job.  Except a killed rank under Open MPI 5 with
  ``--with-ft ulfm`` (``tutti.recovery_available()``): the survivors get a
  RanksLostError, ``run`` calls ``tutti.recover()``, the reset callbacks,
  loads the newest commit at the smaller size and calls the function again,
  in the same processes (docs/elastic.md).
* ``run`` loads the newest commit when the process starts, calls the reset
  callbacks after a restart (TUTTI_RESTART_COUNT > 0) or when the world
  size differs from the commit's, then ``sync()``s from rank 0.
"""
import functools

from ... import _C
from . import _runtime
from ._runtime import configure
from .sampler import ElasticSampler
from .state import (
    HorovodInternalError,
    HostsUpdatedInterrupt,
    ObjectState,
    State,
    TorchState,
)

#: What tutti raises for a communicator that cannot be used any more.
COMM_FAILURES = (_C.CommError, _C.TimeoutError, _C.AbortedError)


def _restart_count():
    import os
    try:
        return int(os.environ.get("TUTTI_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def _leave_with_tp_group(state, r, tp_size, lost):
    """This rank's tensor-parallel group lost a member (world ranks `lost`,
    as text): the other ranks go on without the group, this process ends
    with exit code 0 (SystemExit)."""
    _runtime.log(f"this rank's tensor-parallel group (TP {tp_size}) lost world rank(s) {lost}: "
                 f"it leaves the job as a whole DP replica, the other {r['new_size']} ranks go "
                 f"on from commit {state.commit_step}; exiting with code 0")
    _runtime._objects["manager"] = None  # its communicators were released by recover()
    _C.shutdown()
    raise SystemExit(0)


def _recover(state, lost, tp_size=1):
    """After a RanksLostError inside ``run``: tutti.recover(), a checkpoint
    manager over the new world, the reset callbacks (before the load: they
    rebuild what spans the world), the newest commit loaded at the new size,
    sync().  False (the error then propagates: under tutti-run the process
    exits 76 and the job restarts) when nothing was committed, fewer than
    TUTTI_ULFM_MIN_SIZE ranks survive, or the recovery failed.  With
    ``tp_size`` > 1 the survivors of a TP group that lost a member leave
    (SystemExit(0))."""
    import time
    t0 = time.monotonic()
    if state.commit_step <= 0:
        _runtime.log(f"no in-process recovery: nothing was committed yet ({lost})")
        return False
    try:
        r = _C.recover(tp_size=tp_size)
    except _C.RanksLostError as e:
        _runtime.log(f"no in-process recovery: {e}")
        return False
    min_size = int(_C.config_get("TUTTI_ULFM_MIN_SIZE"))
    if r["new_size"] < min_size:
        _runtime.log(f"no in-process recovery: {r['new_size']} ranks survive, fewer than "
                     f"TUTTI_ULFM_MIN_SIZE={min_size}")
        return False
    lost_ranks = ",".join(str(x) for x in r["lost"])
    if r["leaving"]:
        _leave_with_tp_group(state, r, tp_size, lost_ranks)
    _runtime.reopen()
    state.on_reset()
    if state._durable_load() is None:
        raise _C.CheckpointError(f"rank {_C.rank()}: after recovering from lost ranks no "
                                 f"commit was found (the last was {state.commit_step})")
    state.sync()
    state.save()
    if _C.rank() == 0:
        _runtime.log(f"recovered in-process: lost world rank(s) {lost_ranks}, "
                     f"{r['old_size']} -> {r['new_size']} ranks, resumed from commit "
                     f"{state.commit_step} in {time.monotonic() - t0:.3f} s")
    return True


def run(func=None, *, tp_size=1):
    """Horovod's ``@hvd.elastic.run``: ``func(state, *args, **kwargs)`` runs
    once per process, from the newest commit.  A HostsUpdatedInterrupt
    commits and exits with 75 (SystemExit); a communication failure ends the
    process (its error propagates) so tutti-run restarts the job from the
    last commit, except lost ranks where ``tutti.recovery_available()``:
    then the survivors recover in-process and ``func`` runs again from the
    newest commit at the new size.

    ``@hvd.elastic.run(tp_size=T)``: the world is a TP x DP mesh (TP groups
    of T consecutive ranks); a recovery drops a TP group that lost a member
    as a whole DP replica: its survivors exit with code 0 (SystemExit), the
    others keep their TP index and go on (rebuild the mesh in a reset
    callback; docs/elastic.md, "Tensor parallel jobs")."""
    if func is None:
        return functools.partial(run, tp_size=tp_size)
    if int(tp_size) < 1:
        raise _C.InvalidArgumentError(f"tutti.torch.elastic.run: tp_size {tp_size} must be "
                                      "positive")

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not isinstance(state, State):
            raise _C.InvalidArgumentError(
                f"rank {_C.rank()}: tutti.torch.elastic.run: the first argument must be an "
                f"elastic State (TorchState, ObjectState), not {type(state).__name__}")
        state._begin(_restart_count())
        # With ULFM a lost rank is raised here (not an exit under tutti-run)
        # and the survivors go on in this process.
        scope = _C.RecoveryScope() if _C.recovery_available() else None
        try:
            while True:
                try:
                    result = func(state, *args, **kwargs)
                    break
                except HostsUpdatedInterrupt as interrupt:
                    state._leave(interrupt)
                    raise   # not reached: _leave raises SystemExit
                except _C.RanksLostError as e:
                    if scope is None or not _recover(state, e, int(tp_size)):
                        raise
                except COMM_FAILURES as e:
                    _runtime.log(f"{type(e).__name__}: the communicator cannot be repaired in "
                                 f"this process; ending it so tutti-run restarts the job from "
                                 f"commit {state.commit_step}")
                    raise
        finally:
            del scope
        state._finish()
        return result

    return wrapper


__all__ = ["run", "configure", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HostsUpdatedInterrupt", "HorovodInternalError", "COMM_FAILURES"]
