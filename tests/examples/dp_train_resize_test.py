#!/usr/bin/env python3
"""dp_train across world sizes (what tutti-run --min-np/--max-np does to it,
driven here by plain restarts with --stop-at):

  1. 2 -> 3 -> 4 ranks at a global batch of 12 (6, 4, 3 per rank): the
     samples log shows samples 0..359 consumed once each, at the scheduled
     sizes; the counters in the checkpoint metadata continue (samples, runs,
     resizes, and the gradient bytes: a closed form of the parameter count);
  2. the same schedule with one extra restart at the same size ends with
     bit-identical parameters (the data position and the state resume
     exactly);
  3. the checker catches a repeated, a skipped and a missing sample;
  4. a global batch the world size does not divide is refused (exit 2) with
     both numbers named.

    dp_train_resize_test.py MPIEXEC DP_TRAIN SOURCE_DIR WORK_DIR
"""
import json
import os
import shutil
import subprocess
import sys

mpiexec, dp, src, work = sys.argv[1:5]
sys.path.insert(0, os.path.join(src, "scripts"))
import demo_report  # noqa: E402

G, STEPS = 12, 30
# float16 gradients of the 64-256-256-10 MLP: 85002 parameters, 2 bytes each;
# a ring all-reduce of B bytes sends 2 (W - 1) / W * B per rank (the fp16
# compressor's wire bytes), so W ranks together send 2 (W - 1) B per step.
GRAD_BYTES = 2 * (64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10)


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def run(np_, *args, expect=0):
    cmd = [mpiexec, "--oversubscribe", "--bind-to", "none", "-np", str(np_), dp,
           "--compression", "fp16", "--log-every", "1000", "--learn-ratio", "0"] + list(args)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(f"$ mpiexec -np {np_} dp_train {' '.join(args)}  -> exit {p.returncode}")
    if p.returncode != expect:
        print(p.stdout)
        fail(f"exit {p.returncode}, expected {expect}")
    return p.stdout


def schedule(name, segments):
    """segments: [(world size, stop at step)], the last one runs to STEPS."""
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    samples, final = os.path.join(d, "samples.jsonl"), os.path.join(d, "final.json")
    for i, (np_, stop) in enumerate(segments):
        extra = ["--global-batch", str(G)] if i == 0 else []  # later runs keep the checkpoint's
        stop_args = ["--stop-at", str(stop)] if stop else []
        run(np_, "--steps", str(STEPS), "--ckpt-dir", os.path.join(d, "ckpt"), "--ckpt-every", "100",
            "--samples-log", samples, "--final", final, *extra, *stop_args)
    return samples, json.load(open(final))


os.makedirs(work, exist_ok=True)
print("== 1. 2 -> 3 -> 4 ranks, global batch 12")
samples, a = schedule("resize", [(2, 10), (3, 20), (4, None)])
c = demo_report.check_samples(samples, STEPS, G)
print(f"samples: {c['samples']}, schedule {c['schedule']}, errors {c['errors']}")
if not c["ok"]:
    fail("samples repeated or skipped: " + "; ".join(c["errors"]))
if c["schedule"] != [(1, 2), (11, 3), (21, 4)] or c["samples"] != STEPS * G:
    fail(f"schedule {c['schedule']} / {c['samples']} samples, expected 2, 3, 4 ranks from "
         f"steps 1, 11, 21 and {STEPS * G} samples")
p = a["progress"]
want_bytes = sum(10 * 2 * (w - 1) * GRAD_BYTES for w in (2, 3, 4))
got = (p["position"], p["global_batch"], p["runs"], p["resizes"], p["bytes_sent"], p["world"])
want = (STEPS * G, G, 3, 2, want_bytes, 4)
print(f"counters (position, global batch, runs, resizes, bytes, world): {got}")
if got != want:
    fail(f"counters {got}, expected {want}")
if not (p["train_s"] > 0 and p["lost_s"] > 0):
    fail(f"train_s {p['train_s']} and lost_s {p['lost_s']} must be positive after two restarts")

print("== 2. the same schedule with one more restart at 2 ranks: bit-identical")
_, b = schedule("resize-again", [(2, 5), (2, 10), (3, 20), (4, None)])
print(f"parameters: {a['hash']} vs {b['hash']}")
if a["hash"] != b["hash"]:
    fail("a restart at the same size changed the result")

print("== 3. the checker catches a repeated, a skipped and a missing sample")
lines = open(samples).read().splitlines()
recs = [json.loads(x) for x in lines]
cases = {"repeat": lambda r: dict(r, first=r["first"] - 1) if r["step"] == 15 and r["rank"] == 1 else r,
         "skip": lambda r: dict(r, first=r["first"] + 3) if r["step"] == 25 and r["rank"] == 3 else r,
         "missing": lambda r: None if r["step"] == 7 and r["rank"] == 0 else r}
for name, edit in cases.items():
    bad = os.path.join(work, f"samples-{name}.jsonl")
    with open(bad, "w") as f:
        for r in recs:
            r2 = edit(r)
            if r2 is not None:
                f.write(json.dumps(r2) + "\n")
    c = demo_report.check_samples(bad, STEPS, G)
    print(f"{name}: {c['errors'][:2]}")
    if c["ok"]:
        fail(f"the checker missed a {name}")
# A restart that redoes steps is not a repeat: the later start's records win
# (here a later start redid steps 25..30 at 2 ranks).
redo = os.path.join(work, "samples-redo.jsonl")
with open(redo, "w") as f:
    f.write("\n".join(lines) + "\n")
    for s in range(25, STEPS + 1):
        for rank in range(2):
            f.write(json.dumps({"start": 1, "step": s, "rank": rank, "world": 2,
                                "first": (s - 1) * G + rank * 6, "count": 6}) + "\n")
c = demo_report.check_samples(redo, STEPS, G)
if not c["ok"] or c["recomputed"] != 6 * G:
    fail(f"redone steps: ok {c['ok']} recomputed {c['recomputed']} (expected {6 * G}): {c['errors']}")

print("== 4. a global batch the world size does not divide")
out = run(5, "--steps", "3", "--global-batch", str(G), expect=2)
if "global batch 12 is not divisible by the world size 5" not in out:
    fail("the refusal does not name both numbers:\n" + out)
print("PASS")
