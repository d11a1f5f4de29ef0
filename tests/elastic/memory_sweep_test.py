"""tutti-run's side of the memory tier (scripts/tutti_run/memory.py), no MPI:
the job key matches the library's rule; hold() keeps the job's directory
from any sweep between attempts; a sweep removes directories no process
holds (a killed job's), keeps held ones, and never works through a symlink
or another user's (or a world-open) per-user directory; remove_job() removes
the job's directory once nothing holds it.
usage: memory_sweep_test.py SCRIPTS_DIR"""
import fcntl
import os
import sys
import tempfile
import time

sys.path.insert(0, sys.argv[1])
from tutti_run import memory  # noqa: E402

logs = []


def log(m):
    logs.append(m)


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}\n" + "\n".join(logs))
        sys.exit(1)


root = tempfile.mkdtemp(prefix="tutti-memsweep-")
os.environ["TUTTI_MEM_DIR"] = root
user = os.path.join(root, f"tutti-{os.getuid()}")

# The key rule of src/checkpoint/memory_store.cc (memory_job_key).
check(memory.job_key("run-1.a_b") == "run-1.a_b", "a plain id is its own key")
check(memory.job_key("a/b").startswith("job-") and len(memory.job_key("a/b")) == 20,
      "an unsafe id is hashed")
check(memory.job_key("café") != "café", "non-ASCII ids are hashed")

# A symlink planted at the per-user directory: nothing behind it is touched.
victim = os.path.join(root, "victim")
os.makedirs(os.path.join(victim, "old-project"))
past = time.time() - 600
os.utime(os.path.join(victim, "old-project"), (past, past))
os.symlink(victim, user)
check(memory.sweep("", log) == [], "a sweep through a symlink removed something")
check(os.path.isdir(os.path.join(victim, "old-project")), "a file behind the symlink is gone")
check(memory.hold("job-x", log) is None, "hold() went through a symlink")
os.unlink(user)

# hold() creates and holds the job's directory; a sweep by another job keeps
# it; a killed job's directory (nobody holds it) goes.
fd = memory.hold("current", log)
check(fd is not None, "hold() failed")
check(oct(os.stat(user).st_mode & 0o777) == "0o700", "the per-user directory is not 0700")
os.makedirs(os.path.join(user, "killed", "commits"))
open(os.path.join(user, "killed", "owner.lock"), "w").close()
removed = memory.sweep("other-job", log)
check(removed == [os.path.join(user, "killed")], f"sweep removed {removed}")
check(os.path.isdir(os.path.join(user, "current")), "the held directory was swept")
# remove_job() leaves a held directory in place, removes it once released.
check(memory.remove_job("current", log) is False, "remove_job() removed a held directory")
os.close(fd)
check(memory.remove_job("current", log) is True, "remove_job() kept a released directory")
check(not os.path.exists(os.path.join(user, "current")), "the job's directory is still there")
# A per-user directory open to others is left alone.
os.makedirs(os.path.join(user, "old"))
open(os.path.join(user, "old", "owner.lock"), "w").close()
os.chmod(user, 0o777)
check(memory.sweep("", log) == [], "a world-open per-user directory was swept")
os.chmod(user, 0o700)
check(len(memory.sweep("", log)) == 1, "the sweep did not remove the unheld directory")
print("memory_sweep: OK")
