#!/usr/bin/env python3
"""Side-by-side runs of tutti's data-parallel step (bench_dp) and PyTorch DDP
(gloo, CPU; ddp_peer.py) on the same MLP shape, batch and bucket cap.

Each side measures its phases (step, compute, comm, sequential) interleaved
inside ONE run (see bench_dp.cc); the sides themselves alternate (tutti, DDP,
tutti, DDP, ...) for --rounds rounds so that load from other processes on a
shared machine hits both alike.  Each figure is the median over rounds of
each run's median.  Prints the exact commands, every run's JSON, a markdown
table, and one machine-readable line per side:

  RESULT side=tutti np=2 overlap_ratio=0.83 step_ms=... samples_per_s=...

  python3 bench/data_parallel/compare.py --np 2 --rounds 5 --cap-mb 4
  python3 bench/data_parallel/compare.py --netns tzov --per-host 1 --np 2   # netns rig
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NETNS = os.path.join(ROOT, "scripts", "netns_cluster.sh")
KEYS = ("compute_ms", "comm_ms", "sequential_ms", "step_ms", "overlap_ratio", "samples_per_s")


def run(cmd, env, timeout):
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=timeout)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        sys.stderr.write(out.stdout + out.stderr)
        raise SystemExit("failed (exit %d): %s" % (out.returncode, " ".join(cmd)))
    return json.loads(lines[-1])


def first_host(prefix):
    hosts = subprocess.run([NETNS, "hosts", "--prefix", prefix], stdout=subprocess.PIPE,
                           text=True, check=True).stdout.strip()
    return hosts.split(",")[0].split(":")[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bench", default=os.path.join(ROOT, "build/bench/data_parallel/bench_dp"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--netns", default="", help="cluster prefix (scripts/netns_cluster.sh up)")
    p.add_argument("--per-host", type=int, default=1)
    p.add_argument("--sides", default="tutti,ddp")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="measured iterations per phase")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--widths", default="512,1024,1024,1024,1024,512,16")
    p.add_argument("--cap-mb", type=float, default=4)
    p.add_argument("--first-mb", type=float, default=1)
    p.add_argument("--bucket-view", type=int, default=0,
                   help="1: gradients as bucket views on both sides (tutti's "
                        "gradient_as_bucket_view, DDP's gradient_as_bucket_view=True)")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--label", default="", help="names the configuration in RESULT lines")
    a = p.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1")
    threads = ["-x", "OPENBLAS_NUM_THREADS=1", "-x", "OMP_NUM_THREADS=1"]
    if a.netns:
        mpi = [NETNS, "run", "--prefix", a.netns, "--np", str(a.np), "--per-host",
               str(a.per_host), "--", "--bind-to", "none"] + threads
        master = first_host(a.netns)
    else:
        mpi = [a.mpiexec, "--oversubscribe", "--bind-to", "none", "-np", str(a.np)] + threads
        master = "127.0.0.1"
    common = ["--widths", a.widths, "--batch", str(a.batch), "--steps", str(a.steps),
              "--warmup", str(a.warmup), "--cap-mb", str(a.cap_mb),
              "--bucket-view", str(a.bucket_view)]
    sides = a.sides.split(",")
    port = random.randint(20000, 40000)

    def command(side, rnd):
        if side == "tutti":  # tutti's settings in this environment reach its ranks
            settings = [x for k in sorted(os.environ) if k.startswith("TUTTI_")
                        for x in ("-x", k)]
            return mpi + settings + [a.bench] + common + ["--first-mb", str(a.first_mb)]
        subnet = ["-x", "GLOO_SUBNET=" + master.rsplit(".", 1)[0] + "."] if a.netns else []
        return mpi + subnet + ["-x", "MASTER_ADDR=" + master, "-x", "MASTER_PORT=%d" % (port + rnd),
                      a.python, os.path.join(HERE, "ddp_peer.py")] + common

    for side in sides:
        print("%s: %s" % (side, " ".join(command(side, 0))))
    results = {s: [] for s in sides}
    for r in range(a.rounds):
        for side in sides:
            res = run(command(side, r), env, a.timeout)
            results[side].append(res)
            print("round %d: %s" % (r, json.dumps(res)))
            sys.stdout.flush()

    def med(side, key):
        return statistics.median(x[key] for x in results[side])

    def spread(side, key):
        v = [x[key] for x in results[side]]
        return "%.2f-%.2f" % (min(v), max(v)) if key == "overlap_ratio" else \
            "%.1f-%.1f" % (min(v), max(v))

    names = {"tutti": "tutti `Reducer`", "ddp": "PyTorch DDP, gloo"}
    print()
    print("| side | np | buckets | compute ms | comm ms | sequential ms | step ms (range) "
          "| overlap ratio (range) | samples/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for side in sides:
        print("| %s | %d | %s | %.1f | %.1f | %.1f | %.1f (%s) | %.2f (%s) | %.0f |" % (
            names[side], a.np, results[side][0].get("buckets", "-"), med(side, "compute_ms"),
            med(side, "comm_ms"), med(side, "sequential_ms"), med(side, "step_ms"),
            spread(side, "step_ms"), med(side, "overlap_ratio"), spread(side, "overlap_ratio"),
            med(side, "samples_per_s")))
    print()
    for side in sides:
        print("RESULT label=%s side=%s np=%d rounds=%d %s" % (
            a.label or "-", side, a.np, a.rounds,
            " ".join("%s=%.3f" % (k, med(side, k)) for k in KEYS)))
    if "tutti" in sides and "ddp" in sides:
        print("throughput tutti / DDP: %.2fx" % (
            med("tutti", "samples_per_s") / med("ddp", "samples_per_s")))


if __name__ == "__main__":
    main()
