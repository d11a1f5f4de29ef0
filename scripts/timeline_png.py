#!/usr/bin/env python3
"""Renders the step timeline of a tutti trace as a PNG: one row for compute,
one per bucket's communication, one for other collectives, compression and
checkpoint work, for a few steps of one rank (docs/timeline.md).

  scripts/timeline_png.py out/timeline.json -o steps.png          # merged trace
  scripts/timeline_png.py out/tl -o steps.png --rank 1 --steps 4  # per-rank files

The window starts at a compute span in the middle of the run (--first picks
another) and covers --steps compute spans; the title gives the overlap ratio
over the whole trace of that rank.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timeline_trace  # noqa: E402

COLORS = {"compute": "#4c72b0", "collectives": "#8c8c8c", "compression": "#dd8452",
          "checkpoint": "#55a868"}


def events_of(path, rank):
    if os.path.isfile(path):
        return timeline_trace.load(path)
    files = timeline_trace.rank_files(path)
    if not files:
        sys.exit(f"timeline_png: no trace at {path}")
    mine = [f for f in files if f"rank{rank}." in os.path.basename(f)]
    return timeline_trace.load(mine[0] if mine else files[0])


def render(events, png, rank=0, steps=3, first=None, title=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pids = timeline_trace.pids(events)
    if rank not in pids:
        sys.exit(f"timeline_png: no rank {rank} in the trace (ranks {pids})")
    s = timeline_trace.spans(events, rank)
    compute = sorted(s["compute"])
    if compute:
        k = len(compute) // 2 if first is None else max(0, min(first, len(compute) - 1))
        t0 = compute[k][0]
        last = min(k + steps, len(compute)) - 1
        t1 = compute[last + 1][0] if last + 1 < len(compute) else compute[last][1]
    else:  # no application spans: the whole trace
        all_iv = [iv for v in s.values() for iv in v]
        if not all_iv:
            sys.exit("timeline_png: the trace has no spans to draw")
        t0, t1 = min(a for a, _ in all_iv), max(b for _, b in all_iv)
    buckets = sorted((k for k in s if k.startswith("bucket ")), key=lambda k: int(k.split()[1]))
    rows = ["compute"] + buckets + ["collectives", "compression", "checkpoint"]
    fig, ax = plt.subplots(figsize=(12, 0.5 * len(rows) + 1.5))
    cmap = plt.get_cmap("tab10")
    for y, row in enumerate(reversed(rows)):
        color = COLORS.get(row) or cmap((int(row.split()[1]) + 1) % 10)
        bars = [((a - t0) / 1e3, (b - a) / 1e3) for a, b in s.get(row, []) if b > t0 and a < t1]
        ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=color)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r + " comm" if r.startswith("bucket") else r for r in reversed(rows)])
    ax.set_xlim(0, (t1 - t0) / 1e3)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("ms")
    ratio, c, m, hidden = timeline_trace.overlap(events, rank)
    summary = (f"overlap {100 * ratio:.0f}% (communication hidden under compute / "
               f"min(compute, communication))" if ratio is not None else "no overlap data")
    ax.set_title(title or f"tutti timeline, rank {rank}: {summary}")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="a merged trace, a rank file, or the TUTTI_TIMELINE path")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--steps", type=int, default=3, help="compute spans to show")
    ap.add_argument("--first", type=int, help="index of the first compute span shown")
    args = ap.parse_args()
    render(events_of(args.trace, args.rank), args.output, args.rank, args.steps, args.first)
    print(f"timeline_png: wrote {args.output}")


if __name__ == "__main__":
    main()
