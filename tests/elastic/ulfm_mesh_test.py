#!/usr/bin/env python3
"""In-process recovery of a TP x DP mesh, and the elastic sampler after a
recovery (ULFM; docs/elastic.md, "Tensor parallel jobs" and "The sampler
after a recovery"), with real processes at np 4 under Open MPI 5's
`mpiexec --with-ft ulfm`.  Exits 77 (skipped) where the MPI has no ULFM.

  ulfm_mesh_test.py TP_PROBE MPIEXEC CASE PYTHON_PKG

tp       ulfm_tp_probe (TP 2 x DP 2, elastic_run with ElasticOptions::tp_size
         2, a commit every step of 6): start rank 1 (DP 0, TP 1) dies in the
         middle of step 4.  Its TP partner, start rank 0, leaves the job with
         exit status 0 and says so; start ranks 2 and 3 become ranks 0 and 1
         with their TP index (0 and 1) kept, resume from the commit of step 3
         at DP 1 and finish.  Every forward output along the way and the
         final weights and accumulator equal the closed form replayed over
         the DP sizes the steps ran at (2 for steps 1-3, 1 for 4-6), exactly
         (integers in float32).  Before training, recover(RecoveryOptions{3})
         is refused with kInvalidArgument and the world still sums.
tp-all   ulfm_tp_probe with start ranks 1 and 2 dying in step 4, one in each
         TP group: no complete replica survives, so recovery is refused on
         both survivors ("every tensor-parallel group of 2 lost a member",
         kRanksLost) and the error propagates from elastic_run (the restart
         path): each survivor ends with its error (status 1), none leaves as
         a TP partner, nothing hangs.
sampler  ulfm_sampler_probe.py (tutti.torch.elastic.run, ElasticSampler over
         62 samples, 2 per rank and step, a commit every step): start rank 2
         dies in the middle of step 4.  The survivors resume from commit 3
         at 3 ranks; over the committed steps every sample index of the
         epoch was trained exactly once (the tail padding, marked by
         sampler.padding(), counted apart: (-38) % 3 = 1 sample), the step in
         flight at the failure was redone once and only its redo counts, and
         the weight (the sum of the trained indices) is sum(range(62)).
sampler-tp  the same as a TP 2 x DP 2 job for the loop and the sampler
         (@elastic.run(tp_size=2), ElasticSampler(tp_size=2): a TP group's
         ranks get the same samples): start rank 2 dies in step 4, its TP
         partner 3 leaves with SystemExit(0), ranks 0 and 1 go on as one
         replica; every sample once over the committed steps (no padding at
         one replica), the weight sum(range(62)).
"""
import collections
import json
import os
import shutil
import sys
import tempfile

import ulfm_common

probe, mpiexec, case, python_pkg = sys.argv[1:5]
NP = 4
HERE = os.path.dirname(os.path.abspath(__file__))
# tp
TP_KILL, TP_STEP, TP_STEPS = 1, 4, 6
# sampler
SP_KILL, SP_STEP, SP_N, SP_BATCH = 2, 4, 62, 2


def launch(out, mem, program):
    """The job (ulfm_common.run_attempts: run again, at most twice, when Open
    MPI 5.0.11's launcher ended it with 255).  Returns (returncode, log),
    returncode None when it did not end within 100 s."""
    env = ulfm_common.base_env()
    env["PYTHONPATH"] = python_pkg + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [ulfm_common.LAUNCH, mpiexec] + ulfm_common.MPI_ARGS + ["-np", str(NP)] + program
    os.makedirs(out)
    return ulfm_common.run_attempts(cmd, env, out, mem)


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


# ---- tp ---------------------------------------------------------------------------------

def tp_closed_form(dp_sizes):
    """acc, Wc, Wr after the steps ran at dp_sizes (ulfm_tp_probe.cc)."""
    add, acc = 0, 0
    for s, d in enumerate(dp_sizes, start=1):
        wc = [[4 * i + j + 1 + add for j in range(4)] for i in range(4)]
        wr = [[4 * k + i + 1 + add for i in range(4)] for k in range(2)]
        for replica in range(d):
            x = replica + 1
            h = [sum(wc[i][j] * x for j in range(4)) for i in range(4)]
            acc += sum(sum(wr[k][i] * h[i] for i in range(4)) for k in range(2))
        add += s * d
    return acc, [i + 1 + add for i in range(16)], [i + 1 + add for i in range(8)]


def check_tp(out, rc, log, problems):
    leaver = TP_KILL ^ 1      # its TP partner
    stayers = [r for r in range(NP) if r // 2 != TP_KILL // 2]
    if read(os.path.join(out, f"killed.rank{TP_KILL}")) is None:
        problems.append(f"start rank {TP_KILL} did not die as planned")
    if (read(os.path.join(out, f"exit.rank{leaver}")) or "").strip() != "0":
        problems.append(f"start rank {leaver} (the TP partner) did not exit with status 0: "
                        f"{read(os.path.join(out, f'exit.rank{leaver}'))!r}")
    if "leaves the job as a whole DP replica" not in log:
        problems.append("no line says that the TP partner leaves the job")
    if "OK" in (read(os.path.join(out, f"result.rank{leaver}")) or ""):
        problems.append(f"start rank {leaver} went on training after its TP group broke")
    for new_rank, r in enumerate(stayers):
        text = read(os.path.join(out, f"result.rank{r}")) or ""
        tp_rank = r % 2
        want = [f"resumed step={TP_STEP - 1} size=2 rank={new_rank} tp_rank={tp_rank} "
                "dp_size=1",
                f"calls=2 resets=1 final_size=2 final_rank={new_rank} tp_rank={tp_rank}", "OK"]
        if [x for x in want if x not in text]:
            problems.append(f"start rank {r}: {text!r}, expected the lines {want}")
        if (read(os.path.join(out, f"exit.rank{r}")) or "").strip() != "0":
            problems.append(f"start rank {r} exited with {read(os.path.join(out, f'exit.rank{r}'))!r}")
    if problems:
        return
    st = json.loads(read(os.path.join(out, "state.json")) or "null") or {}
    dp_sizes = [2] * (TP_STEP - 1) + [1] * (TP_STEPS - TP_STEP + 1)
    acc, wc, wr = tp_closed_form(dp_sizes)
    got = (st.get("dp_sizes"), st.get("acc"), st.get("wc"), st.get("wr"))
    if got != (dp_sizes, acc, wc, wr):
        problems.append(f"state {st}, closed form dp_sizes {dp_sizes} acc {acc} wc {wc} wr {wr}")
    print(f"launcher exit status {rc}")


def check_tp_all(out, rc, log, problems):
    for r in (1, 2):
        if read(os.path.join(out, f"killed.rank{r}")) is None:
            problems.append(f"start rank {r} did not die as planned")
    for r in (0, 3):
        text = read(os.path.join(out, f"result.rank{r}")) or ""
        if not text.startswith("FAIL") or "died" not in text:
            problems.append(f"start rank {r}: {text!r}, expected the loss as its error")
        if (read(os.path.join(out, f"exit.rank{r}")) or "").strip() != "1":
            problems.append(f"start rank {r} exited with "
                            f"{read(os.path.join(out, f'exit.rank{r}'))!r}, expected 1")
    if log.count("every tensor-parallel group of 2 lost a member") != 2:
        problems.append("the survivors did not both say that no complete TP group survives")
    if "leaves the job" in log:
        problems.append("a rank left as a TP partner although nobody went on")
    print(f"launcher exit status {rc}")


# ---- sampler ----------------------------------------------------------------------------

def check_sampler(out, rc, log, problems, tp):
    group = [r for r in range(NP) if r // tp == SP_KILL // tp]     # the killed one's TP group
    survivors = [r for r in range(NP) if r not in group]
    replicas = NP // tp
    if read(os.path.join(out, f"killed.rank{SP_KILL}")) is None:
        problems.append(f"start rank {SP_KILL} did not die as planned")
    for r in group:
        if r != SP_KILL and (read(os.path.join(out, f"exit.rank{r}")) or "").strip() != "0":
            problems.append(f"start rank {r} (a TP partner) did not leave with SystemExit(0): "
                            f"{read(os.path.join(out, f'exit.rank{r}'))!r}")
    if tp > 1 and "leaves the job as a whole DP replica" not in log:
        problems.append("no line says that the TP partner leaves the job")
    resumed = SP_STEP - 1
    for r in survivors:
        text = read(os.path.join(out, f"result.rank{r}")) or ""
        if f"calls=2 resumed=[{resumed}] final_size={NP - tp}" not in text or "OK" not in text:
            problems.append(f"start rank {r}: {text!r}, expected calls=2 resumed=[{resumed}] "
                            f"final_size={NP - tp}")
    st = json.loads(read(os.path.join(out, "state.json")) or "null")
    if problems or st is None:
        problems.append(f"state.json: {st!r}")
        return
    # Committed: generation 0 up to the commit generation 1 resumed from,
    # then every step of generation 1 up to the last commit.
    start = {0: 0, 1: st["resumed"][1]}
    counts = collections.Counter()
    padding, redone, per_commit = 0, set(), collections.defaultdict(int)
    for r in range(0, NP, tp):       # TP rank 0 of each replica (its partners trained the same)
        for line in (read(os.path.join(out, f"records.rank{r}")) or "").splitlines():
            rec = json.loads(line)
            if rec["gen"] == 0 and rec["commit"] > start[1]:
                redone.add(rec["commit"])   # the step in flight: done again by gen 1
                continue
            if rec["commit"] > st["commit"]:
                problems.append(f"a record past the last commit: {rec}")
            per_commit[rec["commit"]] += 1
            for i, p in zip(rec["indices"], rec["padding"]):
                if p:
                    padding += 1
                else:
                    counts[i] += 1
    left = SP_N - resumed * replicas * SP_BATCH
    if sorted(counts) != list(range(SP_N)) or set(counts.values()) != {1}:
        twice = sorted(i for i, c in counts.items() if c > 1)
        missing = sorted(set(range(SP_N)) - set(counts))
        problems.append(f"committed samples: repeated {twice}, skipped {missing}")
    if padding != (-left) % (replicas - 1):
        problems.append(f"{padding} padded samples, closed form {(-left) % (replicas - 1)}")
    if redone != {resumed + 1}:
        problems.append(f"steps redone after the loss: {sorted(redone)}, expected "
                        f"[{resumed + 1}]")
    if st["w"] != float(sum(range(SP_N))):
        problems.append(f"w = {st['w']}, closed form {sum(range(SP_N))}")
    sizes = {int(c): s for c, s in st["sizes"].items()}
    if any(sizes[c] != (NP if c <= resumed else NP - tp) for c in sizes):
        problems.append(f"commit sizes {sizes}")
    print(f"sampler: {sum(counts.values())} samples once, {padding} padded, redone "
          f"{sorted(redone)}, launcher exit status {rc}")


def main():
    if ulfm_common.open_mpi_major(mpiexec) < 5:
        print(f"skipped: {mpiexec} is not Open MPI 5 (no ULFM)")
        return 77
    tmp = tempfile.mkdtemp(prefix="tutti-ulfm-mesh-")
    out, mem = os.path.join(tmp, "out"), os.path.join(tmp, "mem")
    if case in ("tp", "tp-all"):
        kills = str(TP_KILL) if case == "tp" else "1,2"
        program = [probe, out, kills, str(TP_STEP), str(TP_STEPS)]
    else:
        program = [sys.executable, os.path.join(HERE, "ulfm_sampler_probe.py"), out,
                   str(SP_KILL), str(SP_STEP), str(SP_N), str(SP_BATCH),
                   "2" if case == "sampler-tp" else "1"]
    rc, log = launch(out, mem, program)
    if rc is None:
        print("the job did not end within 100 s (a hang)")
        print(log[-8000:])
        return 1
    if "in-process recovery is not available here" in log:
        print("skipped: this tutti was built without ULFM")
        return 77
    problems = []
    if case == "tp":
        check_tp(out, rc, log, problems)
    elif case == "tp-all":
        check_tp_all(out, rc, log, problems)
    else:
        check_sampler(out, rc, log, problems, 2 if case == "sampler-tp" else 1)
    if problems:
        print("\n".join(problems))
        print(log[-8000:])
        return 1
    print(f"ulfm {case}: OK")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


sys.exit(main())
