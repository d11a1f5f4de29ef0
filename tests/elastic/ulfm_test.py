#!/usr/bin/env python3
"""In-process recovery from killed ranks (ULFM, include/tutti/recovery.h)
with real processes: ulfm_probe at 4 ranks under Open MPI 5's
`mpiexec --with-ft ulfm`.  Exits 77 (skipped) where the MPI has no ULFM.

  ulfm_test.py PROBE MPIEXEC CASE TUTTI_RUN PYTHON_PKG

allreduce        rank 2 SIGKILLs itself at iteration 20 of a loop of
                 all-reduces: every survivor's op fails with kRanksLost naming
                 world rank 2 within DETECT_BOUND_S, recover() gives a world
                 of 3 in the old order, the old world refuses ops (kAborted),
                 the new one sums in closed form.
allreduce-twice  as allreduce, then the rank started as 3 (world rank 2 of
                 the 3) dies at iteration 40: a second recovery, to 2 ranks.
elastic          elastic_run over the memory tier, a commit every step of 8;
                 rank 2 dies in the middle of step 5: the survivors recover in
                 the same processes, reload the commit of step 4 at 3 ranks
                 (the sharded tensor resharded), redo step 5 and finish; the
                 final state equals the closed form replayed over the sizes
                 the steps ran at (4 ranks for steps 1-4, 3 for 5-8), at most
                 one step was redone, and no process started again.
elastic-tutti-run  as elastic, under tutti-run (`-- --with-ft ulfm ...`,
                 TUTTI_EXIT_ON_COMM_FAILURE=1): the job completes without a
                 restart (TUTTI_RESTART_COUNT stays 0, one launch).
torch-elastic    tutti.torch.elastic.run (ulfm_torch_probe.py, CPU): a
                 TorchState committed every step, rank 2 dies in step 5; the
                 survivors recover, reload step 4 at 3 ranks, run the reset
                 callbacks once and end with the closed-form weight.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

probe, mpiexec, case, tutti_run, python_pkg = sys.argv[1:6]
NP = 4
STEPS = 8
DETECT_BOUND_S = 5.0  # docs/elastic.md: measured 0.01-0.1 s on one host


def open_mpi_major(mpiexec):
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return 0
    m = re.search(r"Open MPI\)? (\d+)\.", out.stdout + out.stderr)
    return int(m.group(1)) if m else 0


def main():
    if open_mpi_major(mpiexec) < 5:
        print(f"skipped: {mpiexec} is not Open MPI 5 (no ULFM)")
        return 77
    tmp = tempfile.mkdtemp(prefix="tutti-ulfm-")
    out, mem = os.path.join(tmp, "out"), os.path.join(tmp, "mem")
    os.makedirs(out)
    os.makedirs(mem)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "TUTTI_RESTART_COUNT"))}
    # TUTTI_MEM_DIR and TUTTI_JOB_ID are set per attempt below.
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for k in ("TUTTI_CKPT_DIR", "TUTTI_JOB_ID"):
        env.pop(k, None)
    if case == "allreduce":
        args, dead = ["allreduce", out, "2:20"], [2]
    elif case == "allreduce-twice":
        args, dead = ["allreduce", out, "2:20,3:40"], [2, 3]
    elif case == "torch-elastic":
        args, dead = [os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                   "ulfm_torch_probe.py"), out, "2", "5", str(STEPS)], [2]
        env["PYTHONPATH"] = python_pkg + os.pathsep + env.get("PYTHONPATH", "")
    else:
        args, dead = ["elastic", out, "2:5", str(STEPS)], [2]
    program = [sys.executable] if case == "torch-elastic" else [probe]
    mpi_args = ["--with-ft", "ulfm", "--oversubscribe", "--bind-to", "none", "-np", str(NP)]
    if case == "elastic-tutti-run":
        # no TUTTI_JOB_ID: tutti-run sets its own
        cmd = [sys.executable, tutti_run, "--mpirun", mpiexec, "--backoff", "0",
               "--max-restarts", "1", "--"] + mpi_args + program + args
    else:
        launch = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common",
                              "launch.sh")
        cmd = [launch, mpiexec] + mpi_args + program + args
    # Open MPI 5.0.11's launcher sometimes ends the whole job (mpiexec exit
    # 255) after the planned kill despite --with-ft ulfm: before any survivor
    # recovered (twice in ~60 runs under a loaded ctest -j2), or at the end,
    # after the survivors wrote their results (1 in ~10 runs of the five ulfm
    # tests at -j2; under tutti-run it shows as 'job failed with status 255'
    # and a restart).  Not tutti's doing: such an attempt is run again, from
    # a fresh memory tier and output folder, at most twice, and said so.
    for attempt in range(3):
        if attempt:
            shutil.rmtree(out)
            os.makedirs(out)
        env["TUTTI_MEM_DIR"] = os.path.join(mem, str(attempt))
        os.makedirs(env["TUTTI_MEM_DIR"], exist_ok=True)
        if case != "elastic-tutti-run":
            env["TUTTI_JOB_ID"] = f"ulfm-{os.getpid()}-{attempt}"
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100)
        log = p.stdout + p.stderr
        aborted = p.returncode == 255 or "job failed with status 255" in log
        if not aborted or attempt == 2:
            break
        print(f"attempt {attempt + 1}: the launcher ended the job (exit {p.returncode}"
              f"{', then tutti-run restarted it' if 'job failed with status 255' in log else ''})"
              "; running the case again")
    if "in-process recovery is not available here" in log:
        print("skipped: this tutti was built without ULFM")
        return 77
    problems = []
    results = {}
    for r in range(NP):
        path = os.path.join(out, f"result.rank{r}")
        results[r] = open(path).read() if os.path.exists(path) else None
        if r in dead:
            if not os.path.exists(os.path.join(out, f"killed.rank{r}")):
                problems.append(f"start rank {r} did not die as planned")
            continue
        if results[r] is None or not results[r].rstrip().endswith("OK"):
            problems.append(f"start rank {r}: {results[r]!r}")
    survivors = [r for r in range(NP) if r not in dead]
    for r in survivors:
        text = results[r] or ""
        rec = re.findall(r"recovered lost=(\d+) iteration=(\d+) detect_s=([\d.e-]+) "
                         r"recover_s=([\d.e-]+) size=(\d+)", text)
        if case.startswith("allreduce"):
            if [int(x[0]) for x in rec] != dead:
                problems.append(f"start rank {r} recovered from {rec}, expected {dead}")
            for x in rec:
                if float(x[2]) > DETECT_BOUND_S:
                    problems.append(f"start rank {r}: the loss of {x[0]} surfaced after "
                                    f"{x[2]} s (bound {DETECT_BOUND_S} s)")
            if [int(x[4]) for x in rec] != [NP - i - 1 for i in range(len(dead))]:
                problems.append(f"start rank {r}: sizes after recovery {rec}")
        elif case == "torch-elastic":
            m = re.search(r"calls=(\d+) resumed=\[(\d+)\] resets=\[(\d+)\] final_size=(\d+)",
                          text)
            if not m or tuple(map(int, m.groups())) != (2, 4, NP - 1, NP - 1):
                problems.append(f"start rank {r}: {text!r}, expected calls=2 resumed=[4] "
                                f"resets=[{NP - 1}] final_size={NP - 1}")
        else:
            m = re.search(r"calls=(\d+) resets=(\d+) redone=(\d+) final_size=(\d+) pid=(\d+)",
                          text)
            if not m:
                problems.append(f"start rank {r}: no summary in {text!r}")
                continue
            calls, resets, redone, final_size, _ = map(int, m.groups())
            if (calls, resets, final_size) != (2, 1, NP - 1):
                problems.append(f"start rank {r}: calls={calls} resets={resets} "
                                f"final_size={final_size}, expected 2, 1, {NP - 1}")
            if redone > 1:
                problems.append(f"start rank {r}: {redone} steps redone (at most 1)")
            if "resumed step=4 size=3" not in text:
                problems.append(f"start rank {r}: did not resume from step 4 at 3 ranks: "
                                f"{text!r}")
    def read_state():
        try:
            with open(os.path.join(out, "state.json")) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            problems.append(f"state.json unreadable: {e}")
            return None

    if case != "torch-elastic" and case.startswith("elastic") and not problems:
        st = read_state() or {"sizes": None, "w": None, "v": None}
        sizes = [NP] * 4 + [NP - 1] * (STEPS - 4)
        if st["sizes"] != sizes:
            problems.append(f"steps ran at sizes {st['sizes']}, expected {sizes}")
        w = 1.0
        for s, n in enumerate(sizes, start=1):
            w = w / 2 + s * n
        if st["w"] != [w] * 4:
            problems.append(f"w = {st['w']}, closed form {w}")
        v = [float((i + 1) * STEPS * (STEPS + 1) // 2) for i in range(12)]
        if st["v"] != v:
            problems.append(f"v = {st['v']}, closed form {v}")
        if "recovered in-process: lost world rank(s) 2, 4 -> 3 ranks" not in log:
            problems.append("no recovery line in the log")
    if case == "torch-elastic" and not problems:
        st = read_state() or {"sizes": None, "w": None}
        sizes = [NP] * 4 + [NP - 1] * (STEPS - 4)
        w = 1.0
        for s, n in enumerate(sizes, start=1):
            w = w / 2 + s * n
        if st["sizes"] != sizes or st["w"] != [w] * 4:
            problems.append(f"state {st}, expected sizes {sizes} and w {w}")
        if "recovered in-process: lost world rank(s) 2, 4 -> 3 ranks" not in log:
            problems.append("no recovery line in the log")
    if case == "elastic-tutti-run":
        if p.returncode != 0 or "job completed" not in log:
            problems.append(f"tutti-run exited {p.returncode} without 'job completed'")
        if log.count("[tutti-run] starting ") != 1 or "restart" in log.replace(
                "TUTTI_RESTART_COUNT", ""):
            problems.append("tutti-run started the job more than once")
    if problems:
        print("\n".join(problems))
        print(log[-8000:])
        return 1
    print(f"ulfm {case}: OK")
    for r in survivors:
        print(f"start rank {r}: " + " | ".join((results[r] or "").strip().split("\n")))
    return 0


sys.exit(main())
