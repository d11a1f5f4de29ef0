#!/usr/bin/env python3
"""tutti::ElasticState and elastic_run (include/tutti/elastic.h) with real
jobs under tutti-run: elastic_cpp_probe at 2 ranks, 12 steps, a commit
every 3 steps.

  elastic_cpp_test.py PROBE TUTTI_RUN MPIEXEC CASE

kill    no checkpoint directory: rank 1 dies before step 8; tutti-run
        restarts the job, which resumes from the commit of step 6 in the
        memory tier, calls the reset callbacks, and ends with the closed-form
        state; tutti-run removes the job's memory-tier directory.
notice  rank 1 gets SIGUSR1 before step 5: every rank stops at the commit of
        step 6 and exits 75; the restarted job resumes there.
dir     as kill, with TUTTI_CKPT_DIR: every commit goes to the memory tier and
        the directory; the restart resumes from the memory tier, and the
        directory holds steps 3 and 6.
dir-every
        TUTTI_COMMIT_DURABLE_EVERY=2, rank 1 dies before step 11: the
        directory holds only step 6 (the 2nd commit), the memory tier step 9;
        the restart resumes from step 9, from the memory tier.
dir-lost
        as dir-every, but rank 1 removes the memory tier before it dies (a
        host reboot): the restart resumes from step 6 in the directory and
        says why.
"""
import json
import os
import subprocess
import sys
import tempfile

probe, tutti_run, mpiexec, case = sys.argv[1:5]
STEPS = 12


def closed_form(steps):
    w = 1.0
    for s in range(1, steps + 1):
        w = w / 2 + s
    return w


def main():
    tmp = tempfile.mkdtemp(prefix="tutti-elastic-cpp-")
    out, mem = os.path.join(tmp, "out"), os.path.join(tmp, "mem")
    os.makedirs(out)
    os.makedirs(mem)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "TUTTI_RESTART_COUNT"))}
    env.update(TUTTI_MEM_DIR=mem, TUTTI_PREEMPT_SOURCES="signals", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("TUTTI_CKPT_DIR", None)
    env.pop("TUTTI_JOB_ID", None)
    args = ["--steps", str(STEPS), "--out", out]
    resume = 6   # the step the restarted job resumes from
    if case in ("kill", "dir"):
        args += ["--kill", "1:8"]
    elif case in ("dir-every", "dir-lost"):
        args += ["--kill", "1:11"]
        env["TUTTI_COMMIT_DURABLE_EVERY"] = "2"
        resume = 9 if case == "dir-every" else 6
        if case == "dir-lost":
            args += ["--wipe-memory", "1"]
    else:
        args += ["--notice", "1:5"]
    if case.startswith("dir"):
        env["TUTTI_CKPT_DIR"] = os.path.join(tmp, "ckpt")
        env["TUTTI_LOG_LEVEL"] = "info"
    cmd = [sys.executable, tutti_run, "--mpirun", mpiexec, "--backoff", "0",
           "--max-restarts", "1", "--", "--oversubscribe", "--bind-to", "none", "-np", "2",
           probe] + args
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    log = p.stdout + p.stderr
    problems = []
    if p.returncode != 0:
        problems.append(f"tutti-run exited {p.returncode}")
    wants = ["stopped on a preemption notice" if case == "notice" else "failed with status 9"]
    if case != "notice":
        wants.append(f"the committed step advanced to {resume}")
    if case in ("dir", "dir-every"):
        wants.append(f"the commit of step {resume} came from the memory tier")
    if case == "dir-lost":
        wants.append("the memory tier holds no complete commit")
    for want in wants:
        if want not in log:
            problems.append(f"'{want}' not in the log")
    for r in (0, 1):
        with open(os.path.join(out, f"events.rank{r}")) as f:
            ev = f.read().split("\n")
        ev = [e for e in ev if e]
        if ev != ["start 0 0", "reset", f"start 1 {resume}"]:
            problems.append(f"rank {r} events {ev}, expected a fresh start, then the reset "
                            f"callbacks and a resume from step {resume}")
    with open(os.path.join(out, "result.json")) as f:
        res = json.load(f)
    if res["w"] != [closed_form(STEPS)] * 4:
        problems.append(f"w = {res['w']}, closed form {closed_form(STEPS)}")
    user = os.path.join(mem, f"tutti-{os.getuid()}")
    left = os.listdir(user) if os.path.isdir(user) else []
    if left:
        problems.append(f"the memory tier still holds {left} after the run")
    if case.startswith("dir"):
        # The directory after the run: its commits before the kill, and the
        # restarted job's (step 12: the 1st commit after the restart in
        # dir-every and dir-lost is memory-only; in dir every commit goes).
        steps = sorted(int(n[5:]) for n in os.listdir(env["TUTTI_CKPT_DIR"])
                       if n.startswith("step-") and n[5:].isdigit())
        expect = {"dir": [3, 6, 9, 12], "dir-every": [6], "dir-lost": [6, 12]}[case]
        if steps != expect:
            problems.append(f"TUTTI_CKPT_DIR holds steps {steps}, expected {expect}")
    if problems:
        print("\n".join(problems))
        print(log[-6000:])
        return 1
    print(f"elastic_cpp {case}: OK")
    return 0


sys.exit(main())
