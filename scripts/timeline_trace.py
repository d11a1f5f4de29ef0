"""Reading tutti timelines (TUTTI_TIMELINE, docs/timeline.md): load a rank's
file (also one cut short by SIGKILL), check it against the Chrome
trace-event format, find the spans of compute and of each bucket's
communication, and compute the overlap ratio.

Used by scripts/timeline_merge.py, scripts/timeline_png.py,
scripts/demo_report.py and tests/core/timeline_test.py.
"""
import glob
import json
import os
import re

# Phases of the Chrome trace-event format (JSON Array / Object Format).
PHASES = set("BEXiIC") | set("bnesStfPONDMRcV()")
METADATA = {"process_name", "process_labels", "process_sort_index",
            "thread_name", "thread_sort_index"}
BUCKET = re.compile(r"bucket ?(\d+)")


def load(path):
    """The events of one trace file: a JSON array (closed or, after a
    crash, unterminated) or an object with traceEvents."""
    text = open(path).read().strip()
    if text.startswith("{"):
        return json.loads(text)["traceEvents"]
    if not text.endswith("]"):
        text = text.rstrip().rstrip(",") + "]"  # what Chrome does
    return json.loads(text)


def rank_files(path):
    """The per-rank files TUTTI_TIMELINE=path wrote (<path>.rank<R>*.json
    or <path>/rank<R>*.json), sorted."""
    if os.path.isdir(path):
        found = glob.glob(os.path.join(path, "rank*.json"))
    else:
        found = glob.glob(glob.escape(path) + ".rank*.json")
    return sorted(found, key=lambda f: [int(n) for n in re.findall(r"\d+", os.path.basename(f))])


def validate(events):
    """Problems with `events` as Chrome trace events (empty: none)."""
    bad = []
    open_spans = {}
    for n, e in enumerate(events):
        where = f"event {n} ({e.get('name')!r})"
        for key, kind in (("name", str), ("ph", str), ("pid", int), ("tid", int)):
            if not isinstance(e.get(key), kind):
                bad.append(f"{where}: '{key}' missing or not {kind.__name__}")
        if not isinstance(e.get("ts"), (int, float)) or isinstance(e.get("ts"), bool):
            bad.append(f"{where}: 'ts' (microseconds) missing or not a number")
        ph = e.get("ph")
        if ph not in PHASES:
            bad.append(f"{where}: phase {ph!r} is not a trace-event phase")
        if ph == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            bad.append(f"{where}: complete event without a duration >= 0")
        if ph == "M":
            if e.get("name") not in METADATA:
                bad.append(f"{where}: unknown metadata event")
            elif e["name"].endswith("_name") and not isinstance(e.get("args", {}).get("name"), str):
                bad.append(f"{where}: metadata without args.name")
        if ph in ("i", "I") and e.get("s", "t") not in ("g", "p", "t"):
            bad.append(f"{where}: instant scope {e.get('s')!r}")
        if "args" in e and not isinstance(e["args"], dict):
            bad.append(f"{where}: args is not an object")
    # B/E nest per thread: in time order (file order breaks ties), each E
    # closes the innermost open B of its thread, with the same name.
    be = sorted((e["ts"], n, e) for n, e in enumerate(events) if e.get("ph") in ("B", "E"))
    for ts, n, e in be:
        stack = open_spans.setdefault((e["pid"], e["tid"]), [])
        if e["ph"] == "B":
            stack.append(e)
        elif not stack:
            bad.append(f"event {n}: E '{e['name']}' on pid {e['pid']} tid {e['tid']} with no open B")
        elif stack[-1]["name"] != e["name"]:
            bad.append(f"event {n}: E '{e['name']}' closes B '{stack[-1]['name']}'")
        else:
            stack.pop()
    return bad


def spans(events, pid=None):
    """{'compute': [(t0, t1)], 'bucket k': [...], 'collectives': [...],
    'checkpoint': [...], 'compression': [...]} in microseconds, for one
    process (all when pid is None)."""
    out = {"compute": [], "collectives": [], "checkpoint": [], "compression": []}
    stacks = {}
    for e in sorted(events, key=lambda e: e.get("ts", 0)):
        if pid is not None and e.get("pid") != pid:
            continue
        ph, cat = e.get("ph"), e.get("cat")
        if cat == "user" and ph in ("B", "E"):
            st = stacks.setdefault((e["pid"], e["tid"]), [])
            if ph == "B":
                st.append(e["ts"])
            elif st:
                t0 = st.pop()
                if not st:  # outermost spans only
                    out["compute"].append((t0, e["ts"]))
        if ph != "X":
            continue
        iv = (e["ts"], e["ts"] + e["dur"])
        if cat == "comm" and e["name"] != "agreement":
            m = BUCKET.search(e["name"])
            out.setdefault(f"bucket {m.group(1)}" if m else "collectives", []).append(iv)
        elif cat == "checkpoint":
            out["checkpoint"].append(iv)
        elif cat == "compression":
            out["compression"].append(iv)
    return out


def union(intervals):
    merged = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [tuple(m) for m in merged]


def length(intervals):
    return sum(b - a for a, b in intervals)


def intersect(xs, ys):
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def overlap(events, pid=None):
    """(ratio, compute_us, comm_us, hidden_us): the gradient communication
    (every bucket's collectives) hidden under compute, over
    min(compute, communication).  ratio is None without both."""
    s = spans(events, pid)
    compute = union(s["compute"])
    comm = union([iv for k, v in s.items() if k.startswith("bucket ") for iv in v])
    hidden = length(intersect(compute, comm))
    c, m = length(compute), length(comm)
    ratio = hidden / min(c, m) if c > 0 and m > 0 else None
    return ratio, c, m, hidden


def pids(events):
    return sorted({e["pid"] for e in events if isinstance(e.get("pid"), int)})
