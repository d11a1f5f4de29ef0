#!/usr/bin/env python3
"""tutti-run turns Open MPI 5's fault tolerance on by itself (--ulfm auto)
and checks completion (scripts/tutti_run/completion.py).  Exits 77 where
mpiexec is not Open MPI 5.

  run_ulfm_test.py PROBE MPIEXEC TUTTI_RUN PYTHON_PKG CASE

parse       no MPI: which mpirun options count as --with-ft and as a job on
            this host only.
auto        tutti-run with no --with-ft among the mpirun arguments, no
            checkpoint directory: ulfm_probe's elastic loop at 4 ranks, rank
            2 killed in step 5.  tutti-run says in-process recovery is on,
            starts the job once, the survivors recover, resume step 4 at 3
            ranks and the job completes (exit 0, no restart).
all-killed  every rank SIGKILLs itself after tutti::init() in the first
            attempt: Open MPI 5's mpiexec exits 0 under --with-ft ulfm, and
            tutti-run must count that as a failure (76) and restart, not call
            it completed; the second attempt finishes.
off         --ulfm off: the same program; mpiexec is started without
            --with-ft and tutti-run restarts on its non-zero status.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

probe, mpiexec, tutti_run, python_pkg, case = sys.argv[1:6]
HERE = os.path.dirname(os.path.abspath(__file__))
NP = 4

# Every rank: init, then in the first attempt SIGKILL itself; a restart ends
# cleanly.
ALL_KILLED = """
import os, signal, sys
import tutti
tutti.init()
if os.environ.get("TUTTI_RESTART_COUNT", "0") == "0":
    open(os.path.join(sys.argv[1], f"killed.{tutti.rank()}"), "w").close()
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
open(os.path.join(sys.argv[1], f"done.{tutti.rank()}"), "w").close()
tutti.shutdown()
"""


def open_mpi_major():
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return 0
    m = re.search(r"Open MPI\)? (\d+)\.", out.stdout + out.stderr)
    return int(m.group(1)) if m else 0


def parse_case():
    sys.path.insert(0, os.path.dirname(os.path.abspath(tutti_run)))
    from tutti_run import cli
    from tutti_run.completion import has_ft_option, runs_on_this_host_only
    v, hosts = cli.MPIRUN_VALUES, cli.HOST_OPTIONS
    problems = []
    for args, want in [(["-np", "4", "./a"], False), (["--with-ft", "ulfm", "./a"], True),
                       (["--with-ft=ulfm", "./a"], True),
                       (["--mca", "x", "--with-ft", "./a"], False),  # --mca's value
                       (["-np", "2", "./a", "--with-ft", "ulfm"], False)]:  # the program's
        if has_ft_option(args, v) != want:
            problems.append(f"has_ft_option({args}) != {want}")
    saved = {k: os.environ.pop(k) for k in ("SLURM_JOB_ID", "PBS_JOBID") if k in os.environ}
    for args, want in [(["-np", "4", "./a"], True), (["-H", "localhost:4", "./a"], True),
                       (["-H", "localhost,other:2", "./a"], False),
                       (["--hostfile", "f", "./a"], False), (["--host=other", "./a"], False),
                       (["./a", "-H", "other"], True)]:
        if runs_on_this_host_only(args, hosts, ["localhost"], v) != want:
            problems.append(f"runs_on_this_host_only({args}) != {want}")
    os.environ["SLURM_JOB_ID"] = "1"
    if runs_on_this_host_only(["-np", "4", "./a"], hosts, ["localhost"], v):
        problems.append("a Slurm allocation counted as this host only")
    del os.environ["SLURM_JOB_ID"]
    os.environ.update(saved)
    return problems


def run(tmp, program, extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "TUTTI_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               TUTTI_MEM_DIR=os.path.join(tmp, "mem"),
               PYTHONPATH=python_pkg + os.pathsep + os.environ.get("PYTHONPATH", ""))
    os.makedirs(env["TUTTI_MEM_DIR"], exist_ok=True)
    cmd = ([sys.executable, tutti_run, "--mpirun", mpiexec, "--backoff", "0",
            "--max-restarts", "2"] + extra + ["--", "--oversubscribe", "--bind-to", "none",
                                              "-np", str(NP)] + program)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    return p.returncode, p.stdout + p.stderr


def main():
    if case == "parse":
        problems = parse_case()
    elif open_mpi_major() < 5:
        print(f"skipped: {mpiexec} is not Open MPI 5 (no ULFM)")
        return 77
    else:
        problems = []
        tmp = tempfile.mkdtemp(prefix="tutti-run-ulfm-")
        out = os.path.join(tmp, "out")
        if case == "auto":
            # Open MPI 5.0.11's launcher sometimes ends such a job with 255
            # after the kill (docs/elastic.md): tutti-run then restarts it.
            # That attempt is run again, at most twice, and said so.
            for attempt in range(3):
                shutil.rmtree(out, ignore_errors=True)
                os.makedirs(out)
                rc, log = run(tmp, [probe, "elastic", out, "2:5", "8"], [])
                if "job failed with status 255" not in log or attempt == 2:
                    break
                print(f"attempt {attempt + 1}: the launcher ended the job (255); again")
            if "in-process recovery is not available here" in log:
                print("skipped: this tutti was built without ULFM")
                return 77
            if "in-process recovery on (Open MPI 5 `--with-ft ulfm`)" not in log:
                problems.append("tutti-run did not turn in-process recovery on")
            if rc != 0 or "job completed" not in log:
                problems.append(f"tutti-run exited {rc} without 'job completed'")
            if log.count("[tutti-run] starting ") != 1 or "restart 1" in log:
                problems.append("tutti-run started the job more than once")
            for r in (0, 1, 3):
                text = open(os.path.join(out, f"result.rank{r}")).read() \
                    if os.path.exists(os.path.join(out, f"result.rank{r}")) else ""
                if "resumed step=4 size=3" not in text or not text.rstrip().endswith("OK"):
                    problems.append(f"start rank {r}: {text!r}")
        else:
            os.makedirs(out)
            script = os.path.join(tmp, "all_killed.py")
            with open(script, "w") as f:
                f.write(ALL_KILLED)
            extra = ["--ulfm", "off"] if case == "off" else []
            rc, log = run(tmp, [sys.executable, script, out], extra)
            killed = sorted(n for n in os.listdir(out) if n.startswith("killed."))
            done = sorted(n for n in os.listdir(out) if n.startswith("done."))
            if len(killed) != NP:
                problems.append(f"the first attempt's ranks did not all die: {killed}")
            if rc != 0 or "job completed" not in log or len(done) != NP:
                problems.append(f"tutti-run exited {rc}; ranks done {done}")
            if "restart 1" not in log:
                problems.append("tutti-run did not restart after every rank was killed")
            flagged = "--with-ft ulfm" in log.split("[tutti-run] starting ", 1)[-1].split("\n")[0]
            if flagged != (case == "all-killed"):
                problems.append(f"mpiexec {'without' if case == 'all-killed' else 'with'} "
                                "--with-ft ulfm")
            if case == "all-killed" and "never shut tutti down" not in log:
                problems.append("tutti-run did not say why the exit 0 was a failure")
        if problems:
            print(log[-6000:])
        shutil.rmtree(tmp, ignore_errors=True)
    for p in problems:
        print("FAIL:", p)
    if not problems:
        print(f"{case}: OK")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
