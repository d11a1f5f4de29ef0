"""The process-wide parts of tutti.torch.elastic: the checkpoint manager that
commits go to, the preemption monitor, and the host-update check."""
import json
import os
import signal
import sys
import time

import torch

from ... import _C
from ... import checkpoint as _ckpt
from .._util import error
from ..mpi_ops import Max, allreduce

# Settings of configure(); None: the default.
_config = {"ckpt_dir": None, "keep_last": 0, "async_commit": False, "monitor": None}
_objects = {"manager": None, "monitor": None, "memory_tier": None, "warned_budget": False}
# Files older than this process (less a margin for clock skew between the
# launcher's host and this one) were written for an earlier job.
_STARTED = time.time()
_CLOCK_SLACK_S = 2.0
RESIZE_FILE = "resize-requested"


def configure(ckpt_dir=None, keep_last=None, async_commit=None, monitor=None):
    """Where and how commits are written; call before the first commit.
    ``ckpt_dir``: default TUTTI_CKPT_DIR.  ``keep_last``: checkpoints kept
    (0: TUTTI_CKPT_KEEP).  ``async_commit``: commit() returns once the state
    is copied, not written (a crash may then lose the newest commit).
    ``monitor``: your own tutti.PreemptionMonitor (one process owns the
    signal handlers), else one is made with the TUTTI_PREEMPT_* settings."""
    if _objects["manager"] is not None and (ckpt_dir is not None or keep_last is not None
                                           or async_commit is not None):
        raise error(_C.InvalidArgumentError,
                    "tutti.torch.elastic.configure: the checkpoint manager exists already "
                    "(configure before the first TorchState commit or elastic.run)")
    for key, value in (("ckpt_dir", ckpt_dir), ("keep_last", keep_last),
                       ("async_commit", async_commit)):
        if value is not None:
            _config[key] = value
    if monitor is not None:
        if _objects["monitor"] is not None and _objects["monitor"] is not monitor:
            raise error(_C.InvalidArgumentError,
                        "tutti.torch.elastic.configure: a preemption monitor is in use already")
        _objects["monitor"] = monitor


def ckpt_dir():
    return _config["ckpt_dir"] or os.environ.get("TUTTI_CKPT_DIR", "")


def memory_tier():
    """Without a checkpoint directory, commits go to the memory tier: this
    job's directory in the node's shared memory (docs/python_checkpoint.md,
    "Elastic"), which a restart on the same host reloads from RAM.  Its
    info dict, or raises why it cannot serve this job.  On several hosts each
    rank's commit files are also copied to a buddy rank on the next host
    (docs/checkpoint.md, "Memory tier"), so that a restart after a lost host
    resumes from memory."""
    if _objects["memory_tier"] is None:
        # A failure on one rank (a bad directory, an I/O error) must not leave
        # the others waiting in the first collective: agree, then raise.
        tier, problem = None, None
        try:
            tier = _C._open_memory_tier()
        except _C.Error as e:
            problem = e
        failed = allreduce(torch.tensor([0 if problem is None else 1], dtype=torch.int64),
                           op=Max, name="tutti.elastic.memory_tier").item()
        if failed:
            why = str(problem) if problem is not None else "it failed on another rank (see its error)"
            raise error(_C.InvalidArgumentError,
                        f"tutti.torch.elastic: no checkpoint directory for commits, and the "
                        f"memory tier cannot keep them: {why} (or set TUTTI_CKPT_DIR)")
        _objects["memory_tier"] = tier
    return _objects["memory_tier"]


def manager():
    """The CheckpointManager commits go to (made on first use, collective):
    TUTTI_CKPT_DIR / configure(ckpt_dir=), else the memory tier."""
    if _objects["manager"] is None:
        path = ckpt_dir()
        kwargs = {"keep_last": int(_config["keep_last"]),
                  "async_save": bool(_config["async_commit"])}
        if not path:
            path = os.path.join(memory_tier()["dir"], "commits")
            kwargs["keep_last"] = kwargs["keep_last"] or 1   # the next one is written beside it
            # An empty memory tier after a restart (the host rebooted, or the
            # job died before its first commit) can only start fresh; the
            # durable tier's "history expected" refusal is for directories.
            kwargs["fresh_start"] = _C.FreshStart.ALLOW
        _objects["manager"] = _ckpt.CheckpointManager(_C.world(), path, **kwargs)
    return _objects["manager"]


def commit_fits(estimate=0):
    """Collective: True unless the memory tier's budget cannot hold another
    commit beside the ones it keeps (memory_tier_has_room: the job's
    directory now plus the larger of the newest commit's size and
    `estimate`, the bytes of the state to be saved).  Said once at WARN; the
    same verdict on every rank (a local failure counts as "does not fit")."""
    tier = _objects["memory_tier"]
    if ckpt_dir() or tier is None:
        return True
    try:
        fits, why = _C._memory_tier_has_room(os.path.join(tier["dir"], "commits"), int(estimate))
    except _C.Error as e:
        fits, why = False, f"cannot measure {tier['dir']}: {e}"
    agreed = allreduce(torch.tensor([0 if fits else 1], dtype=torch.int64), op=Max,
                       name="tutti.elastic.memory_budget").item() == 0
    if not agreed and not _objects["warned_budget"]:
        _objects["warned_budget"] = True
        if _C.rank() == 0:
            log(f"{why or 'another rank has no room in its memory tier'}: commits are kept "
                "in this process only (restore() works; a restart resumes from the last "
                "commit that fitted)")
    return agreed


def finish():
    """The training function returned on every rank: the job's memory-tier
    commits are not needed any more (removed once per host)."""
    if _objects["memory_tier"] is not None and not ckpt_dir():
        mgr = _objects["manager"]
        if mgr is not None:
            mgr.close()
            _objects["manager"] = None
        allreduce(torch.zeros(1), name="tutti.elastic.finish")  # every rank closed its manager
        if _C.local_rank() == 0:
            _C._remove_memory_tier()


def monitor():
    """The PreemptionMonitor (made on first use: it installs the signal
    handlers, so SIGUSR1 from tutti-run becomes a notice, not a death)."""
    if _objects["monitor"] is None:
        try:
            _objects["monitor"] = _ckpt.PreemptionMonitor()
        except _C.InvalidArgumentError as e:
            raise error(_C.InvalidArgumentError,
                        f"tutti.torch.elastic: cannot make a PreemptionMonitor ({e}); if this "
                        "program has one, pass it: tutti.torch.elastic.configure(monitor=m)") from e
    return _objects["monitor"]


def exit_for_restart():
    """After the final commit landed: SystemExit(75) through
    tutti.exit_preempted(), ignoring further SIGUSR1/SIGUSR2.  tutti-run
    repeats its SIGUSR1 until the job has ended, and the monitor's handlers
    go when it closes (at interpreter exit at the latest): a repeat arriving
    during the teardown killed a rank that had committed (status 138)."""
    mon = _objects["monitor"]
    if mon is not None:
        mon.close()
    try:
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)
    except ValueError:      # not the main thread: Python cannot set handlers
        pass
    _ckpt.exit_preempted()


def resize_request():
    """tutti-run's $TUTTI_ELASTIC_DIR/resize-requested written for this job
    (newer than this process, asking for another size): its JSON, else None."""
    d = os.environ.get("TUTTI_ELASTIC_DIR", "")
    if not d:
        return None
    path = os.path.join(d, RESIZE_FILE)
    try:
        if os.stat(path).st_mtime < _STARTED - _CLOCK_SLACK_S:
            return None
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        log(f"cannot read {path}: {e}; treating it as a resize request")
        return {"path": path}
    try:
        request = json.loads(text) if text.strip() else {}
    except ValueError:
        request = {}
    if not isinstance(request, dict):
        request = {}
    size = request.get("np", request.get("size"))
    if isinstance(size, int) and size == _C.size():
        return None          # the size this job already runs at
    request["path"] = path
    return request


def host_updates():
    """Collective: None, or why the job must stop now (identical on every
    rank): a resize request from tutti-run, or an agreed preemption notice."""
    mon = monitor()
    resize = resize_request() if _C.rank() == 0 else None
    kind = mon.local().value if mon is not None else 0
    size = (resize or {}).get("np", (resize or {}).get("size"))
    flags = torch.tensor([1 if resize is not None else 0, kind,
                          size if isinstance(size, int) else 0], dtype=torch.int32)
    agreed = allreduce(flags, op=Max, name="tutti.elastic.host_updates").tolist()
    if agreed[0]:
        return ("tutti-run asked for a resize" + (f" to {agreed[2]} ranks" if agreed[2] else "")
                + f" ({os.path.join(os.environ.get('TUTTI_ELASTIC_DIR', ''), RESIZE_FILE)})")
    if mon is None or agreed[1] == _C.NoticeKind.NONE.value:
        return None
    if agreed[1] == _C.NoticeKind.REBALANCE.value and not mon.should_stop(_C.world()):
        return None   # an early warning: the commit that ran just now is the answer
    notice = mon.notice()
    if notice:
        return f"preemption notice ({notice.get('source', '?')}: {notice.get('detail', '')})"
    return "another rank received a preemption notice"


def log(message):
    rank = _C.rank() if _C.initialized() else 0
    sys.stderr.write(f"[tutti elastic] rank {rank}: {message}\n")
    sys.stderr.flush()
