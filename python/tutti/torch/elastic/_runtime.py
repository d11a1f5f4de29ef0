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
_objects = {"manager": None, "monitor": None}
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


def manager():
    """Where commits go (made on first use, collective): the memory tier
    (node-local shared memory, copied to a buddy on the next host), and
    TUTTI_CKPT_DIR / configure(ckpt_dir=) when set, as the safety net; a load
    takes the newest commit complete in either (include/tutti/commit_tiers.h,
    docs/elastic.md "Commits: the memory tier and the directory").  Raises
    InvalidArgumentError when there is no directory and the memory tier
    cannot serve the job."""
    if _objects["manager"] is None:
        try:
            _objects["manager"] = _C._CommitTiers(
                _C.world(), ckpt_dir(), keep_last=int(_config["keep_last"]),
                async_save=bool(_config["async_commit"]))
        except _C.InvalidArgumentError as e:
            raise error(_C.InvalidArgumentError, f"tutti.torch.elastic: {e}") from e
    return _objects["manager"]


def reopen():
    """After tutti.recover(): the commit managers again, over the new world
    (the old ones' communicators were released by the recovery)."""
    if _objects["manager"] is not None:
        _objects["manager"].reopen(_C.world())


def finish():
    """The training function returned on every rank: the job's memory-tier
    commits are not needed any more (removed once per host; the directory's
    stay)."""
    mgr = _objects["manager"]
    if mgr is not None:
        mgr.wait()
        mgr.finish()


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
