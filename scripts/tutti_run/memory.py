"""The memory tier's directories on tutti-run's host (docs/launch.md,
"Memory tier"): the job id that keeps a job's commits across restarts,
the sweep of directories no live process holds, and the removal of the
job's own when the run ends.  The layout and rules are those of
src/checkpoint/memory_store.h: <TUTTI_MEM_DIR>/tutti-<uid>/<job key>/,
held by every process of the job with flock(LOCK_SH) on owner.lock."""
import fcntl
import os
import shutil
import socket
import stat
import time

LOCK = "owner.lock"


def job_id():
    """TUTTI_JOB_ID, else SLURM_JOB_ID, else a new id for this tutti-run
    (exported, so every restart of the job finds its commits)."""
    return (os.environ.get("TUTTI_JOB_ID") or os.environ.get("SLURM_JOB_ID") or
            f"run-{socket.gethostname().split('.')[0]}-{os.getpid()}-{int(time.time())}")


def job_key(job):
    """The directory name of `job`, as memory_job_key() computes it."""
    ok = 0 < len(job) <= 64 and job not in (".", "..") and all(
        c.isascii() and (c.isalnum() or c in "._-") for c in job)
    if ok:
        return job
    h = 0xcbf29ce484222325
    for b in job.encode():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"job-{h:016x}"


def root_dir():
    return (os.environ.get("TUTTI_MEM_DIR") or "/dev/shm").rstrip("/") or "/"


def user_dir():
    return os.path.join(root_dir(), f"tutti-{os.getuid()}")


def _private_user_dir(log):
    """user_dir() when it is safe to work in: the root is sticky or not
    writable by others (nobody can replace our entry), and the per-user
    directory is a real directory of ours, 0700.  None (logged) otherwise:
    never through a symlink or another user's directory."""
    root, path = root_dir(), user_dir()
    try:
        rs = os.stat(root)
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        log(f"memory tier: cannot check {path}: {e.strerror}")
        return None
    if (rs.st_mode & stat.S_IWOTH) and not (rs.st_mode & stat.S_ISVTX):
        log(f"memory tier: {root} is writable by every user without the sticky bit: not used")
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        log(f"memory tier: {path} is not a private directory of this user (a symbolic link, "
            "another user's, or open to others): left alone")
        return None
    return path


def hold(job, log):
    """Creates the job's directory and holds it (flock LOCK_SH on owner.lock)
    while tutti-run runs, so that no sweep on this host removes the job's
    commits between two attempts.  The descriptor, or None (logged)."""
    try:
        os.mkdir(user_dir(), 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        log(f"memory tier: cannot create {user_dir()}: {e.strerror}")
        return None
    base = _private_user_dir(log)
    if base is None:
        return None
    path = os.path.join(base, job_key(job))
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            log(f"memory tier: {path} is not a directory of this user: not held")
            return None
        fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW |
                     os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd
    except OSError as e:
        log(f"memory tier: cannot hold {path}: {e.strerror}")
        return None


def commits_dir(job):
    """Where tutti.torch.elastic's memory-tier commits of `job` lie on this host."""
    return os.path.join(user_dir(), job_key(job), "commits")


def _remove_if_unheld(path, young_s, log):
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return False
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        if time.time() - st.st_mtime < young_s:
            return False
        fd = None
    except OSError as e:
        log(f"memory tier: cannot check {path}: {e.strerror}")
        return False
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False   # a live process of that job holds it
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        if fd is not None:
            os.close(fd)


def sweep(keep_job, log, young_s=60.0):
    """Removes this user's job directories that no live process holds,
    except keep_job's.  Returns the removed paths."""
    base = _private_user_dir(log)
    if base is None:
        return []
    try:
        names = os.listdir(base)
    except OSError:
        return []
    keep = job_key(keep_job) if keep_job else None
    removed = [os.path.join(base, n) for n in sorted(names)
               if n != keep and _remove_if_unheld(os.path.join(base, n), young_s, log)]
    for p in removed:
        log(f"memory tier: removed {p}, left by a job that no longer runs")
    return removed


def remove_job(job, log):
    """The run ended: removes the job's directory unless a process still
    holds it.  True when it is gone."""
    base = _private_user_dir(log)
    if base is None:
        return True
    path = os.path.join(base, job_key(job))
    if not os.path.lexists(path):
        return True
    gone = _remove_if_unheld(path, 0.0, log)
    if not gone:
        log(f"memory tier: {path} is still held by a process of this job: left in place "
            "(the next tutti-run or tutti job on this host removes it once nothing holds it)")
    return gone
