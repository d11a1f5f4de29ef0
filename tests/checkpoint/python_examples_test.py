"""The Python checkpoint examples, checked where their own exit status
cannot tell (examples/python/torch_horovod.py, numpy_train.py).

replicas: both examples end by checking that every rank holds the same
    parameters.  With ``--perturb-rank R`` (rank R nudges one weight by 1e-3
    just before the check) rank 0 must print "replicas DIFFER (max difference
    ~1e-3)" and the job must fail.  The broadcast-and-compare check they
    replaced printed "identical" on rank 0 whatever the other ranks held.
spot: torch_horovod.py as docs/python.md's spot-safe recipe runs it: once
    its first periodic checkpoint is committed a notice arrives (the trigger
    file, as a cloud source would raise it); every rank saves the same step
    and the job exits with 75; a second launch resumes from that step and
    finishes with identical replicas.

usage: python_examples_test.py replicas|spot MPIEXEC PYTHON EXAMPLES_DIR NP WORKDIR
"""
import math
import os
import re
import shutil
import subprocess
import sys
import time

PER_EPOCH_SAMPLES = 4096  # torch_horovod.py's dataset()
BATCH = 32                # its --batch default (per rank)


def env_without_checkpoints(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TUTTI_CKPT_DIR"}
    env.update(extra)
    return env


def run(cmd, env, timeout=240):
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=env)
    print(p.stdout, flush=True)
    return p


def replicas(launch, examples, np_, _work):
    perturbed = np_ - 1  # not rank 0, the rank that prints
    failures = []
    for script, args in (("torch_horovod.py", ["--epochs", "1"]),
                         ("numpy_train.py", ["--steps", "60"])):
        p = run(launch + [os.path.join(examples, script), *args,
                          "--perturb-rank", str(perturbed)], env_without_checkpoints())
        m = re.search(r"replicas DIFFER \(max difference ([0-9.e+-]+)\)", p.stdout)
        if p.returncode == 0:
            failures.append(f"{script}: exit status 0 although rank {perturbed}'s parameters "
                            "differ; expected a failure")
        if m is None:
            failures.append(f"{script}: rank 0 did not print 'replicas DIFFER (max difference "
                            f"...)' although rank {perturbed}'s parameters differ")
        elif not 5e-4 < float(m.group(1)) < 2e-3:
            failures.append(f"{script}: max difference {m.group(1)}, expected about 1e-3 "
                            "(the nudge)")
    return failures


def latest_step(ckpt):
    try:
        with open(os.path.join(ckpt, "latest")) as f:
            return int(f.read().strip().split("-")[1].split(".")[0])
    except (OSError, IndexError, ValueError):
        return None


def spot(launch, examples, np_, work):
    ckpt, trigger = os.path.join(work, "ckpt"), os.path.join(work, "preempt")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = env_without_checkpoints(TUTTI_PREEMPT_SOURCES="signals,file",
                                  TUTTI_PREEMPT_FILE=trigger, TUTTI_PREEMPT_POLL_MS="50")
    script = os.path.join(examples, "torch_horovod.py")
    every = 20
    # Far more epochs than the test waits for: only the notice ends this run.
    cmd = launch + [script, "--epochs", "200", "--ckpt-dir", ckpt, "--ckpt-every", str(every)]
    print("$", " ".join(cmd), flush=True)
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=env)
    deadline = time.time() + 120
    while latest_step(ckpt) is None and job.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    noticed_after = latest_step(ckpt)
    with open(trigger, "w") as f:
        f.write("spot notice\n")
    try:
        out, _ = job.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        job.kill()
        out, _ = job.communicate()
        return [f"no exit within 120 s of the notice:\n{out}"]
    print(out, flush=True)
    failures = []
    stopped = latest_step(ckpt)
    if noticed_after is None:
        failures.append(f"no periodic checkpoint within 120 s (exit status {job.returncode})")
    if job.returncode != 75:
        failures.append(f"the first run ended with {job.returncode}, expected 75 "
                        "(stopped on the notice)")
    if stopped is None or noticed_after is None or stopped <= noticed_after:
        failures.append(f"the newest checkpoint is step {stopped}, expected the step the "
                        f"ranks stopped at, after {noticed_after} (committed before the "
                        "notice)")
    if failures:
        return failures
    per_epoch = PER_EPOCH_SAMPLES // (BATCH * np_)
    epochs = math.ceil(stopped / per_epoch) + 1  # a few more steps after the resume
    p = run(launch + [script, "--epochs", str(epochs), "--ckpt-dir", ckpt,
                      "--ckpt-every", str(every)], env)
    if p.returncode != 0:
        failures.append(f"the resumed run ended with {p.returncode}, expected 0")
    if f"resumed from checkpoint step {stopped}" not in p.stdout:
        failures.append(f"the second run did not say 'resumed from checkpoint step {stopped}'")
    if "replicas identical" not in p.stdout:
        failures.append("the resumed run did not end with identical replicas")
    return failures


def main():
    mode, mpiexec, python, examples, np_, work = sys.argv[1:7]
    np_ = int(np_)
    launch = [mpiexec, "--oversubscribe", "--bind-to", "none", "-np", str(np_), python]
    failures = {"replicas": replicas, "spot": spot}[mode](launch, examples, np_, work)
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print(f"OK: {mode}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
