"""tutti-run driving real jobs: deterministic resume after a SIGKILL at a
random step, resume on a different number of ranks, the launcher's
restart / signal / pass-through behaviour, and a SIGUSR1 that reaches
mpirun while it exits.

usage: tutti_run_test.py TINY_TRAIN TUTTI_RUN MPIEXEC CASE [NP [LATE_USR1_LIB]]
CASE: resume-random-kill | resume-4-to-2 | launcher | teardown-usr1 (needs
      LATE_USR1_LIB, the library built from late_usr1.c)
"""
import filecmp
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jobs import Job, fail, finish  # noqa: E402

TRAIN, TUTTI_RUN, MPIEXEC, CASE = sys.argv[1:5]
NP = int(sys.argv[5]) if len(sys.argv) > 5 else 2
LATE_USR1_LIB = sys.argv[6] if len(sys.argv) > 6 else None
MPI_OPTS = ["--oversubscribe", "--bind-to", "none"]


def mpirun(np, args, env=None, name="job"):
    return Job([MPIEXEC] + MPI_OPTS + ["-np", str(np)] + args, env=env, name=name)


def tutti_run(np, args, opts=(), env=None):
    return Job([sys.executable, TUTTI_RUN, "--mpirun", MPIEXEC] + list(opts) + MPI_OPTS +
               ["-np", str(np)] + args, env=env, name="tutti-run")


def run_ok(job, what, timeout=180):
    rc = job.wait(timeout)
    if rc != 0:
        fail(f"{what}: exit status {rc}\n{job.output()[-3000:]}")
    return rc == 0


def same_dumps(a, b, np, what):
    for r in range(np):
        fa, fb = f"{a}.rank{r}", f"{b}.rank{r}"
        if not (os.path.exists(fa) and os.path.exists(fb)):
            fail(f"{what}: missing state dump for rank {r}")
        elif not filecmp.cmp(fa, fb, shallow=False):
            fail(f"{what}: rank {r}'s final state differs from the uninterrupted run")


def case_resume_random_kill(tmp):
    steps = 40
    common = ["--steps", str(steps), "--save-every", "5", "--zero", "--compress"]
    ref = os.path.join(tmp, "ref")
    if not run_ok(mpirun(NP, [TRAIN, "--dir", ref + ".ckpt", "--out", ref] + common), "reference"):
        return
    seed = int(os.environ.get("TUTTI_TEST_SEED", str(int(time.time()))))
    rng = random.Random(seed)
    for k in range(2):
        kill_at = rng.randint(2, steps - 2)
        out = os.path.join(tmp, f"killed{k}")
        print(f"seed {seed}: SIGKILL at step {kill_at} (rank {kill_at % NP})", flush=True)
        job = tutti_run(NP, [TRAIN, "--dir", out + ".ckpt", "--out", out,
                             "--kill-at", str(kill_at)] + common,
                        opts=["--max-restarts", "2", "--backoff", "0.1"])
        if not run_ok(job, f"tutti-run with a kill at step {kill_at}"):
            continue
        o = job.output()
        resumed = job.wait_for(r"^RESUMED (\d+)", 1)
        # Killed before the first checkpoint committed: the restart starts fresh.
        fresh_again = o.splitlines().count("FRESH") == 2
        if "KILLING" not in o or "restart 1" not in o or not (resumed or fresh_again):
            fail(f"kill at {kill_at}: expected a kill, a restart and a resume:\n{o[-3000:]}")
            continue
        r = int(resumed.group(1)) if resumed else 0
        print(f"  resumed from step {r}, finished step {steps}", flush=True)
        if r > kill_at or r % 5 != 0:
            fail(f"kill at {kill_at}: resumed from step {r}")
        same_dumps(ref, out, NP, f"kill at step {kill_at}")


def case_resume_4_to_2(tmp):
    # Replicated parameters, ZeRO-sharded momentum, scaler state: a run of 4
    # ranks stopped at step 20 and continued on 2 ranks ends bit-identical
    # to 2 ranks (and 4 ranks) training all the way.
    base = ["--save-every", "10", "--zero"]
    ref2 = os.path.join(tmp, "ref2")
    ref4 = os.path.join(tmp, "ref4")
    run_ok(mpirun(2, [TRAIN, "--dir", ref2 + ".ckpt", "--steps", "40", "--out", ref2] + base), "ref2")
    run_ok(mpirun(4, [TRAIN, "--dir", ref4 + ".ckpt", "--steps", "40", "--out", ref4] + base), "ref4")
    d = os.path.join(tmp, "moving.ckpt")
    out = os.path.join(tmp, "moving")
    run_ok(mpirun(4, [TRAIN, "--dir", d, "--steps", "20"] + base), "4 ranks to step 20")
    job = mpirun(2, [TRAIN, "--dir", d, "--steps", "40", "--out", out] + base)
    if run_ok(job, "2 ranks from step 20"):
        if not job.wait_for(r"^RESUMED 20 from 4 ranks", 1):
            fail(f"4 -> 2: did not resume from step 20 of 4 ranks:\n{job.output()[-2000:]}")
        same_dumps(ref2, out, 2, "4 -> 2 ranks")
        if not filecmp.cmp(ref4 + ".rank0", out + ".rank0", shallow=False):
            fail("4 -> 2: the global state differs from the 4-rank run")
    # Per-rank compressor residuals cannot be resharded: a clear mismatch,
    # unless the program declares them optional (then they restart at zero).
    dc = os.path.join(tmp, "compress.ckpt")
    run_ok(mpirun(4, [TRAIN, "--dir", dc, "--steps", "20", "--compress"] + base), "4 ranks, compressor")
    job = mpirun(2, [TRAIN, "--dir", dc, "--steps", "30", "--compress"] + base)
    if job.wait(120) == 0 or not job.wait_for(r"compressor/residual/bucket\d' has global shape", 1):
        fail(f"4 -> 2 with per-rank residuals must fail naming the tensor:\n{job.output()[-2000:]}")
    job = mpirun(2, [TRAIN, "--dir", dc, "--steps", "30", "--compress", "--reset-compressor"] + base)
    if run_ok(job, "4 -> 2 with --reset-compressor"):
        if not job.wait_for(r"optional tensor 'compressor/residual/bucket0'.*keeps its current value", 1):
            fail("4 -> 2: the reset of the residuals was not logged")
        if not job.wait_for(r"^DONE 30", 1):
            fail("4 -> 2 with --reset-compressor did not finish")


def case_launcher(tmp):
    # Restarts with exponential backoff, TUTTI_RESTART_COUNT, final status.
    t0 = time.monotonic()
    job = tutti_run(1, ["sh", "-c", "echo ATTEMPT=$TUTTI_RESTART_COUNT; exit 3"],
                    opts=["--max-restarts", "2", "--backoff", "0.3"])
    rc = job.wait(60)
    took = time.monotonic() - t0
    attempts = [l for l in job.output().splitlines() if l.startswith("ATTEMPT=")]
    if rc != 3 or attempts != ["ATTEMPT=0", "ATTEMPT=1", "ATTEMPT=2"]:
        fail(f"failing job: status {rc}, attempts {attempts}\n{job.output()[-2000:]}")
    if took < 0.9:
        fail(f"backoff 0.3 s then 0.6 s, but all attempts took {took:.2f}s")
    # TUTTI_MAX_RESTARTS from the environment.
    job = tutti_run(1, ["sh", "-c", "echo ATTEMPT=$TUTTI_RESTART_COUNT; exit 5"],
                    opts=["--backoff", "0"], env={"TUTTI_MAX_RESTARTS": "1"})
    if job.wait(60) != 5 or sum(l.startswith("ATTEMPT=") for l in job.output().splitlines()) != 2:
        fail(f"TUTTI_MAX_RESTARTS=1 not honoured:\n{job.output()[-2000:]}")
    # A preemption exit (75) of the ranks themselves is restarted.
    job = tutti_run(1, ["sh", "-c", 'if [ "$TUTTI_RESTART_COUNT" = 0 ]; then exit 75; fi; echo SECOND'],
                    opts=["--backoff", "0"])
    if job.wait(60) != 0 or "SECOND" not in job.output():
        fail(f"exit 75 was not restarted:\n{job.output()[-2000:]}")
    # -np and --hostfile reach mpirun.
    hostfile = os.path.join(tmp, "hosts")
    with open(hostfile, "w") as f:
        f.write("localhost slots=3\n")
    # Each rank prints, then waits until all three printed before it exits
    # 7: the first non-zero exit makes mpirun abort the others, and a rank
    # still starting then never printed (failed 1 of 2 runs beside CPU hogs).
    marks = tempfile.mkdtemp(prefix="printed-", dir=tmp)
    job = Job([sys.executable, TUTTI_RUN, "--max-restarts", "0", "--mpirun", MPIEXEC,
               "--hostfile", hostfile, "-np", "3", "--bind-to", "none",
               "sh", "-c", "echo SIZE=$OMPI_COMM_WORLD_SIZE; touch " + marks +
               "/$OMPI_COMM_WORLD_RANK; while [ $(ls " + marks + " | wc -l) -lt 3 ]; "
               "do sleep 0.05; done; exit 7"], name="tutti-run")
    rc = job.wait(60)
    if rc != 7 or job.output().count("SIZE=3") != 3:
        fail(f"pass-through: status {rc} (expected 7)\n{job.output()[-2000:]}")
    # SIGTERM during the backoff: no further restart, the job's status.
    job = tutti_run(1, ["sh", "-c", "echo ATTEMPT; exit 4"], opts=["--backoff", "30"])
    if job.wait_for(r"restarting from the latest checkpoint in 30 s", 30):
        job.proc.send_signal(signal.SIGTERM)
    if job.wait(20) != 4 or job.output().splitlines().count("ATTEMPT") != 1:
        fail(f"SIGTERM during the backoff:\n{job.output()[-2000:]}")
    # --stop-timeout: a job that ignores the notice is terminated.
    job = tutti_run(1, ["sh", "-c", "trap '' USR1; echo READY; sleep 60"],
                    opts=["--stop-timeout", "1", "--max-restarts", "3"])
    if job.wait_for(r"^READY", 30):
        time.sleep(0.5)
        t0 = time.monotonic()
        job.proc.send_signal(signal.SIGTERM)
        rc = job.wait(30)
        took = time.monotonic() - t0
        if rc == 0 or took > 15 or "terminating it" not in job.output():
            fail(f"--stop-timeout: status {rc} after {took:.1f}s\n{job.output()[-2000:]}")
        if "restart 1" in job.output():
            fail("--stop-timeout: restarted after its own SIGTERM")
    else:
        fail("stop-timeout job did not start")
        job.kill()


def launcher_name():
    """The launcher process's name: Open MPI 5's mpiexec (a wrapper) execs
    prterun, which then runs and exits under that name.  MPIEXEC is the
    tests' script (tests/common/mpiexec.sh.in), which execs the real one,
    named by TUTTI_MPIEXEC_REAL."""
    real = os.environ.get("TUTTI_MPIEXEC_REAL") or MPIEXEC
    if os.path.exists(os.path.join(os.path.dirname(os.path.realpath(real)), "prterun")):
        return "prterun"
    return os.path.basename(real)


def late_usr1(marker, reset=False):
    """Environment that has late_usr1.c raise SIGUSR1 in mpirun's exit once
    `marker` exists (reset: after resetting it to the default action)."""
    env = {"LD_PRELOAD": LATE_USR1_LIB, "TUTTI_TEST_LATE_USR1_IN": launcher_name(),
           "TUTTI_TEST_LATE_USR1_AFTER": marker}
    if reset:
        env["TUTTI_TEST_LATE_USR1_RESET"] = "1"
    return env


def stop_when(job, ready, count, marker, what):
    """Waits for `count` lines `ready`, creates marker and sends SIGTERM to
    tutti-run; the job's status, or None (it did not get ready)."""
    deadline = time.monotonic() + 60
    while job.output().splitlines().count(ready) < count and time.monotonic() < deadline:
        if job.proc.poll() is not None:
            break
        time.sleep(0.05)
    if job.output().splitlines().count(ready) < count:
        fail(f"{what}: no {count} '{ready}' lines:\n{job.output()[-3000:]}")
        job.kill()
        return None
    open(marker, "w").close()
    job.proc.send_signal(signal.SIGTERM)
    return job.wait(60)


def case_teardown_usr1(tmp):
    # tutti-run repeats SIGUSR1 to mpirun while the job runs; one can reach
    # mpirun after it put its original disposition back while exiting.
    # late_usr1.c makes that happen in every run (by timing alone: once in
    # many, and then the clean stop was reported as "status 138").
    mpiexec = launcher_name()
    # Each rank also leaves a file when the notice reaches it: Open MPI 5's
    # prterun loses a rank's last output line at teardown (2 in 16 raw runs:
    # both files written, one GOT_USR1 line printed), so the count comes from
    # the files.
    got = os.path.join(tmp, "got")
    os.makedirs(got)
    prog = ["sh", "-c", f"trap 'echo GOT_USR1; touch {got}/$$; exit 75' USR1; "
            "echo SIGIGN=$(awk '/^SigIgn/ {print $2}' /proc/$$/status); echo READY; "
            "sleep 30 & wait"]
    # Open MPI 4.1's mpirun restores the disposition it started with, which
    # tutti-run makes "ignore" (and the ranks still start with the default);
    # Open MPI 5's prterun keeps its own handler to the end.  Either way the
    # late signal must not kill it.
    marker = os.path.join(tmp, "notice-1")
    job = tutti_run(NP, prog, opts=["--max-restarts", "3"], env=late_usr1(marker))
    what = "a SIGUSR1 in mpirun's exit"
    rc = stop_when(job, "READY", NP, marker, what)
    out = job.output()
    lines = out.splitlines()
    masks = [int(l[7:], 16) for l in lines if re.fullmatch(r"SIGIGN=[0-9a-f]{16}", l)]
    if rc is None:
        pass
    elif rc != 75 or "restart 1" in out:
        fail(f"{what}: status {rc}, expected 75 and no restart (138: the SIGUSR1 killed "
             f"mpirun):\n{out[-3000:]}")
    elif not any(f"late-usr1: SIGUSR1 raised in {mpiexec}'s exit (disposition {d})" in lines
                 for d in ("ignored", "handled")) or \
            f"late-usr1: {mpiexec} survived it" not in lines:
        fail(f"{what}: mpirun did not exit with SIGUSR1 ignored:\n{out[-3000:]}")
    elif len(os.listdir(got)) != NP or len(masks) != NP or \
            any(mask >> (signal.SIGUSR1 - 1) & 1 for mask in masks):
        fail(f"{what}: every rank must start with SIGUSR1's default action and get the "
             f"notice:\n{out[-3000:]}")
    elif not job.wait_for(r"\[tutti-run\] status 75 is a clean preemption stop .*mpirun's "
                          r"\"job has been aborted\" banners above are expected", 1):
        fail(f"{what}: no line saying the stop was clean:\n{out[-3000:]}")
    else:
        print(f"{what}: ignored, clean stop with 75", flush=True)
    # A launcher that resets SIGUSR1 to the default action dies of it: with a
    # checkpoint committed since the notice that is the stop it was (75) ...
    d = os.path.join(tmp, "ckpt")
    marker = os.path.join(tmp, "notice-2")
    job = tutti_run(NP, [TRAIN, "--dir", d, "--steps", "1000000", "--save-every", "40",
                         "--step-ms", "20"],
                    opts=["--max-restarts", "3", "--ckpt-dir", d], env=late_usr1(marker, True))
    what = "mpirun killed in its exit, stop checkpoint committed"
    rc = stop_when(job, "FRESH", 1, marker, what)
    out = job.output()
    m = job.wait_for(r"^PREEMPTED (\d+)", 1)
    if rc is None:
        pass
    elif not job.wait_for(rf"^late-usr1: SIGUSR1 raised in {re.escape(mpiexec)}'s exit \(.*, reset to "
                          r"default first\)$", 1) or "survived it" in out:
        fail(f"{what}: mpirun was not killed in its exit:\n{out[-3000:]}")
    elif rc != 75 or not m or not job.wait_for(
            rf"\[tutti-run\] mpirun was killed by a SIGUSR1 that tutti-run forwarded .*after the "
            rf"job committed step {m.group(1)} following the notice: counted as the preemption "
            rf"stop \(75\)", 1):
        fail(f"{what}: status {rc}, expected 75 with the reason:\n{out[-3000:]}")
    elif "clean preemption stop" in out or "restart 1" in out:
        fail(f"{what}: reported as a plain clean stop, or restarted:\n{out[-3000:]}")
    else:
        print(f"{what}: counted as the stop at step {m.group(1)}", flush=True)
    # ... and without a checkpoint directory to check, the signal death it is.
    marker = os.path.join(tmp, "notice-3")
    job = tutti_run(NP, prog, opts=["--max-restarts", "3"],
                    env=dict(late_usr1(marker, True), TUTTI_CKPT_DIR=""))
    what = "mpirun killed in its exit, nothing to check"
    rc = stop_when(job, "READY", NP, marker, what)
    out = job.output()
    if rc is not None and (rc != 138 or "restart 1" in out or not job.wait_for(
            r"no checkpoint committed since the notice \(tutti-run cannot check: no --ckpt-dir "
            r"or TUTTI_CKPT_DIR\), so the ranks' own exit statuses are unknown: counted as a "
            r"failure \(status 138\)", 1)):
        fail(f"{what}: status {rc}, expected 138 with the reason:\n{out[-3000:]}")
    elif rc is not None:
        print(f"{what}: 138, explained", flush=True)


tmp = tempfile.mkdtemp(prefix="tutti-run-test-")
try:
    {"resume-random-kill": case_resume_random_kill, "resume-4-to-2": case_resume_4_to_2,
     "launcher": case_launcher, "teardown-usr1": case_teardown_usr1}[CASE](tmp)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
finish(f"tutti-run case '{CASE}'")
