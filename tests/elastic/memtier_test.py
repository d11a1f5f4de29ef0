#!/usr/bin/env python3
"""The memory tier across hosts (issue 28; docs/checkpoint.md, "Memory
tier") with real processes: elastic_cpp_probe under elastic tutti-run on
three fake hosts (UTS namespaces behind memtier_agent.sh, each with its own
TUTTI_MEM_DIR), one rank each (two: -3x2), a commit every step and no
checkpoint directory.  w has 1 MiB per rank and TUTTI_CKPT_CHUNK_MB=1, so every rank writes a
file of each commit.

  memtier_test.py PROBE TUTTI_RUN MPIEXEC CASE

lost-host  every process of hostc stops (SIGSTOP, then SIGKILL) past step 5 (and hostc leaves
           discovery): tutti-run restarts on hosta and hostb, which restore
           the newest commit from memory, rank 2's file from its buddy copy
           on hosta; at most one step is recomputed; w = closed form.
lost-host-3x2  the same with 2 ranks per host (6 -> 4 ranks; ranks 4-5's
           files from their buddies on hosta).
kill-rank  rank 1 dies before step 6, every host lives: the restart at 3
           ranks restores step 5 from memory without buddy copies (the
           restart path: tutti-run --ulfm off, else the survivors would
           recover in-process, which the ulfm tests cover).
no-buddy   as lost-host with TUTTI_MEM_BUDDY_EVERY=0: no host holds rank 2's
           files, so the restart says why and starts fresh (w = closed form).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from fake_hosts import host_processes

probe, tutti_run, mpiexec, case = sys.argv[1:5]
PER_HOST = 2 if case.endswith("-3x2") else 1
lost = "2" if PER_HOST == 1 else "4-5"   # hostc's ranks
HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 30
MPI_OPTS = ["--mca", "plm_rsh_agent", os.path.join(HERE, "memtier_agent.sh"),
            "--mca", "plm_rsh_no_tree_spawn", "1", "--oversubscribe", "--bind-to", "none",
            "--mca", "btl", "self,tcp"]


def closed_form(steps):
    w = 1.0
    for s in range(1, steps + 1):
        w = w / 2 + s
    return w


def read_int(path):
    try:
        with open(path) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def main():
    tmp = tempfile.mkdtemp(prefix="tutti-memtier-")
    out, mem = os.path.join(tmp, "out"), os.path.join(tmp, "mem")
    triggers, down = os.path.join(tmp, "triggers"), os.path.join(tmp, "down")
    for d in (out, mem, triggers, down):
        os.makedirs(d)
    hosts = os.path.join(tmp, "hosts.txt")
    disc = os.path.join(tmp, "discover.sh")
    with open(hosts, "w") as f:
        f.write("".join(f"host{h}:{PER_HOST}\n" for h in "abc"))
    with open(disc, "w") as f:
        f.write(f"#!/bin/sh\ncat {hosts}\n")
    os.chmod(disc, 0o755)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "TUTTI_RESTART_COUNT"))}
    for k in ("TUTTI_CKPT_DIR", "TUTTI_JOB_ID", "TUTTI_MEM_DIR"):
        env.pop(k, None)  # TUTTI_MEM_DIR: per host, from memtier_agent.sh
    env.update(MEMTIER_BASE=mem, ELASTIC_TEST_TRIGGERS=triggers, ELASTIC_TEST_DOWN=down,
               TUTTI_CKPT_CHUNK_MB="1", TUTTI_TIMEOUT="5", TUTTI_PREEMPT_SOURCES="signals",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if case == "no-buddy":
        env["TUTTI_MEM_BUDDY_EVERY"] = "0"
    args = ["--steps", str(STEPS), "--out", out, "--n", str(3 * PER_HOST * 131072),
            "--commit-every", "1",
            "--step-ms", "150"]
    if case == "kill-rank":
        args += ["--kill", "1:6"]
    cmd = [sys.executable, tutti_run, "--mpirun", mpiexec, "--min-np", str(2 * PER_HOST),
           "--max-np", str(3 * PER_HOST),
           "--host-discovery-script", disc, "--elastic-dir", os.path.join(tmp, "edir"),
           "--backoff", "0", "--discovery-interval", "0.3", "--exit-grace", "3",
           "--max-restarts", "2"] + (["--ulfm", "off"] if case == "kill-rank" else []) + \
        ["--"] + MPI_OPTS + [probe] + args
    logf = open(os.path.join(tmp, "log"), "w+")
    job = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT)
    problems = []
    killed_at = None
    victims = []
    try:
        if case != "kill-rank":
            deadline = time.monotonic() + 90
            while read_int(os.path.join(out, "committed")) < 5 and time.monotonic() < deadline:
                if job.poll() is not None:
                    break
                time.sleep(0.05)
            if read_int(os.path.join(out, "committed")) < 5:
                problems.append("no commit of step 5 within 90 s")
            else:
                open(os.path.join(down, "hostc"), "w").close()
                with open(hosts + ".tmp", "w") as f:
                    f.write(f"hosta:{PER_HOST}\nhostb:{PER_HOST}\n")
                os.replace(hosts + ".tmp", hosts)
                # SIGSTOP first, as a host that vanishes: no connection closes,
                # hosta's and hostb's ranks time out (TUTTI_TIMEOUT) and exit
                # 76, and tutti-run restarts without hostc (Open MPI 5.0's
                # mpiexec exits 0 when a daemon is SIGKILLed outright, which
                # tutti-run would take for the job's end).  SIGKILLed below.
                victims = host_processes("hostc", triggers)
                for p in victims:
                    try:
                        os.kill(p, signal.SIGSTOP)
                    except ProcessLookupError:
                        pass
                time.sleep(0.5)  # a commit that landed before the kill is on rank 0's file
                killed_at = read_int(os.path.join(out, "committed"))
                print(f"stopped {len(victims)} processes of hostc; last commit: step {killed_at}",
                      flush=True)
                if len(victims) < 1 + PER_HOST:  # its daemon and its ranks
                    problems.append(f"found only {victims} on hostc")
        rc = job.wait(timeout=150)
    except subprocess.TimeoutExpired:
        job.kill()
        rc = "timeout"
    for p in victims:  # the "host" is gone: nothing reaches these
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    logf.seek(0)
    log = logf.read()
    if rc != 0:
        problems.append(f"tutti-run exited {rc}")
    starts = []
    try:
        with open(os.path.join(tmp, "edir", "launches.jsonl")) as f:
            starts = [json.loads(l)["np"] for l in f if '"start"' in l]
    except OSError:
        pass
    want_np = [3, 3] if case == "kill-rank" else [3 * PER_HOST, 2 * PER_HOST]
    if starts != want_np:
        problems.append(f"launches at {starts} ranks, expected {want_np}")
    try:
        with open(os.path.join(out, "events.rank0")) as f:
            ev = [e for e in f.read().split("\n") if e]
    except OSError:
        ev = []
    resumed = int(ev[-1].split()[2]) if ev and ev[-1].startswith("start 1 ") else None
    if len(ev) != 3 or ev[:2] != ["start 0 0", "reset"] or resumed is None:
        problems.append(f"rank 0 events {ev}: expected a fresh start, the resets, a restart")
    elif case == "kill-rank" and resumed != 5:
        problems.append(f"resumed from step {resumed}, expected 5 (rank 1 died before step 6)")
    elif case.startswith("lost-host") and killed_at is not None and resumed < killed_at:
        problems.append(f"resumed from step {resumed}, but step {killed_at} was committed "
                        "when hostc was lost (more than one step recomputed)")
    elif case == "no-buddy" and resumed != 0:
        problems.append(f"resumed from step {resumed}, expected a fresh start (0)")
    wants = {"lost-host": ["restoring step-", f"buddy copies used for rank(s) {lost}"],
             "lost-host-3x2": ["restoring step-", f"buddy copies used for rank(s) {lost}"],
             "kill-rank": ["restoring step-00000005", "no buddy copy needed"],
             "no-buddy": ["buddy copies are off (TUTTI_MEM_BUDDY_EVERY=0)",
                          "lacks the files of rank(s) 2 of the 3-rank job",
                          "no complete commit across the surviving hosts"]}[case]
    for w in wants:
        if w not in log:
            problems.append(f"'{w}' not in the log")
    try:
        with open(os.path.join(out, "result.json")) as f:
            res = json.load(f)
        if res["w"] != [closed_form(STEPS)] * 4 or not res["all_same"]:
            problems.append(f"result {res}, closed form {closed_form(STEPS)}")
    except (OSError, ValueError, KeyError) as e:
        problems.append(f"no result: {e}")
    if problems:
        print("\n".join(problems))
        print(log[-8000:])
        return 1
    restore = [l for l in log.split("\n") if "memory tier: restoring" in l or "lacks" in l]
    print("\n".join(restore))
    print(f"memtier {case}: OK (resumed from step {resumed}"
          + (f", last commit before the loss {killed_at})" if killed_at is not None else ")"))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


sys.exit(main())
