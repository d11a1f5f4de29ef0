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
"""
import sys

from . import _C

#: Exit code of a process that stopped on a preemption notice after its
#: checkpoint committed (EX_TEMPFAIL); tutti-run restarts such a job.
PREEMPTED_EXIT_CODE = _C.PREEMPTED_EXIT_CODE


def available():
    """Always True: every build has the checkpoint and preemption layers
    (kept for scripts written when they were optional)."""
    return True


CheckpointManager = _C.CheckpointManager
PreemptionMonitor = _C.PreemptionMonitor
NoticeKind = _C.NoticeKind
PreemptionAction = _C.PreemptionAction
FreshStart = _C.FreshStart
list_checkpoints = _C.list_checkpoints
verify_checkpoint = _C.verify_checkpoint


def close_all():
    """Waits for in-flight saves and closes every CheckpointManager (runs at
    exit, before tutti.shutdown())."""
    _C._close_checkpoint_managers()


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
