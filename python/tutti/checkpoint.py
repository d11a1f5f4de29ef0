"""Spot-safe checkpoints and preemption notices.

    mgr = tutti.CheckpointManager(tutti.world(), "/ckpt", keep_last=3)
    monitor = tutti.PreemptionMonitor()           # SIGTERM, cloud metadata, ...
    res = mgr.load({"model": params, "scaler": scaler})   # None: fresh start
    start = res["step"] if res else 0
    for step in range(start + 1, steps + 1):
        train_step()
        if monitor.should_stop():                   # collective: all ranks agree
            mgr.save(step, state, {"data_position": pos})
            mgr.wait()
            tutti.exit_preempted()                  # exit code 75: tutti-run restarts
        if step % 500 == 0:
            mgr.save(step, state, {"data_position": pos})

``state`` maps a component name to a tutti Stateful (loss scaler,
compressor, tensor-parallel layer) or to a dict ``name -> tensor`` or
``name -> (tensor, shard)`` where ``shard`` is
``{"global_shape", "dim", "offset", "group", "flat", "per_rank"}``
(replicated when omitted; ``per_rank``: every rank's own value, stored as
row ``rank`` of ``[world, ...]``; at another world size such a tensor must
be listed in ``optional`` and keeps its value).  ``CheckpointManager(...,
fresh_start=FreshStart.REFUSE, file_mode=0o600, dir_mode=0o700)`` and
``load(..., resume=False)`` (a read-only load) mirror the C++ options;
``PreemptionMonitor.decide()`` returns a ``PreemptionAction`` (``SAVE_NOW``
on an AWS rebalance recommendation: save, keep training).  Checkpoints are safetensors shards plus a manifest
(docs/checkpoint.md); ``tutti.torch.checkpoint`` saves a whole PyTorch
training state.

The classes exist when the C++ checkpoint/preemption layers are part of the
build (``available()``); otherwise using them raises UnsupportedError.
"""
import sys

from . import _C

#: Exit code of a process that stopped on a preemption notice after its
#: checkpoint committed (EX_TEMPFAIL); tutti-run restarts such a job.
PREEMPTED_EXIT_CODE = getattr(_C, "PREEMPTED_EXIT_CODE", 75)


def available():
    """True when this build has the checkpoint and preemption layers."""
    return hasattr(_C, "CheckpointManager") and hasattr(_C, "PreemptionMonitor")


def _missing(what):
    def fail(*_args, **_kwargs):
        raise _C.UnsupportedError(
            f"{what}: this build of tutti has no checkpoint/preemption layer "
            "(include/tutti/checkpoint.h and preemption.h were not part of the tree "
            "it was built from)")
    fail.__name__ = what
    fail.__doc__ = f"{what}: not in this build (raises UnsupportedError)."
    return fail


CheckpointManager = getattr(_C, "CheckpointManager", None) or _missing("CheckpointManager")
PreemptionMonitor = getattr(_C, "PreemptionMonitor", None) or _missing("PreemptionMonitor")
NoticeKind = getattr(_C, "NoticeKind", None)
PreemptionAction = getattr(_C, "PreemptionAction", None)
FreshStart = getattr(_C, "FreshStart", None)
list_checkpoints = getattr(_C, "list_checkpoints", None) or _missing("list_checkpoints")
verify_checkpoint = getattr(_C, "verify_checkpoint", None) or _missing("verify_checkpoint")


def close_all():
    """Waits for in-flight saves and closes every CheckpointManager (runs at
    exit, before tutti.shutdown())."""
    close = getattr(_C, "_close_checkpoint_managers", None)
    if close is not None:
        close()


def exit_preempted():
    """After the final checkpoint committed: closes the checkpoint managers,
    shuts tutti down and exits with PREEMPTED_EXIT_CODE (SystemExit, so
    Python's own cleanup runs)."""
    close_all()
    _C.shutdown()
    sys.exit(PREEMPTED_EXIT_CODE)


__all__ = ["CheckpointManager", "PreemptionMonitor", "NoticeKind", "PreemptionAction",
           "FreshStart", "PREEMPTED_EXIT_CODE",
           "available", "close_all", "exit_preempted", "list_checkpoints",
           "verify_checkpoint"]
