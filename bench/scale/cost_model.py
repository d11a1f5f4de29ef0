#!/usr/bin/env python3
"""Projects tutti's own protocol costs to W = 1,024 and 8,192 ranks.

Inputs: bench/scale/counts.json, counts measured by the scale tests
(tests/scale/, label "scale") at np 2..16 on one machine: per protocol, the
quantity counted at each W.  Each protocol is fitted by least squares to
the growth class the design claims (a + b*ceil(log2 W), a + b*W, or a
constant) and the fit's largest residual is printed, so a claim that the
counts do not support shows up as a large residual.  The fitted counts are
then priced with the stated assumptions below (override with flags).

  python3 bench/scale/cost_model.py                 # markdown tables
  python3 bench/scale/cost_model.py --alpha-us 50   # another network

Nothing here is measured at 1,024 ranks: the projection is counts (measured,
then extrapolated along the fitted class) times assumed unit costs.
"""
import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def lg(w):
    return math.ceil(math.log2(w)) if w > 1 else 0


def xof(w, cls):
    """The regressor of a growth class: ceil(log2 W), W, or nothing."""
    return lg(w) if cls == "log" else (w if cls == "linear" else 0)


def fit(points, cls):
    """Least squares of y = a + b*x(W) over the measured (W, y) points."""
    xs = [xof(w, cls) for w, _ in points]
    ys = [y for _, y in points]
    n = len(xs)
    if cls == "max":  # a bound reached once the tree is deep enough
        return max(ys), 0.0, 0.0
    if cls == "const" or len(set(xs)) < 2:
        a = sum(ys) / n
        b = 0.0
    else:
        mx, my = sum(xs) / n, sum(ys) / n
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        a = my - b * mx
    resid = max(abs(a + b * x - y) for x, y in zip(xs, ys))
    return a, b, resid


def at(a, b, cls, w):
    return a + b * xof(w, cls)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--counts", default=os.path.join(HERE, "counts.json"))
    p.add_argument("--alpha-us", type=float, default=25.0, help="latency per message hop")
    p.add_argument("--link-gbs", type=float, default=12.5, help="bandwidth per link, GB/s")
    p.add_argument("--cpu-us-per-msg", type=float, default=2.0,
                   help="CPU per message sent or received (one progress thread)")
    p.add_argument("--fs-gbs", type=float, default=10.0, help="shared file system, aggregate GB/s")
    p.add_argument("--fs-meta-ms", type=float, default=1.0,
                   help="per metadata operation (create, fsync, rename), serialized on the MDS")
    p.add_argument("--copy-gbs", type=float, default=10.0, help="device/host snapshot copy per rank, GB/s")
    p.add_argument("--model-gb", type=float, default=112.0,
                   help="checkpointed state: 7B parameters x 16 B (bf16 weights, fp32 master, Adam)")
    p.add_argument("--mds-parallel", type=int, default=8,
                   help="metadata operations the file system serves at once")
    p.add_argument("--nccl-check-every", type=int, default=0,
                   help="NCCL ops per agreement check (TUTTI_NCCL_CHECK_EVERY); 0: tutti's "
                        "default, every op below 64 ranks and 64 from 64 ranks")
    p.add_argument("--worlds", default="1024,8192")
    a = p.parse_args()
    worlds = [int(x) for x in a.worlds.split(",")]
    with open(a.counts) as f:
        data = json.load(f)
    alpha = a.alpha_us * 1e-6

    print("## Fitted counts (measured at np %s)\n" % ", ".join(
        str(w) for w in sorted({int(w) for v in data["protocols"].values() for w in v["measured"]})))
    print("| protocol | quantity | class | fit | largest residual | " +
          " | ".join("W=%d" % w for w in worlds) + " |")
    print("|---|---|---|---|---:|" + "---:|" * len(worlds))
    fitted = {}
    for name, v in data["protocols"].items():
        pts = sorted((int(w), float(y)) for w, y in v["measured"].items())
        ca, cb, r = fit(pts, v["class"])
        fitted[name] = (ca, cb, v["class"])
        form = {"log": "%.2f + %.2f ceil(log2 W)" % (ca, cb),
                "linear": "%.2f + %.3f W" % (ca, cb),
                "const": "%.2f" % ca, "max": "at most %.0f" % ca}[v["class"]]
        print("| %s | %s | %s | %s | %.2f | %s |" % (
            name, v["quantity"], v["class"], form, r,
            " | ".join("%.0f" % at(ca, cb, v["class"], w) for w in worlds)))

    def f(name, w):
        ca, cb, cls = fitted[name]
        return at(ca, cb, cls, w)

    print("\n## Projection (assumptions: %.0f us per hop, %.1f GB/s per link, %.1f us CPU per "
          "message, file system %.0f GB/s and %.1f ms per metadata op (%d at once), snapshot copy "
          "%.0f GB/s per rank, %.0f GB of state)\n" % (a.alpha_us, a.link_gbs, a.cpu_us_per_msg,
                                                    a.fs_gbs, a.fs_meta_ms, a.mds_parallel,
                                                    a.copy_gbs, a.model_gb))
    print("| quantity | " + " | ".join("W=%d" % w for w in worlds) + " | target |")
    print("|---|" + "---:|" * len(worlds) + "---|")
    rows = []
    if "host_small_op" in fitted:
        rows.append(("small host op (check + 1 KiB data): rounds",
                     [f("host_small_op", w) for w in worlds], "< 2x a log all-reduce"))
        rows.append(("  its latency, ms",
                     ["%.2f" % (f("host_small_op", w) * alpha * 1e3) for w in worlds], ""))
        rows.append(("  a recursive-doubling all-reduce alone: rounds / ms",
                     ["%d / %.2f" % (lg(w), lg(w) * alpha * 1e3) for w in worlds], ""))
        rows.append(("  before (libnbc ring check + ring data, 4(W-1)): ms",
                     ["%.0f" % (4 * (w - 1) * alpha * 1e3) for w in worlds], ""))
    if "host_check_op" in fitted:
        rows.append(("agreement check alone (an op above the fold size): rounds",
                     [f("host_check_op", w) for w in worlds], ""))
    if "nccl_check_msgs" in fitted:
        def every(w):
            return a.nccl_check_every or (1 if w < 64 else 64)
        per_op = [f("nccl_check_msgs", w) / every(w) for w in worlds]
        rows.append(("NCCL path: ops per check (TUTTI_NCCL_CHECK_EVERY)",
                     [every(w) for w in worlds], ""))
        rows.append(("  check messages per op per rank",
                     ["%.2f" % m for m in per_op], ""))
        rows.append(("  NCCL ops/s the check sustains on one progress thread",
                     ["%.0f" % (1.0 / (2 * m * a.cpu_us_per_msg * 1e-6)) for m in per_op],
                     ">= 10,000"))
        rows.append(("  the same, checking every op (TUTTI_NCCL_CHECK_EVERY=1)",
                     ["%.0f" % (1.0 / (2 * f("nccl_check_msgs", w) * a.cpu_us_per_msg * 1e-6))
                      for w in worlds], ""))
    if "save_bytes_ratio" in fitted:
        rows.append(("bytes written per save / checkpointed state",
                     ["%.2f" % f("save_bytes_ratio", w) for w in worlds], "1 (no W factor)"))
        gb = [a.model_gb * f("save_bytes_ratio", w) for w in worlds]
        rows.append(("  bytes per save, 7B, GB", ["%.0f" % g for g in gb], "%.0f" % a.model_gb))
        n2c = []
        for w, g in zip(worlds, gb):
            snap = a.model_gb / w / a.copy_gbs
            write = g / a.fs_gbs
            meta = 3 * (w + 2) * a.fs_meta_ms * 1e-3 / max(1, a.mds_parallel)
            commit = f("commit_msgs", w) * alpha if "commit_msgs" in fitted else 0
            n2c.append("%.1f" % (snap + write + meta + commit))
        rows.append(("  notice-to-commit, 7B, s (snapshot + write + metadata + commit)",
                     n2c, "<= 30"))
    if "commit_msgs" in fitted:
        rows.append(("commit: messages per rank", [f("commit_msgs", w) for w in worlds], "log"))
    if "load_opens" in fitted:
        rows.append(("shard files opened per rank at load",
                     [f("load_opens", w) for w in worlds], "not W"))
        rows.append(("  opens in the job", [f("load_opens", w) * w for w in worlds],
                     "before: W^2"))
    if "stall_msgs" in fitted:
        rows.append(("stall report: messages per process per report",
                     [f("stall_msgs", w) for w in worlds], "<= 2 fanout + 2 = 18"))
    if "stall_total" in fitted:
        rows.append(("  in the job per report (every rank waiting)",
                     [f("stall_total", w) for w in worlds], "before: 2W(W-1)"))
        rows.append(("  before: every waiting rank asks every peer",
                     [2.0 * w * (w - 1) for w in worlds], ""))
    for name, vals, target in rows:
        print("| %s | %s | %s |" % (name, " | ".join(
            v if isinstance(v, str) else "%.0f" % v for v in vals), target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
