#!/usr/bin/env python3
"""Merges the per-rank traces of TUTTI_TIMELINE into one Chrome / Perfetto
trace with one process per rank (docs/timeline.md).

  scripts/timeline_merge.py out/tl -o out/timeline.json     # out/tl.rank*.json
  scripts/timeline_merge.py out/tl/ -o merged.json          # out/tl/rank*.json
  scripts/timeline_merge.py a.rank0.json a.rank1.json -o merged.json

Each rank's timestamps count from its own start; the merge puts them on one
clock.  --align wall (the default when every rank ran on one host) uses the
wall-clock time each rank recorded at its start; --align collective (the
default across hosts, whose clocks may differ by milliseconds) shifts each
rank so that the end of the first collective every rank ran on group
'world' lines up with rank 0's (a collective ends within microseconds on
every rank).  A job restarted by tutti-run (files *.restart<K>.json) shows
as one process per rank and run (pid 1000 K + rank).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timeline_trace  # noqa: E402


def anchor(events, path):
    for e in events:
        if e.get("name") == "timeline_start" and e.get("ph") == "i":
            return e["args"]
    sys.exit(f"timeline_merge: {path} has no timeline_start event (not a tutti timeline?)")


def first_world_ends(events):
    """{seq: end_us} of the collectives on group 'world'."""
    return {e["args"]["seq"]: e["ts"] + e["dur"] for e in events
            if e.get("ph") == "X" and e.get("cat") == "comm"
            and e.get("args", {}).get("group") == "world" and "seq" in e.get("args", {})}


def offsets(runs, how):
    """Microseconds to add to each run's timestamps."""
    walls = [a["wall_clock_us"] for _, a, _ in runs]
    base = min(walls)
    wall = [w - base for w in walls]
    if how == "auto":
        how = "wall" if len({a["host"] for _, a, _ in runs}) == 1 else "collective"
    if how == "wall":
        return wall, how
    # Per run of the job (restart count): line up the first common world
    # collective with the lowest rank's; runs stay apart by wall clock.
    out = list(wall)
    by_run = {}
    for n, (_, a, ev) in enumerate(runs):
        by_run.setdefault(a["restart_count"], []).append((n, first_world_ends(ev)))
    for members in by_run.values():
        common = set.intersection(*[set(ends) for _, ends in members])
        if not common:
            print("timeline_merge: no collective on 'world' common to every rank; "
                  "aligning by wall clock", file=sys.stderr)
            continue
        seq = min(common)
        ref_n, ref_ends = members[0]
        for n, ends in members[1:]:
            out[n] = out[ref_n] + ref_ends[seq] - ends[seq]
    return out, how


def merge(paths, how="auto"):
    runs = []
    for p in paths:
        ev = timeline_trace.load(p)
        runs.append((p, anchor(ev, p), ev))
    shift, how = offsets(runs, how)
    merged = []
    for (p, a, ev), dt in zip(runs, shift):
        pid = a["restart_count"] * 1000 + a["rank"]
        for e in ev:
            e = dict(e)
            e["pid"] = pid
            if e.get("ph") != "M":
                e["ts"] = round(e["ts"] + dt, 3)
            elif e.get("name") == "process_sort_index":
                e["args"] = {"sort_index": pid}
            merged.append(e)
    return {"traceEvents": merged, "displayTimeUnit": "ms",
            "otherData": {"tool": "tutti timeline_merge", "align": how,
                          "ranks": [os.path.basename(p) for p, _, _ in runs]}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="+", help="the TUTTI_TIMELINE path, or rank files")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--align", choices=("auto", "wall", "collective"), default="auto")
    args = ap.parse_args()
    paths = []
    for i in args.inputs:
        paths += [i] if os.path.isfile(i) else timeline_trace.rank_files(i)
    if not paths:
        sys.exit(f"timeline_merge: no rank files for {' '.join(args.inputs)} "
                 "(expected <path>.rank<R>.json or <path>/rank<R>.json)")
    out = merge(paths, args.align)
    problems = timeline_trace.validate(out["traceEvents"])
    if problems:
        sys.exit("timeline_merge: the merged trace is not valid:\n  " + "\n  ".join(problems[:10]))
    with open(args.output, "w") as f:
        json.dump(out, f)
    print(f"timeline_merge: {len(paths)} file(s), {len(out['traceEvents'])} events, "
          f"aligned by {out['otherData']['align']} -> {args.output}")


if __name__ == "__main__":
    main()
