"""Fault tests of the checkpoint commit protocol with real processes, real
SIGKILLs and real files.

usage: fault_test.py PROBE MPIEXEC NP CASE
  points   kill a rank at every named point of save and retention; after
           each kill the loader must return the previous or the new
           checkpoint, exact and byte-identical, and a resumed job must save
           on top of the debris
  random   kill a random rank at a random time while it saves in a loop
  stall    a rank hangs mid-save: the others raise a timeout within the bound
"""
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

PROBE, MPIEXEC, NP, CASE = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg, flush=True)


def mpirun(args, env=None, timeout=60):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", str(NP),
                           PROBE] + args, capture_output=True, text=True, env=e,
                          timeout=timeout)


def loaded_step(d, extra=()):
    """Runs the checker; returns the step it loaded (None: no checkpoint)."""
    r = mpirun(["check", "--dir", d] + list(extra))
    if r.returncode != 0:
        fail(f"check in {d} failed (rc {r.returncode}):\n{r.stdout}\n{r.stderr[-2000:]}")
        return "error"
    m = re.search(r"^LOADED (\d+)$", r.stdout, re.M)
    if m:
        return int(m.group(1))
    if re.search(r"^NONE$", r.stdout, re.M):
        return None
    fail(f"check printed neither LOADED nor NONE:\n{r.stdout}")
    return "error"


def committed(out):
    steps = [int(x) for x in re.findall(r"^COMMITTED (\d+)$", out, re.M)]
    return max(steps) if steps else 0


def incomplete_dirs(d):
    return sorted(x for x in os.listdir(d) if x.startswith("step-")
                  and not os.path.exists(os.path.join(d, x, "manifest.json")))


# (point, rank to kill, hit, steps the loader may return).  Steps 1 and 2
# are committed; the kill happens during the save of step 3 (keep_last 2,
# so that save also deletes step 1: retention's first deletion is hit 1).
SHARD_POINTS = ["before_shard_write", "mid_shard_write", "after_shard_write",
                "before_fsync", "after_fsync", "after_rename"]
POINTS = ([(p, NP - 1, 3, {2}) for p in SHARD_POINTS] +
          [(p, 0, 3, {2}) for p in ("before_shard_write", "after_rename", "after_agree",
                                    "mid_manifest", "manifest_fsync")] +
          [("between_manifest_and_latest", 0, 3, {3}),
           ("after_latest", 0, 3, {3}),
           ("during_retention", 0, 1, {3})])
if NP > 1:
    # A non-zero rank dying after the agreement races rank 0's commit.
    POINTS.append(("after_agree", NP - 1, 3, {2, 3}))


def case_points(tmp):
    for point, rank, hit, allowed in POINTS:
        d = os.path.join(tmp, f"{point}-r{rank}")
        spec = f"{point}:rank={rank}:hit={hit}"
        t0 = time.time()
        r = mpirun(["save", "--dir", d, "--from", "1", "--to", "3", "--keep", "2"],
                   env={"TUTTI_FAULT_INJECT": spec, "TUTTI_CKPT_TIMEOUT": "10"})
        if committed(r.stdout) >= 3 and allowed != {3}:
            fail(f"{spec}: the save of step 3 completed; the kill did not happen")
        if r.returncode == 0:
            fail(f"{spec}: the job exited 0 although a rank was killed")
        got = loaded_step(d)
        latest = open(os.path.join(d, "latest")).read().strip()
        print(f"{spec:45s} killed in {time.time() - t0:4.1f}s: loads step {got}, "
              f"latest={latest}, incomplete={incomplete_dirs(d)}", flush=True)
        if got not in allowed:
            fail(f"{spec}: loader returned step {got}, expected one of {sorted(allowed)}")
        if point == "between_manifest_and_latest" and latest != "step-00000002":
            fail(f"{spec}: latest is {latest}; the kill came before it was replaced")
        # Resume on top of the debris and commit more steps.
        start = (got if isinstance(got, int) else 0) + 1
        r = mpirun(["save", "--dir", d, "--from", str(start), "--to", "5", "--keep", "2"])
        if r.returncode != 0 or committed(r.stdout) != 5:
            fail(f"{spec}: resumed save failed:\n{r.stdout}\n{r.stderr[-2000:]}")
        if loaded_step(d) != 5:
            fail(f"{spec}: after resuming, the loader did not return step 5")
        if incomplete_dirs(d):
            fail(f"{spec}: incomplete directories left after a clean save: "
                 f"{incomplete_dirs(d)}")


def case_random(tmp, rounds=6):
    rng = random.Random(int(os.environ.get("TUTTI_TEST_SEED", "20240611")))
    for i in range(rounds):
        d = os.path.join(tmp, f"random-{i}")
        proc = subprocess.Popen(
            [MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", str(NP), PROBE, "save",
             "--dir", d, "--from", "1", "--to", "1000000", "--keep", "2",
             "--sizes", "0,1,7,100000"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        deadline = time.time() + 30
        while time.time() < deadline and sum(l.startswith("PID") for l in lines) < NP:
            time.sleep(0.02)
        pids = {int(m.group(1)): int(m.group(2))
                for m in (re.match(r"PID (\d+) (\d+)", l) for l in list(lines)) if m}
        if len(pids) < NP:
            proc.kill()
            fail(f"round {i}: the ranks did not start")
            continue
        time.sleep(rng.uniform(0.2, 2.0))
        victim = rng.randrange(NP)
        os.kill(pids[victim], signal.SIGKILL)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            fail(f"round {i}: the job did not end after rank {victim} was killed")
        reader.join(timeout=5)
        last = committed("".join(lines))
        got = loaded_step(d, ["--sizes", "0,1,7,100000"])
        print(f"round {i}: killed rank {victim} after step {last} was committed; "
              f"loader returns {got}", flush=True)
        ok = (got in (last, last + 1)) if last > 0 else (got in (None, 1))
        if not ok:
            fail(f"round {i}: loader returned {got} but step {last} was committed last")


def case_stall(tmp):
    d = os.path.join(tmp, "stall")
    t0 = time.time()
    r = mpirun(["save", "--dir", d, "--from", "1", "--to", "2"],
               env={"TUTTI_FAULT_INJECT": f"after_rename:rank={NP - 1}:hit=2:action=stall",
                    "TUTTI_CKPT_TIMEOUT": "3"}, timeout=90)
    elapsed = time.time() - t0
    failed = re.findall(r"^SAVE-FAILED 2 timeout: .*$", r.stdout, re.M)
    print("\n".join(failed), flush=True)
    if len(failed) != NP - 1:
        fail(f"expected {NP - 1} ranks to report a timeout for step 2:\n{r.stdout}")
    if failed and f"rank {NP - 1}" not in failed[0]:
        fail("the timeout does not name the hung rank")
    if elapsed > 30:
        fail(f"the job took {elapsed:.0f}s; the agreement bound is 3s")
    if loaded_step(d) != 1:
        fail("the hung save must not be published")


tmp = tempfile.mkdtemp(prefix="tutti-fault-")
try:
    {"points": case_points, "random": case_random, "stall": case_stall}[CASE](tmp)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
if failures:
    print(f"{len(failures)} failures")
    sys.exit(1)
print(f"PASS: fault case '{CASE}' on {NP} ranks")
