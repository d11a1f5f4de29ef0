"""A SIGKILLed Open MPI 5 launcher leaves <tmpdir>/ompi.<pid> behind, with
PMIx's rendezvous files in it; the next launcher that is given that pid stops
at once with "The PMIx server's listener thread failed to start" (exit 213),
before any rank runs.  This failed a CI run (compression_residual_resize_3to3)
after the elastic tests had SIGKILLed launchers earlier in the suite.

Each launch below runs with a private TMPDIR in which leftover directories
(copies of what a killed launcher leaves) are made for the next SPAN pids,
and the kernel's next pid is set to the first of them, so the launcher's pid
falls among them.

  raw        the real mpiexec: must fail with 213 and the message (shows the
             hazard is real, so the other cases can fail)
  wrapper    the tests' mpiexec (tests/common/mpiexec.sh.in): the job runs
  tutti-run  tutti-run over the real mpiexec: the job runs in its first
             attempt (no restart) and the leftover named after mpirun's pid
             is gone

Needs a writable /proc/sys/kernel/ns_last_pid (root, as in CI): exits 77
(skipped) without one.

usage: launcher_leftovers_test.py TUTTI_RUN REAL_MPIEXEC TEST_MPIEXEC
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile

TUTTI_RUN, REAL, WRAPPER = sys.argv[1:4]
NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"
SPAN = 400
# The rendezvous files carry the launcher's node name (short, as PRRTE keeps it).
HOSTS = sorted({socket.gethostname(), socket.gethostname().split(".")[0]})
MESSAGE = "The PMIx server's listener thread failed to start"
failures = []


def pid_max():
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read())


def plant(tmpdir):
    """Leftovers for the next SPAN pids (none wraps past pid_max); sets the
    next pid to the first.  Returns the pids planted."""
    with open(NS_LAST_PID) as f:
        last = int(f.read())
    first = last + 50
    if first + SPAN >= pid_max():
        first = 1000
    pids = range(first, first + SPAN)
    for pid in pids:
        d = os.path.join(tmpdir, f"ompi.{pid}")
        os.makedirs(d, mode=0o700, exist_ok=True)
        for host in HOSTS:
            text = f"prterun-{host}-{pid}@0.0;tcp4://127.0.0.1:1\n5.0.11\n{pid}\n0:0\n"
            for name in (f"pmix.{host}.tool", f"pmix.{host}.tool.{pid}",
                         f"pmix.{host}.tool.prterun-{host}-{pid}@0"):
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
    with open(NS_LAST_PID, "w") as f:
        f.write(str(first - 1))
    return pids


def left(tmpdir, pids):
    return {p for p in pids if os.path.isdir(os.path.join(tmpdir, f"ompi.{p}"))}


def launch(case, cmd):
    tmpdir = tempfile.mkdtemp(prefix=f"tutti-leftovers-{case}-")
    try:
        env = dict(os.environ, TMPDIR=tmpdir)
        env.pop("PRTE_MCA_prte_tmpdir_base", None)
        pids = plant(tmpdir)
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=120)
        gone = set(pids) - left(tmpdir, pids)
        print(f"{case}: exit {r.returncode}, {len(gone)} leftover(s) removed", flush=True)
        return r, gone
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def main():
    try:
        with open(NS_LAST_PID, "w") as f:
            f.write(open(NS_LAST_PID).read())
    except OSError as e:
        print(f"skipped: cannot set the next pid ({NS_LAST_PID}: {e})")
        return 77
    job = ["--oversubscribe", "--bind-to", "none", "-np", "2", "true"]

    r, _ = launch("raw", [REAL] + job)
    if r.returncode != 213 or MESSAGE not in r.stdout:
        failures.append(f"raw: the real mpiexec was expected to stop with 213 and '{MESSAGE}' "
                        f"(the hazard these cases guard against); got {r.returncode}:\n"
                        f"{r.stdout[-2000:]}")

    r, gone = launch("wrapper", [WRAPPER] + job)
    if r.returncode != 0:
        failures.append(f"wrapper: exit {r.returncode}:\n{r.stdout[-2000:]}")

    r, gone = launch("tutti-run", [sys.executable, TUTTI_RUN, "--mpirun", REAL,
                                   "--max-restarts", "0"] + job)
    if r.returncode != 0:
        failures.append(f"tutti-run: exit {r.returncode}:\n{r.stdout[-3000:]}")
    elif r.stdout.count("[tutti-run] starting ") != 1:
        failures.append(f"tutti-run: the job did not run in one attempt:\n{r.stdout[-3000:]}")
    if len(gone) != 1:
        failures.append(f"tutti-run: expected the one leftover named after mpirun's pid to be "
                        f"removed, {len(gone)} were")

    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
