#!/usr/bin/env python3
"""Overhead of TUTTI_TIMELINE on the demo job (dp_train under mpirun),
side by side in one run: the same job with the timeline off and on,
interleaved (off, on, off, on, ...) so that machine load hits both alike;
median training time (dp_train's own counter: the step loop, not start-up)
of --runs runs per side.

  bench/timeline/bench_timeline.py BUILD_DIR [--np 2] [--steps 200] [--runs 7]
      [--compression powersgd] [--step-sleep-ms 0]

Prints one row per configuration: off and on medians of the training time,
the overhead in percent, the spread (max-min over median) of each side; the
medians of the CPU time (user + system) of the whole job (mpirun and every
rank: start-up included) and its overhead; and the trace size.  On a loaded
machine the CPU time is the steadier of the two.
"""
import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile


def run(args, work, timeline):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1", TUTTI_PREEMPT_SOURCES="signals")
    env.pop("TUTTI_TIMELINE", None)
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(args.np)]
    if timeline:
        env["TUTTI_TIMELINE"] = timeline
        cmd += ["-x", "TUTTI_TIMELINE"]
    cmd += [os.path.join(args.build, "examples/dp_train/dp_train"), "--steps", str(args.steps),
            "--compression", args.compression, "--step-sleep-ms", str(args.step_sleep_ms),
            "--log-every", str(args.steps), "--learn-ratio", "0",
            "--ckpt-dir", os.path.join(work, "ckpt"), "--ckpt-every", str(args.ckpt_every)]
    shutil.rmtree(os.path.join(work, "ckpt"), ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return float(re.search(r"training ([0-9.]+) s", out).group(1)), cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--compression", default="powersgd")
    ap.add_argument("--step-sleep-ms", type=int, default=0)
    ap.add_argument("--ckpt-every", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        off, on, size = [], [], 0
        for _ in range(args.runs):
            off.append(run(args, work, None))
            tl = os.path.join(work, "tl")
            on.append(run(args, work, tl))
            size = sum(os.path.getsize(os.path.join(work, f)) for f in os.listdir(work)
                       if f.startswith("tl.rank"))
        off_cpu, on_cpu = [c for _, c in off], [c for _, c in on]
        off, on = [t for t, _ in off], [t for t, _ in on]
        mo, mn = statistics.median(off), statistics.median(on)
        co, cn = statistics.median(off_cpu), statistics.median(on_cpu)
        print(f"| np {args.np}, {args.steps} steps, {args.compression}, sleep {args.step_sleep_ms} ms "
              f"| {mo:.3f} s | {mn:.3f} s | {100 * (mn - mo) / mo:+.1f}% "
              f"| {100 * (max(off) - min(off)) / mo:.0f}% / {100 * (max(on) - min(on)) / mn:.0f}% "
              f"| {co:.2f} s | {cn:.2f} s | {100 * (cn - co) / co:+.1f}% | {size / 1e6:.1f} MB |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
