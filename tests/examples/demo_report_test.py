#!/usr/bin/env python3
"""scripts/demo_report.py's arithmetic on a synthetic elastic job with
closed-form answers (no processes):

  run 0: 6 ranks, steps 1..33 at t = 100 + step, periodic checkpoint at 30,
         then the host dies (no notice);
  run 1: 4 ranks, resumes from step 30, steps 31..62 at t = 200 + step, a
         resize notice at 62 (checkpoint at 62);
  run 2: 6 ranks, resumes from step 62, steps 63..100 at t = 300 + step.

Recomputed steps: 31, 32, 33 (done by run 0 after its last checkpoint) = 3,
one second each (summarise() said 32: it paired the resize notice at 62
with the resume at 30).  Then two crashes before a new checkpoint.  launches.jsonl: starts at 99, 199, 299, ends at 140, 270,
401: wall 302 s, the second start after waiting 12.5 s for capacity.  The job's counters: train 100 s, ckpt 2 s, lost 150 s ->
goodput 100 / 302, other 302 - 252 = 50 s.

    demo_report_test.py SOURCE_DIR WORK_DIR
"""
import json
import os
import sys

src, work = sys.argv[1:3]
sys.path.insert(0, os.path.join(src, "scripts"))
import demo_report  # noqa: E402


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def step(run, s, t, world):
    return {"t": t, "run": run, "step": s, "loss": 1.0, "scale": 1.0, "skipped": False,
            "wire_bytes": 0, "raw_bytes": 0, "samples": 48, "world": world}


steps = [step(0, s, 100 + s, 6) for s in range(1, 34)]
steps += [step(1, s, 200 + s, 4) for s in range(31, 63)]
steps += [step(2, s, 300 + s, 6) for s in range(63, 101)]
events = [
    {"t": 130.5, "run": 0, "event": "checkpoint", "step": 30, "reason": "periodic",
     "blocking_s": 0.01, "bytes": 1000},
    {"t": 198.0, "run": 1, "event": "resume", "step": 30, "world": 4, "saved_world": 6,
     "position": 1440},
    {"t": 262.1, "run": 1, "event": "notice", "step": 62, "source": "SIGUSR1", "reason": "resize"},
    {"t": 262.2, "run": 1, "event": "checkpoint", "step": 62, "reason": "preemption",
     "blocking_s": 0.1, "bytes": 1000},
    {"t": 262.3, "run": 1, "event": "exit", "step": 62, "code": 75},
    {"t": 298.0, "run": 2, "event": "resume", "step": 62, "world": 6, "saved_world": 4,
     "position": 2976},
]
os.makedirs(work, exist_ok=True)
launches = os.path.join(work, "launches.jsonl")
with open(launches, "w") as f:
    for rec in ({"event": "start", "attempt": 0, "np": 6, "hosts": [], "reason": "start", "time": 99},
                {"event": "end", "attempt": 0, "status": 205, "step": 30, "time": 140},
                {"event": "start", "attempt": 1, "np": 4, "hosts": [], "reason": "failure", "time": 199,
                 "waited_s": 12.5},
                {"event": "end", "attempt": 1, "status": 75, "step": 62, "time": 270},
                {"event": "start", "attempt": 2, "np": 6, "hosts": [], "reason": "resize", "time": 299},
                {"event": "end", "attempt": 2, "status": 0, "step": 90, "time": 401}):
        f.write(json.dumps(rec) + "\n")
progress = {"position": 4800, "global_batch": 48, "world": 6, "runs": 3, "resizes": 2,
            "bytes_sent": 0, "train_s": 100.0, "ckpt_s": 2.0, "lost_s": 150.0, "saved_at": 0}

s = demo_report.summarise(steps, events)
print("summarise:", {k: s[k] for k in ("recomputed_steps", "interruptions", "resumed_from")})
if s["recomputed_steps"] != 3:
    fail(f"recomputed steps {s['recomputed_steps']}, expected 3 (31, 32, 33)")
if s["resumed_from"] != [30, 62]:
    fail(f"resumed from {s['resumed_from']}, expected [30, 62]")

g = demo_report.goodput(launches, steps, events, progress)
print("goodput:", g)
want = {"wall": 302.0, "train": 100.0, "ckpt": 2.0, "lost": 150.0, "recomputed": 3,
        "recompute_s": 3.0, "other": 50.0, "sizes": [(6, "start"), (4, "failure"), (6, "resize")],
        "resume_steps": [30, 62], "relaunch_gaps": [59.0, 29.0], "waited": 12.5}
bad = {k: (g[k], v) for k, v in want.items() if (abs(g[k] - v) > 1e-9 if isinstance(v, float)
                                                   else g[k] != v)}
if bad or abs(g["goodput"] - 100.0 / 302.0) > 1e-12:
    fail(f"goodput fields (got, expected): {bad}; goodput {g['goodput']}")
text = demo_report.goodput_table(g, progress)
print(text)
for needle in ("goodput 33.1%", "3 steps, about 3.0 s", "6 (start) -> 4 (failure) -> 6 (resize)",
               "waiting for capacity 12.5 s"):
    if needle not in text:
        fail(f"'{needle}' missing from the table")
# Two crashes before a new checkpoint: run 1 redoes 31..33 and dies at 35,
# run 2 resumes from 30 again: 3 + 5 steps recomputed, none counted twice.
steps2 = [step(0, s, 100 + s, 6) for s in range(1, 34)] + \
    [step(1, s, 200 + s, 4) for s in range(31, 36)] + [step(2, s, 300 + s, 4) for s in range(31, 41)]
events2 = [{"t": 198.0, "run": 1, "event": "resume", "step": 30},
           {"t": 298.0, "run": 2, "event": "resume", "step": 30}]
got = demo_report.recomputed(steps2, events2)
print("two crashes:", got)
if got != (8, 8.0):
    fail(f"two crashes: recomputed {got}, expected (8, 8.0)")
print("PASS")
