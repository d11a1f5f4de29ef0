#!/usr/bin/env python3
"""Summarises a dp_train JSONL log (possibly several runs joined by restarts)
and draws the loss curve with the interruption marked.

    scripts/demo_report.py demo-out/train.jsonl [--reference demo-out/train-ref.jsonl]
                           [--png demo-out/loss.png]
    scripts/demo_report.py --samples samples.jsonl [--steps N] [--global-batch G]

--samples checks a dp_train --samples-log: in the job's final timeline no
sample was repeated or skipped (exit 1 if one was).
"""
import argparse
import json
import os
import sys
import time


def load(path):
    steps, events = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            (events if "event" in rec else steps).append(rec)
    return steps, events


def follow_records(path, state, pause=0.05):
    """Yields the JSON records appended to the growing log `path`, complete
    lines only, until state["stop"] is set (the demos' scenario drivers)."""
    pos = 0
    while not state["stop"]:
        if os.path.exists(path):
            with open(path) as f:
                f.seek(pos)
                for line in f:
                    if not line.endswith("\n"):
                        break
                    pos += len(line)
                    yield json.loads(line)
        time.sleep(pause)


def check_samples(path, steps=None, global_batch=None):
    """Reads a dp_train --samples-log (one line per step and rank) and checks
    that the final timeline consumed samples 0, 1, 2, ... each exactly once.

    A restart from a checkpoint redoes the steps after it: for each step
    only the records of the job start that logged it last count (the file
    is appended in time order); the superseded ones are recomputed samples.
    Returns {"ok", "errors", "steps", "samples", "recomputed", "schedule"},
    schedule = [(first step, world size), ...] at each change of size."""
    per_step, recomputed = {}, 0
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            cur = per_step.get(r["step"])
            if cur is None or cur[0] != r["start"]:
                if cur is not None:
                    recomputed += sum(x["count"] for x in cur[1])
                per_step[r["step"]] = cur = (r["start"], [])
            cur[1].append(r)
    errors = []
    last = max(per_step) if per_step else 0
    if steps is not None and last != steps:
        errors.append(f"the log ends at step {last}, expected {steps}")
    missing = [s for s in range(1, last + 1) if s not in per_step]
    if missing:
        errors.append(f"steps never logged: {missing[:10]}")
    position, schedule = 0, []
    for s in range(1, last + 1):
        if s not in per_step:
            continue
        recs = sorted(per_step[s][1], key=lambda x: x["rank"])
        world = recs[0]["world"]
        if not schedule or schedule[-1][1] != world:
            schedule.append((s, world))
        ranks = [x["rank"] for x in recs]
        if ranks != list(range(world)) or any(x["world"] != world for x in recs):
            errors.append(f"step {s}: ranks {ranks} logged, expected 0..{world - 1} once each")
            continue
        counts = {x["count"] for x in recs}
        if len(counts) != 1:
            errors.append(f"step {s}: unequal per-rank batches {sorted(counts)}")
        total = sum(x["count"] for x in recs)
        if global_batch is not None and total != global_batch:
            errors.append(f"step {s}: {total} samples at {world} ranks, expected the global batch "
                          f"{global_batch}")
        for x in recs:
            if x["first"] != position:
                what = "repeats" if x["first"] < position else "skips"
                errors.append(f"step {s} rank {x['rank']}/{world}: starts at sample {x['first']}, "
                              f"expected {position} (it {what} {abs(x['first'] - position)})")
            position = x["first"] + x["count"]
    return {"ok": not errors, "errors": errors, "steps": last, "samples": position,
            "recomputed": recomputed, "schedule": schedule}


def recomputed(steps, events):
    """(steps, seconds) done twice: each run's steps after the step the next
    run resumed from (work after its last checkpoint), at that run's mean
    step time.  A resume at the notice step recomputes nothing."""
    resumes = sorted((e for e in events if e["event"] == "resume"), key=lambda e: e["run"])
    count, seconds = 0, 0.0
    for run in sorted({s["run"] for s in steps}):
        nxt = [e for e in resumes if e["run"] > run]
        if not nxt:
            continue
        rs = [s for s in steps if s["run"] == run]
        redone = sum(1 for s in rs if s["step"] > nxt[0]["step"])
        count += redone
        if len(rs) > 1:
            seconds += redone * (rs[-1]["t"] - rs[0]["t"]) / (len(rs) - 1)
    return count, seconds


def summarise(steps, events):
    """Figures for one (possibly interrupted) training job."""
    runs = sorted({s["run"] for s in steps})
    out = {"runs": len(runs)}
    samples = sum(s["samples"] for s in steps)
    # Training time: per run, from its first to its last logged step, plus
    # one mean step (the first step's own duration).
    train_time = 0.0
    per_run_last = {}
    for r in runs:
        ts = [s["t"] for s in steps if s["run"] == r]
        if len(ts) > 1:
            train_time += (ts[-1] - ts[0]) * len(ts) / (len(ts) - 1)
        per_run_last[r] = [s for s in steps if s["run"] == r][-1]
    out["samples"] = samples
    out["throughput"] = samples / train_time if train_time > 0 else 0.0
    out["wall"] = steps[-1]["t"] - steps[0]["t"] if steps else 0.0
    raw = sum(per_run_last[r]["raw_bytes"] for r in runs)
    wire = sum(per_run_last[r]["wire_bytes"] for r in runs)
    out["compression"] = raw / wire if wire else 1.0
    out["wire_mb"] = wire / 1e6
    ck = [e for e in events if e["event"] == "checkpoint"]
    periodic = [e["blocking_s"] for e in ck if e.get("reason") == "periodic"]
    out["ckpt_count"] = len(ck)
    out["ckpt_block_mean_ms"] = 1e3 * sum(periodic) / len(periodic) if periodic else 0.0
    out["ckpt_block_max_ms"] = 1e3 * max(periodic) if periodic else 0.0
    out["ckpt_mb"] = ck[-1]["bytes"] / 1e6 if ck else 0.0
    notices = [e for e in events if e["event"] == "notice"]
    out["interruptions"] = len(notices)
    lost = 0.0
    out["notice_steps"] = [e["step"] for e in notices]
    for n in notices:
        # From the notice to the next run's first step, less one step's time:
        # saving, exiting, the restart, loading, and no recomputed steps (the
        # checkpoint is taken at the notice step).
        later = [s for s in steps if s["run"] > n["run"]]
        if later:
            run_steps = [s for s in steps if s["run"] == n["run"]]
            step_time = (run_steps[-1]["t"] - run_steps[0]["t"]) / max(1, len(run_steps) - 1)
            lost += later[0]["t"] - n["t"] - step_time
    out["lost_s"] = lost
    resumed = [e for e in events if e["event"] == "resume"]
    out["resumed_from"] = [e["step"] for e in resumed]
    out["recomputed_steps"] = recomputed(steps, events)[0]
    out["skipped"] = sum(1 for s in steps if s["skipped"])
    out["final_loss"] = steps[-1]["loss"] if steps else float("nan")
    return out


def goodput(launches_path, steps, events, progress):
    """Where the elastic job's wall time went.  launches.jsonl (tutti-run)
    gives the wall time and the sizes; the job's counters (dp_train's
    --final "progress", carried through every restart in the checkpoint
    metadata) give the productive time (the committed timeline's steps), the
    time saves blocked training, and the time lost to restarts; the job's
    log gives the recomputed steps (done after a checkpoint, then redone)."""
    launches = [json.loads(x) for x in open(launches_path) if x.strip()]
    starts = [x for x in launches if x["event"] == "start"]
    ends = [x for x in launches if x["event"] == "end"]
    wall = ends[-1]["time"] - starts[0]["time"] if starts and ends else 0.0
    resumes = [e for e in events if e["event"] == "resume"]
    n_redone, redone_s = recomputed(steps, events)
    out = {"wall": wall, "train": progress["train_s"], "ckpt": progress["ckpt_s"],
           "lost": progress["lost_s"], "recomputed": n_redone, "recompute_s": redone_s,
           "sizes": [(x["np"], x["reason"]) for x in starts],
           "resume_steps": [r["step"] for r in resumes],
           "relaunch_gaps": [b["time"] - a["time"] for a, b in zip(ends, starts[1:])],
           "waited": sum(x.get("waited_s", 0.0) for x in starts[1:])}
    out["other"] = max(0.0, wall - out["train"] - out["ckpt"] - out["lost"])
    out["goodput"] = out["train"] / wall if wall > 0 else 0.0
    return out


def goodput_table(g, progress, samples=None):
    pct = (lambda x: f"{100 * x / g['wall']:.1f}%") if g["wall"] > 0 else (lambda x: "-")
    sizes = " -> ".join(f"{n} ({why})" for n, why in g["sizes"])
    rows = [
        ("ranks per start (reason)", sizes),
        ("resumed from steps", ", ".join(map(str, g["resume_steps"])) or "-"),
        ("wall time (launches.jsonl)", f"{g['wall']:.1f} s"),
        ("productive: committed steps", f"{g['train']:.1f} s = goodput {pct(g['train'])}"),
        ("lost: checkpoint saves", f"{g['ckpt']:.2f} s ({pct(g['ckpt'])})"),
        ("lost: restarts", f"{g['lost']:.1f} s ({pct(g['lost'])}), of which"),
        ("  - recomputed steps", f"{g['recomputed']} steps, about {g['recompute_s']:.1f} s"),
        ("  - save, exit, relaunch, start, load", f"{max(0.0, g['lost'] - g['recompute_s']):.1f} s"
                                                   f" (launcher gaps "
                                                   f"{', '.join(f'{x:.1f}' for x in g['relaunch_gaps'])} s"
                                                   f"{'' if not g['waited'] else ', waiting for capacity %.1f s' % g['waited']})"),
        ("other: first start-up, shutdown", f"{g['other']:.1f} s ({pct(g['other'])})"),
        ("counters that survived restarts", ""),
        ("  - samples trained on", f"{progress['position']}" + (
            "" if samples is None else " (none repeated or skipped)" if samples["ok"]
            else " (REPEATED OR SKIPPED)")),
        ("  - gradient bytes sent, all ranks", f"{progress['bytes_sent'] / 1e6:.1f} MB"),
        ("  - job starts, resizes", f"{progress['runs']}, {progress['resizes']}"),
    ]
    w = max(len(k) for k, _ in rows)
    v = max(len(x) for _, x in rows)
    line = "+" + "-" * (w + 2) + "+" + "-" * (v + 2) + "+"
    return "\n".join([line] + [f"| {k:<{w}} | {x:<{v}} |" for k, x in rows] + [line])


def timeline_overlap(path):
    """(mean ratio, [per-process ratios]) of a merged TUTTI_TIMELINE trace:
    gradient communication hidden under compute / min(compute, communication)
    (scripts/timeline_trace.overlap), for every rank and run."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import timeline_trace
    events = timeline_trace.load(path)
    ratios = [timeline_trace.overlap(events, pid)[0] for pid in timeline_trace.pids(events)]
    ratios = [r for r in ratios if r is not None]
    return (sum(ratios) / len(ratios) if ratios else None), ratios


def table(s, ref=None, overlap=None):
    rows = [
        ("throughput", f"{s['throughput']:.0f} samples/s"),
        ("final loss", f"{s['final_loss']:.4f}"),
        ("loss-scale overflows (skipped steps)", f"{s['skipped']}"),
        ("gradient bytes sent per rank", f"{s['wire_mb']:.1f} MB"),
        ("compression ratio", f"x{s['compression']:.1f}"),
        ("checkpoints committed", f"{s['ckpt_count']} ({s['ckpt_mb']:.2f} MB per rank each)"),
        ("checkpoint blocking time", f"{s['ckpt_block_mean_ms']:.2f} ms mean, {s['ckpt_block_max_ms']:.2f} ms max"),
        ("interruptions", f"{s['interruptions']} (notice at step {', '.join(map(str, s['notice_steps'])) or '-'})"),
        ("steps recomputed after restart", f"{s['recomputed_steps']}"),
        ("time lost to the interruption", f"{s['lost_s']:.2f} s (save, exit, restart, load)"),
        ("wall time", f"{s['wall']:.1f} s"),
    ]
    if ref is not None:
        rows.append(("uninterrupted run, wall time", f"{ref['wall']:.1f} s"))
    if overlap is not None:
        mean, ratios = overlap
        rows.append(("overlap (timeline: comm hidden under compute)",
                     "-" if mean is None else
                     f"{100 * mean:.0f}% (per rank {min(ratios) * 100:.0f}-{max(ratios) * 100:.0f}%)"))
    w = max(len(k) for k, _ in rows)
    line = "+" + "-" * (w + 2) + "+" + "-" * 52 + "+"
    out = [line]
    for k, v in rows:
        out.append(f"| {k:<{w}} | {v:<50} |")
    out.append(line)
    return "\n".join(out)


def plot(steps, events, ref_steps, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("demo_report: matplotlib is not available; no plot", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    if ref_steps:
        ax.plot([s["step"] for s in ref_steps], [s["loss"] for s in ref_steps],
                color="0.6", lw=2.5, label="uninterrupted run", zorder=1)
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for r in sorted({s["run"] for s in steps}):
        rs = [s for s in steps if s["run"] == r]
        ax.plot([s["step"] for s in rs], [s["loss"] for s in rs], color=colors[r % 4], lw=1.2,
                label="run %d%s%s" % (r, f", {rs[0]['world']} ranks" if "world" in rs[0] else "",
                                      " (resumed from checkpoint)" if r else ""), zorder=2)
    for i, n in enumerate([e for e in events if e["event"] == "notice"]):
        ax.axvline(n["step"], color="red", ls="--", lw=1)
        what = (f"a host joined: checkpoint at\nstep {n['step']}, restart larger"
                if n.get("reason") == "resize" else
                f"spot interruption ({n.get('source', '?')} notice)\ncheckpoint at step {n['step']}, restart")
        # Alternate heights (axes fraction) so that neighbouring notes do not overlap.
        ax.annotate(what, xy=(n["step"], 0.97 - 0.14 * (i % 2)), xycoords=("data", "axes fraction"),
                    xytext=(6, 0), textcoords="offset points", color="red", fontsize=9, va="top")
    skipped = [s for s in steps if s["skipped"]]
    if skipped:
        ax.scatter([s["step"] for s in skipped], [s["loss"] for s in skipped], marker="x",
                   color="black", s=18, label="skipped step (loss-scale overflow)", zorder=3)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.set_title("tutti: data-parallel training through " +
                 ("a shrink and a grow" if any(e.get("reason") == "resize" for e in events)
                  else "a spot interruption"))
    ax.legend(loc="lower left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log", nargs="?")
    ap.add_argument("--reference")
    ap.add_argument("--png")
    ap.add_argument("--samples", help="a dp_train --samples-log to check")
    ap.add_argument("--steps", type=int, help="with --samples: the steps the job ran")
    ap.add_argument("--global-batch", type=int, help="with --samples: every step's samples")
    ap.add_argument("--launches", help="tutti-run's launches.jsonl: the goodput summary")
    ap.add_argument("--final", help="with --launches: dp_train's --final file (its counters)")
    ap.add_argument("--timeline", help="a merged TUTTI_TIMELINE trace: the overlap row")
    args = ap.parse_args()
    check = None
    if args.samples:
        c = check = check_samples(args.samples, args.steps, args.global_batch)
        sched = ", ".join(f"{w} ranks from step {s}" for s, w in c["schedule"])
        print(f"samples: {c['samples']} in {c['steps']} steps ({sched}); {c['recomputed']} "
              f"recomputed after restarts; " + ("none repeated or skipped" if c["ok"] else
                                                 "PROBLEMS:\n  " + "\n  ".join(c["errors"][:20])))
        if not c["ok"]:
            sys.exit(1)
        if not args.log:
            return
    if not args.log:
        ap.error("give a log, --samples, or both")
    steps, events = load(args.log)
    if not steps:
        sys.exit("demo_report: no steps in " + args.log)
    s = summarise(steps, events)
    ref_steps, ref = None, None
    if args.reference:
        ref_steps, ref_events = load(args.reference)
        ref = summarise(ref_steps, ref_events)
    print(table(s, ref, timeline_overlap(args.timeline) if args.timeline else None))
    if args.launches:
        progress = json.load(open(args.final))["progress"]
        print("goodput (where the wall time went):")
        print(goodput_table(goodput(args.launches, steps, events, progress), progress, check))
    if args.png and plot(steps, events, ref_steps, args.png):
        print(f"loss curve: {args.png}")


if __name__ == "__main__":
    main()
