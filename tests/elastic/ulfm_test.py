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
import sys
import tempfile

from ulfm_common import (DETECT_BOUND_S, LAUNCH, MPI_ARGS, base_env, open_mpi_major,
                         report, run_case)

probe, mpiexec, case, tutti_run, python_pkg = sys.argv[1:6]
NP = 4
STEPS = 8


def main():
    if open_mpi_major(mpiexec) < 5:
        print(f"skipped: {mpiexec} is not Open MPI 5 (no ULFM)")
        return 77
    tmp = tempfile.mkdtemp(prefix="tutti-ulfm-")
    out, mem = os.path.join(tmp, "out"), os.path.join(tmp, "mem")
    os.makedirs(out)
    os.makedirs(mem)
    env = base_env()  # TUTTI_MEM_DIR and TUTTI_JOB_ID are set per attempt
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
    mpi_args = MPI_ARGS + ["-np", str(NP)]
    if case == "elastic-tutti-run":
        # no TUTTI_JOB_ID: tutti-run sets its own
        cmd = [sys.executable, tutti_run, "--mpirun", mpiexec, "--backoff", "0",
               "--max-restarts", "1", "--"] + mpi_args + program + args
    else:
        cmd = [LAUNCH, mpiexec] + mpi_args + program + args
    done, returncode, log, problems, results = run_case(
        cmd, env, out, mem, NP, dead, job_id=case != "elastic-tutti-run")
    if done is not None:
        return done
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
        if returncode != 0 or "job completed" not in log:
            problems.append(f"tutti-run exited {returncode} without 'job completed'")
        if log.count("[tutti-run] starting ") != 1 or "restart" in log.replace(
                "TUTTI_RESTART_COUNT", ""):
            problems.append("tutti-run started the job more than once")
    return report(case, problems, log, survivors, results)


sys.exit(main())
