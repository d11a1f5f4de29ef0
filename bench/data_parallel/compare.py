#!/usr/bin/env python3
"""Side-by-side run of tutti's data-parallel step (bench_dp) and PyTorch DDP
(gloo, CPU; ddp_peer.py) on the same MLP shape, batch and bucket cap.

The two are interleaved (tutti, DDP, tutti, DDP, ...) for --rounds rounds so
that load from other processes on a shared machine hits both alike; each
figure is the median over rounds of each round's median step.  Prints the
exact commands, the per-round JSON and a markdown table for bench/RESULTS.md.

  python3 bench/data_parallel/compare.py --bench build/bench/data_parallel/bench_dp \
      --np 2 --rounds 5 --cap-mb 4
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run(cmd, env):
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=600)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        sys.stderr.write(out.stdout + out.stderr)
        raise SystemExit("failed: " + " ".join(cmd))
    return json.loads(lines[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bench", default="build/bench/data_parallel/bench_dp")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--widths", default="512,1024,1024,1024,1024,512,16")
    p.add_argument("--cap-mb", type=float, default=4)
    p.add_argument("--first-mb", type=float, default=1)
    a = p.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1")
    mpi = [a.mpiexec, "--oversubscribe", "--bind-to", "none", "-np", str(a.np)]
    common = ["--widths", a.widths, "--batch", str(a.batch), "--steps", str(a.steps),
              "--cap-mb", str(a.cap_mb)]
    tutti_cmd = mpi + [a.bench] + common + ["--first-mb", str(a.first_mb)]
    print("tutti: OPENBLAS_NUM_THREADS=1 " + " ".join(tutti_cmd))
    print("ddp:   " + " ".join(mpi + ["-x", "MASTER_PORT=<free>", a.python,
                                     os.path.join("bench/data_parallel/ddp_peer.py")] + common))
    results = {"tutti": [], "ddp": []}
    for r in range(a.rounds):
        t = run(tutti_cmd, env)
        port = free_port()
        d = run(mpi + ["-x", "MASTER_PORT=%d" % port, a.python,
                       os.path.join(HERE, "ddp_peer.py")] + common, env)
        results["tutti"].append(t)
        results["ddp"].append(d)
        print("round %d: %s" % (r, json.dumps(t)))
        print("round %d: %s" % (r, json.dumps(d)))
        sys.stdout.flush()

    def med(impl, key):
        return statistics.median(x[key] for x in results[impl])

    def spread(impl, key):
        v = [x[key] for x in results[impl]]
        return "%.1f-%.1f" % (min(v), max(v))

    print()
    print("| impl | compute ms | comm ms | step ms (range) | overlap ratio | samples/s |")
    print("|---|---|---|---|---|---|")
    for impl, label in (("tutti", "tutti Reducer"), ("ddp", "PyTorch DDP gloo")):
        print("| %s | %.1f | %.1f | %.1f (%s) | %.2f | %.0f |" % (
            label, med(impl, "compute_ms"), med(impl, "comm_ms"), med(impl, "step_ms"),
            spread(impl, "step_ms"), med(impl, "overlap_ratio"), med(impl, "samples_per_s")))
    print()
    print("tutti sequential (no overlap) step: %.1f ms" % med("tutti", "sequential_ms"))
    print("throughput tutti / DDP: %.2fx" % (med("tutti", "samples_per_s") / med("ddp", "samples_per_s")))
    print("step overhead over compute: tutti %.2fx, DDP %.2fx" % (
        med("tutti", "step_ms") / med("tutti", "compute_ms"),
        med("ddp", "step_ms") / med("ddp", "compute_ms")))


if __name__ == "__main__":
    main()
