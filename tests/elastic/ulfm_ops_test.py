#!/usr/bin/env python3
"""In-process recovery (ULFM) while real work is in flight: ulfm_ops_probe at
4 ranks under Open MPI 5's `mpiexec --with-ft ulfm`.  Exits 77 (skipped)
where the MPI has no ULFM.  Each case: the survivors' loss surfaces as
kRanksLost within DETECT_BOUND_S of the kill, recover() takes at most
RECOVER_BOUND_S, the values after it equal the closed form at the new size
(checked in the probe), and the whole job ends within 100 s (no hang).

  ulfm_ops_test.py PROBE MPIEXEC CASE

reducer         rank 2 dies at step 3 after marking half of its gradients
                ready (buckets in flight on the Reducer's 4 launch chains);
                the survivors recover, build a new Reducer at 3 ranks, redo
                step 3; 6 steps of closed-form averages.
reducer-hier    the same with the hierarchical all-reduce (the reducer's
                worker thread, nodes of 2 ranks).
reducer-twice   rank 2 dies at step 2, rank 3 at step 4: two recoveries,
                4 -> 3 -> 2 ranks.
zero            ZeRO-2 (ShardedOptimizer, SGD): rank 2 dies at step 3 after
                the reduce-scatters, before the all-gathers; a new reducer
                and optimizer from the last completed step's parameters at 3
                ranks; closed-form parameters after 6 steps.
ckpt            an async CheckpointManager save of step 3 in flight: rank 2
                is SIGKILLed half-way through its shard; the survivors
                recover, load step 2 at 3 ranks (step 3 stays incomplete),
                save step 3 again and load it.
ckpt-published  rank 2 dies in step 3's save once every shard was agreed
                (fault point after_agree): rank 0 publishes step 3 without
                it; after recover() the survivors load step 3, save step 4.
shrink-in       rank 2 dies; rank 3 dies while the others wait in recover()'s
                shrink: one recover() loses both (-> 2 ranks); then rank 1
                dies: a second recover() (-> 1 rank).
shrink-agree    as shrink-in, but rank 3 dies right after a shrink
                succeeded, before the agreement confirming it: the others
                shrink again (attempts >= 2).
"""
import os
import re
import shutil
import sys
import tempfile

from ulfm_common import (DETECT_BOUND_S, LAUNCH, MPI_ARGS, base_env, open_mpi_major,
                         report, run_case)

probe, mpiexec, case = sys.argv[1:4]
NP = 4
RECOVER_BOUND_S = 10.0  # measured 0.005-0.1 s per recover() at 3-4 ranks

# case -> (probe arguments after DIR, start ranks that die in order, the
# 'lost=' of each recovery line, the world size after each)
CASES = {
    "reducer": (["reducer", "2:3", "flat"], [2], ["2"], [3]),
    "reducer-hier": (["reducer", "2:3", "hier"], [2], ["2"], [3]),
    "reducer-twice": (["reducer", "2:2,3:4", "flat"], [2, 3], ["2", "3"], [3, 2]),
    "zero": (["zero", "2:3"], [2], ["2"], [3]),
    "ckpt": (["ckpt", None], [2], ["2"], [3]),
    "ckpt-published": (["ckpt", None, "after_agree"], [2], ["2"], [3]),
    "shrink-in": (["shrink", "in-shrink"], [2, 3, 1], ["2+3", "1"], [2, 1]),
    "shrink-agree": (["shrink", "before-agree"], [2, 3, 1], ["2+3", "1"], [2, 1]),
}
LINE = re.compile(r"recovered lost=([\d+]+) where=(.*?) detect_s=([\d.e-]+) "
                  r"recover_s=([\d.e-]+) attempts=(\d+) size=(\d+)")


def main():
    if open_mpi_major(mpiexec) < 5:
        print(f"skipped: {mpiexec} is not Open MPI 5 (no ULFM)")
        return 77
    args, dead, lost, sizes = CASES[case]
    tmp = tempfile.mkdtemp(prefix="tutti-ulfm-ops-")
    out, mem, ckpt = (os.path.join(tmp, d) for d in ("out", "mem", "ckpt"))
    for d in (out, mem, ckpt):
        os.makedirs(d)
    args = [args[0], out] + [ckpt if a is None else a for a in args[1:]]

    def fresh_ckpt():
        shutil.rmtree(ckpt)
        os.makedirs(ckpt)

    cmd = [LAUNCH, mpiexec] + MPI_ARGS + ["-np", str(NP), probe] + args
    done, _, log, problems, results = run_case(cmd, base_env(), out, mem, NP, dead,
                                               fresh=fresh_ckpt)
    if done is not None:
        return done
    survivors = [r for r in range(NP) if r not in dead]
    for r in dead:  # a rank that recovered before it died did so alike
        rec = [x[0] for x in LINE.findall(results[r] or "")]
        if rec != lost[:len(rec)]:
            problems.append(f"start rank {r} (died later): recoveries {rec}, expected a "
                            f"prefix of {lost}")
    for r in survivors:
        rec = LINE.findall(results[r] or "")
        if [x[0] for x in rec] != lost or [int(x[5]) for x in rec] != sizes:
            problems.append(f"start rank {r}: recoveries {rec}, expected lost {lost} "
                            f"at sizes {sizes}")
            continue
        for x in rec:
            if float(x[2]) > DETECT_BOUND_S:
                problems.append(f"start rank {r}: the loss of {x[0]} ({x[1]}) surfaced after "
                                f"{x[2]} s (bound {DETECT_BOUND_S} s)")
            if float(x[3]) > RECOVER_BOUND_S:
                problems.append(f"start rank {r}: recover() took {x[3]} s "
                                f"(bound {RECOVER_BOUND_S} s)")
        if case == "shrink-agree" and int(rec[0][4]) < 2:
            problems.append(f"start rank {r}: one shrink although rank 3 died before its "
                            f"agreement: {rec[0]}")
        if case.startswith("ckpt"):
            want = "loaded_after_recovery=3 saved=4" if case == "ckpt-published" else \
                "loaded_after_recovery=2 saved=3"
            if want not in (results[r] or ""):
                problems.append(f"start rank {r}: no '{want}'")
        if f"final_size={sizes[-1]}" not in (results[r] or ""):
            problems.append(f"start rank {r}: no final_size={sizes[-1]}")
    return report(case, problems, log, survivors, results)


sys.exit(main())
