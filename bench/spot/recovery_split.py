#!/usr/bin/env python3
"""Where the time of an in-process recovery goes (issue 28), from a
bench/spot/spot_trace.py run made with TUTTI_LOG_LEVEL=debug in its
environment and --work kept:

  kill -> seen      the signal to the first survivor's kRanksLost (tutti's
                    debug line "a rank died: first seen in ...", any rank)
  seen -> recovered to the end of tutti::recover() on the new rank 0 (its
                    line "recovered in-process: lost world rank ...")
  recovered -> loaded  to the training function entered again (spot_job's
                    "start" record: the commit reloaded, synced, re-saved)
  loaded -> step    to the next completed step (one step of the job)

and recover()'s own parts on the new rank 0 (its debug line "recover():
revoke .., shrink .., agree .., release .., new world ..").

  bench/spot/recovery_split.py /tmp/spot.json /tmp/spotwork [--mode inprocess]

Prints one row per in-process recovery and min / median / max per column.
"""
import argparse
import datetime
import json
import os
import re
import statistics

LINE = re.compile(r"\[tutti (\d+)/(\d+) \w (\d\d):(\d\d):(\d\d)\.(\d+)\] (.*)")
PARTS = ("revoke", "shrink", "agree", "release", "new world")


def log_lines(path, near):
    """(unix time, rank, size, text) of tutti's log lines; the clock time is
    put on the local date that brings it nearest to `near`."""
    day = datetime.datetime.fromtimestamp(near).replace(hour=0, minute=0, second=0,
                                                        microsecond=0)
    out = []
    with open(path, errors="replace") as f:
        for ln in f:
            m = LINE.search(ln)
            if not m:
                continue
            h, mi, s, ms = (int(m.group(i)) for i in range(3, 7))
            t = (day + datetime.timedelta(hours=h, minutes=mi, seconds=s,
                                          milliseconds=ms)).timestamp()
            t += 86400 * round((near - t) / 86400)
            out.append((t, int(m.group(1)), int(m.group(2)), m.group(7)))
    return out


def split(result, work):
    mode_dir = os.path.join(work, result["mode"])
    recs = result["records"]
    lines = log_lines(os.path.join(mode_dir, "tutti-run.log"), result["start"])
    rows = []
    for e in result["events"]:
        if e.get("kind") != "kill" or e.get("recovered") != "in-process":
            continue
        k = e["fired"]
        start = next((r for r in recs if r["ev"] == "start" and r["t"] > k), None)
        if start is None:
            continue
        step = next((r for r in recs if r["ev"] == "done" and r["t"] > start["t"]), None)
        seen = min((t for t, _, _, x in lines if t >= k - 0.01 and t <= start["t"]
                    and x.startswith("a rank died: first seen")), default=None)
        rec = next(((t, n) for t, r, n, x in lines if t >= k - 0.01 and r == 0
                    and x.startswith("recovered in-process: lost world rank")), None)
        parts = next((x for t, r, n, x in lines if t >= k - 0.01 and r == 0
                      and rec and n == rec[1] and x.startswith("recover(): ")), "")
        nums = dict(zip(PARTS, (float(v) for v in re.findall(r"([0-9.e+-]+) s", parts))))
        rows.append({
            "size": f"{start['size'] + len(e['ranks'])}->{start['size']}",
            "kill->seen": seen - k if seen else None,
            "seen->recovered": rec[0] - seen if rec and seen else None,
            "recovered->loaded": start["t"] - rec[0] if rec else None,
            "loaded->step": step["t"] - start["t"] if step else None,
            "kill->step": step["t"] - k if step else None,
            **{f"recover: {p}": nums.get(p) for p in PARTS}})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_json")
    ap.add_argument("work")
    ap.add_argument("--mode", default="inprocess")
    a = ap.parse_args()
    with open(a.out_json) as f:
        data = json.load(f)
    results = data["results"] if isinstance(data, dict) and "results" in data else data
    if isinstance(results, dict):
        results = list(results.values())
    result = next(r for r in results if r.get("mode") == a.mode)
    rows = split(result, a.work)
    if not rows:
        print("no in-process recovery from a kill in this run")
        return
    cols = [c for c in rows[0] if c != "size"]
    print("| size | " + " | ".join(c + " s" for c in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for r in rows:
        print(f"| {r['size']} | " + " | ".join(
            "—" if r[c] is None else f"{r[c]:.3f}" for c in cols) + " |")
    for name, fn in (("min", min), ("median", statistics.median), ("max", max)):
        vals = [[r[c] for r in rows if r[c] is not None] for c in cols]
        print(f"| {name} | " + " | ".join(f"{fn(v):.3f}" if v else "—" for v in vals) + " |")


if __name__ == "__main__":
    main()
