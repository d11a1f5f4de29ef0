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
  it), writes it as a tutti checkpoint (TUTTI_CKPT_DIR or
  ``configure(ckpt_dir=)``; without either, to the memory tier: node-local
  shared memory that a restart on the same host reloads), then
  ``check_host_updates()``.
* ``check_host_updates()`` raises ``HostsUpdatedInterrupt`` on every rank
  when tutti-run wrote ``$TUTTI_ELASTIC_DIR/resize-requested`` or a rank
  received a preemption notice (SIGUSR1 from tutti-run, cloud metadata, the
  trigger file); ``run`` then commits and exits with 75 and tutti-run
  starts the job again at the new size.
* A broken communicator (``HorovodInternalError``: tutti's CommError,
  TimeoutError, AbortedError) ends the process (with
  TUTTI_EXIT_ON_COMM_FAILURE, tutti-run's default, tutti itself exits 76);
  tutti-run restarts the job.
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


def run(func):
    """Horovod's ``@hvd.elastic.run``: ``func(state, *args, **kwargs)`` runs
    once per process, from the newest commit.  A HostsUpdatedInterrupt
    commits and exits with 75 (SystemExit); a communication failure ends the
    process (its error propagates) so tutti-run restarts the job from the
    last commit."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not isinstance(state, State):
            raise _C.InvalidArgumentError(
                f"rank {_C.rank()}: tutti.torch.elastic.run: the first argument must be an "
                f"elastic State (TorchState, ObjectState), not {type(state).__name__}")
        state._begin(_restart_count())
        try:
            result = func(state, *args, **kwargs)
        except HostsUpdatedInterrupt as interrupt:
            state._leave(interrupt)
            raise   # not reached: _leave raises SystemExit
        except COMM_FAILURES as e:
            _runtime.log(f"{type(e).__name__}: the communicator cannot be repaired in this "
                         f"process; ending it so tutti-run restarts the job from commit "
                         f"{state.commit_step} (Horovod would restore in-process)")
            raise
        state._finish()
        return result

    return wrapper


__all__ = ["run", "configure", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HostsUpdatedInterrupt", "HorovodInternalError", "COMM_FAILURES"]
