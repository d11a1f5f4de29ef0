#!/usr/bin/env python3
"""Where a restart's time goes (issue 28, "Restart cost"): a Horovod elastic
job (restart_train.py, 2 ranks) under tutti-run loses a rank (SIGKILL-like
os._exit(9) before step 8; commits every 3 steps), and tutti-run restarts
it.  Each rank stamps its phases; the table cuts the time from the loss to
the next completed step into: mpirun ends the job and tutti-run starts the
next one (loss -> new process), Python imports (torch, tutti), init
(MPI + tutti), the elastic state, loading the last commit, the first step.
Side by side in one invocation: commits in a checkpoint directory and in
the memory tier (no directory).

  python3 bench/spot/restart_cost.py [--params N] [--dir-root /tmp]

Prints a markdown table (seconds); bench/RESULTS.md keeps the measured one.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def run(mode, params, dir_root, mpirun):
    tmp = tempfile.mkdtemp(prefix=f"tutti-rc-{mode}-", dir=dir_root)
    out = os.path.join(tmp, "out")
    os.makedirs(out)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_WORLD", "PMIX_"))}
    env.update(RC_OUT=out, RC_PARAMS=str(params), RC_KILL="1:8", RC_STEPS="12",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               TUTTI_MEM_DIR=env.get("TUTTI_MEM_DIR", "/dev/shm"))
    for k in ("TUTTI_CKPT_DIR", "TUTTI_JOB_ID", "TUTTI_RESTART_COUNT"):
        env.pop(k, None)
    if mode == "directory":
        env["TUTTI_CKPT_DIR"] = os.path.join(tmp, "ckpt")
    build_pkg = os.path.join(ROOT, "build", "python_pkg")
    if os.path.isdir(build_pkg):
        env["PYTHONPATH"] = build_pkg + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "tutti-run"), "--mpirun", mpirun,
           "--backoff", "0", "--max-restarts", "1", "--", "--oversubscribe", "--bind-to", "none",
           "-np", "2", "-x", "PYTHONPATH", "-x", "RC_OUT", "-x", "RC_PARAMS", "-x", "RC_KILL",
           "-x", "RC_STEPS", sys.executable, os.path.join(HERE, "restart_train.py")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"{mode}: tutti-run exited {p.returncode}\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    ph = {}
    for name in os.listdir(out):
        _, restart, rank = name[:-5].split("-")
        with open(os.path.join(out, name)) as f:
            ph[(int(restart), int(rank))] = json.load(f)
    killed = ph[(0, 1)]["killed"]
    new = [ph[(1, r)] for r in (0, 1)]
    first = max(n["first_step"] for n in new)
    rows = [("loss -> new process (mpirun ends, tutti-run restarts)",
             min(n["process"] for n in new) - killed),
            ("import torch", max(n["import_torch"] - n["process"] for n in new)),
            ("import tutti.torch", max(n["import_tutti"] - n["import_torch"] for n in new)),
            ("hvd.init()", max(n["init"] - n["import_tutti"] for n in new)),
            ("model + elastic state", max(n["state"] - n["init"] for n in new)),
            ("load the last commit (elastic.run)", max(n["loaded"] - n["state"] for n in new)),
            ("first step", max(n["first_step"] - n["loaded"] for n in new)),
            ("loss -> first completed step", first - killed)]
    commit = sorted(c for v in ph.values() for c in v.get("commit_s", []))
    return rows, new[0]["first_step_number"], commit[len(commit) // 2] if commit else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=int, default=1 << 24, help="float32 parameters")
    ap.add_argument("--dir-root", default=None, help="where the checkpoint directory goes")
    ap.add_argument("--mpirun", default=os.environ.get("TUTTI_MPIEXEC", "mpirun"))
    a = ap.parse_args()
    results = {m: run(m, a.params, a.dir_root, a.mpirun) for m in ("directory", "memory tier")}
    mb = a.params * 4 * 2 / 2**20
    print(f"| phase ({a.params} float32 parameters + momentum: {mb:.0f} MiB per commit) | "
          "checkpoint directory, s | memory tier, s |")
    print("|---|---:|---:|")
    for i, (name, _) in enumerate(results["directory"][0]):
        print(f"| {name} | {results['directory'][0][i][1]:.2f} | "
              f"{results['memory tier'][0][i][1]:.2f} |")
    print(f"| median commit (blocking) | {results['directory'][2]:.2f} | "
          f"{results['memory tier'][2]:.2f} |")
    print(f"| step resumed at (lost at 8, commits every 3) | {results['directory'][1]} | "
          f"{results['memory tier'][1]} |")


if __name__ == "__main__":
    main()
