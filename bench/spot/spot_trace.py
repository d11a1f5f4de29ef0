#!/usr/bin/env python3
"""Spot-trace benchmark (issue 28, "How it is shown"): a seeded trace of
events replayed against a Horovod elastic job (spot_job.py: commits every
step into the memory tier, a step of controlled duration) run under
scripts/tutti-run, once per mode, one mode after the other in one
invocation:

  none       no events: the failure-free reference
  restart    the restart path (tutti-run --ulfm off): a loss ends the mpirun
             job, tutti-run restarts it, the job resumes from the memory
             tier's last commit
  inprocess  the same trace under an MPI with ULFM (`mpiexec --with-ft ulfm`),
             where tutti.torch.elastic is to recover in-process; reported as
             'not available: <why>' when the launcher's MPI has no ULFM

Events (times in seconds from the mode's tutti-run start; an event whose
time comes while the job is not training, i.e. before the current job has
committed its first step, waits until it has, and the wait is reported):
  notice@T[:W]  preemption notice with W s of warning (default --warning):
                SIGUSR1 to every rank of one host (what the cloud metadata or
                a signal to that VM's ranks is); the job should stop at its
                next commit and exit 75.  If those ranks are still alive W s
                later they are SIGKILLed, as the VM would be.
  kill@T        SIGKILL of one rank (chosen by the seed among the running
                ranks, pids from the files the job writes)
  host@T        a lost host: SIGKILL of every process in one netns host
                (`ip netns pids`: its ranks and Open MPI's daemon; needs
                --hosts); the namespace stays, so the host returns at once
  link@T[:D]    a cut link: the host's veth on the rig's bridge is set down
                for D s (default 60), then up again (needs --hosts)
  random[:P]    one event in each P s of the run (default 60), at a uniform
                time in the middle 60 % of its window, the kind drawn from
                notice and kill (and host on the rig), a notice's warning
                from 30 s and 120 s (the issue's); fixed by --seed

Per mode: wall time (tutti-run start to exit), the final committed step,
restarts (tutti-run attempts - 1), in-process recoveries (training function
entered again in the same process), steps recomputed, and

  goodput = final committed step x t_ff / wall time

where t_ff, the failure-free step time, is the median interval between two
consecutive completed steps of one job in the `none` mode (the mode's own when
`none` is not run); with one commit per step, every step up to the final one
was committed once on the surviving path, and steps done again after a
failure are not counted twice.  "vs none" divides by the `none` mode's goodput.

Per event: the time from the failure (the signal) to the next completed step
of the job that came after it (a new tutti-run attempt, or a new entry of the
training function after an in-process recovery), and of that, the time to
the new processes' start (a restart) and to the commit loaded (the training
function entered); for a notice, to the stop step's commit; the step that job
resumed from, and the steps recomputed (the highest step completed before the
failure minus the step resumed from).  A restart that no event caused (with
--elastic: the job grown again when a host returns) is listed with its cost,
from the old job's last record to the new job's first completed step.

  bench/spot/spot_trace.py --duration 90 --np 2 --events notice@20,kill@45 \\
      --modes none,restart --out /tmp/spot.json

Prints a markdown table; bench/RESULTS.md keeps the measured ones.
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(HERE, "spot_job.py")
TUTTI_RUN = os.path.join(ROOT, "scripts", "tutti-run")
MODES = ("none", "restart", "inprocess")
KINDS = ("notice", "kill", "host", "link")


# ---- the trace ---------------------------------------------------------------------------
def parse_events(spec, seed, horizon, warning, kinds=("notice", "kill")):
    """'notice@20:30,kill@45' or 'random[:P]' -> sorted [{kind, at, warning}]."""
    if not spec or spec == "none":
        return []
    if spec.startswith("random"):
        period = float(spec.split(":", 1)[1]) if ":" in spec else 60.0
        rng = random.Random(seed)
        out = []
        for k in range(int(horizon // period)):
            out.append({"kind": rng.choice(kinds),
                        "at": round(period * (k + rng.uniform(0.2, 0.8)), 1),
                        "warning": rng.choice((30.0, 120.0))})
        return out
    out = []
    for item in spec.split(","):
        kind, _, when = item.strip().partition("@")
        if kind not in KINDS or not when:
            sys.exit(f"--events: '{item}': use KIND@SECONDS with KIND in {KINDS}")
        at, _, arg = when.partition(":")
        e = {"kind": kind, "at": float(at), "warning": float(arg) if arg else warning}
        if kind == "link":
            e = {"kind": kind, "at": float(at), "down_s": float(arg) if arg else 60.0}
        out.append(e)
    return sorted(out, key=lambda e: e["at"])


# ---- the launcher's MPI ------------------------------------------------------------------
def ulfm_status(mpirun):
    """None when `mpirun`'s Open MPI has ULFM, else why not."""
    path = shutil.which(mpirun)
    if not path:
        return f"{mpirun} not found"
    info = os.path.join(os.path.dirname(os.path.realpath(path)), "ompi_info")
    if not os.path.exists(info):
        info = os.path.join(os.path.dirname(path), "ompi_info")
    if not os.path.exists(info):
        return f"no ompi_info beside {path} (not Open MPI?)"
    try:
        text = subprocess.run([info], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{info}: {e}"
    version = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                    if ln.strip().startswith("Open MPI:")), "?")
    ft = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
               if ln.strip().startswith("FT MPI support:")), None)
    if ft is None or not ft.startswith("yes"):
        return (f"{path} is Open MPI {version} without ULFM (ompi_info: FT MPI support: "
                f"{ft or 'not listed'}); give --ft-mpirun an Open MPI 5 mpiexec")
    return None


# ---- one mode ----------------------------------------------------------------------------
class Log:
    """Rank 0's log.jsonl, read as it grows (a line cut by a kill is skipped)."""

    def __init__(self, path):
        self.path, self.pos, self.records, self.partial = path, 0, [], ""

    def poll(self):
        try:
            with open(self.path) as f:
                f.seek(self.pos)
                data = f.read()
                self.pos = f.tell()
        except FileNotFoundError:
            return
        data = self.partial + data
        lines = data.split("\n")
        self.partial = lines.pop()
        for ln in lines:
            try:
                self.records.append(json.loads(ln))
            except ValueError:
                pass

    def current_job(self):
        """(restart, entry) of the newest start record, and whether that job
        has committed a step."""
        for i in range(len(self.records) - 1, -1, -1):
            if self.records[i]["ev"] == "start":
                job = (self.records[i]["restart"], self.records[i]["entry"])
                return job, any(r["ev"] in ("commit", "stop") for r in self.records[i + 1:])
        return None, False


def job_of(r):
    return (r["restart"], r["entry"])


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def ranks_of(out, job):
    """The live ranks of job (restart, entry): [{pid, rank, host, ...}] by rank."""
    d = os.path.join(out, "pids")
    found = []
    for name in os.listdir(d) if os.path.isdir(d) else []:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            with open(os.path.join(d, name)) as f:
                info = json.load(f)
        except (OSError, ValueError):
            continue
        if (info["restart"], info["entry"]) == job and alive(info["pid"]):
            found.append(info)
    return sorted(found, key=lambda i: i["rank"])


def set_link(host, state):
    """The rig's link of namespace `host`: its veth on the bridge side."""
    subprocess.run(["ip", "link", "set", f"{host}h", state], check=True)


def stop(proc, out):
    """Ends a mode that hangs: tutti-run's session (mpirun gets SIGTERM from
    the kernel when tutti-run dies), then any rank still alive."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(3)
    d = os.path.join(out, "pids")
    for name in os.listdir(d) if os.path.isdir(d) else []:
        pid = name.split(".")[0]
        if pid.isdigit() and alive(int(pid)):
            os.kill(int(pid), signal.SIGKILL)


def rig_args(prefix, per_host):
    """The mpiexec options and namespaces of netns rig `prefix`."""
    script = os.path.join(ROOT, "scripts", "netns_cluster.sh")
    p = subprocess.run([script, "mpiargs", "--prefix", prefix, "--per-host", str(per_host)],
                       capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"--hosts {prefix}: {p.stderr.strip()}")
    args = p.stdout.split("\n")[:-1]
    i = args.index("--host")
    hosts = args[i + 1].split(",")
    state = os.path.join(os.environ.get("TUTTI_NETNS_STATE", "/run/tutti-netns"),
                         f"{prefix}.hosts")
    with open(state) as f:
        ips = dict(reversed(line.split()) for line in f if line.strip())   # ns -> ip
    return {"args": args, "slots": len(hosts) * per_host, "prefix": prefix,
            "per_host": per_host, "ips": ips, "args_without_hosts": args[:i] + args[i + 2:]}


def write_hostfile(path, rig, absent):
    """The elastic hostfile: every rig host not in `absent`."""
    with open(path + ".tmp", "w") as f:
        for ns, ip in sorted(rig["ips"].items()):
            if ns not in absent:
                f.write(f"{ip} slots={rig['per_host']}\n")
    os.replace(path + ".tmp", path)


def run_mode(mode, a, trace, work, mpirun, python, pythonpath, extra_mpi, rig=None):
    out = os.path.join(work, mode)
    os.makedirs(out)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "SPOT_"))}
    for k in ("TUTTI_CKPT_DIR", "TUTTI_JOB_ID", "TUTTI_RESTART_COUNT", "TUTTI_ELASTIC_DIR"):
        env.pop(k, None)
    env.update(SPOT_OUT=out, SPOT_STEP_S=str(a.step_s), SPOT_PARAMS=str(a.params),
               SPOT_STEPS=str(a.steps or 0), TUTTI_PREEMPT_SOURCES="signals",
               TUTTI_TIMEOUT=str(a.comm_timeout),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    if a.ckpt_dir:
        env["TUTTI_CKPT_DIR"] = os.path.join(a.ckpt_dir, mode)
    events = [dict(e) for e in trace] if mode != "none" else []
    # tutti-run turns fault tolerance on by itself on Open MPI 5 (--ulfm
    # auto): the other modes keep the restart path.
    cmd = [python, TUTTI_RUN, "--mpirun", mpirun, "--backoff", str(a.backoff),
           "--max-restarts", str(len(events) + 2),
           "--ulfm", "on" if mode == "inprocess" else "off"]
    absent, hostfile = set(), os.path.join(out, "hostfile")
    if a.elastic:
        # Elastic tutti-run chooses the hosts and the size from the hostfile,
        # which loses a host on a notice, a lost host or a cut link, and gets
        # it back --elastic seconds later.
        write_hostfile(hostfile, rig, absent)
        cmd += ["--min-np", "1", "--max-np", str(rig["slots"]), "--hostfile", hostfile,
                "--discovery-interval", "2", "--grow-interval", "10", "--exit-grace", "5",
                "--"] + extra_mpi + rig["args_without_hosts"] + ["--oversubscribe",
                                                                 "--bind-to", "none"]
    else:
        cmd += ["--"] + extra_mpi + (rig["args"] if rig else []) + [
            "--oversubscribe", "--bind-to", "none", "-np", str(a.np)]
    for k in ("PYTHONPATH", "SPOT_OUT", "SPOT_STEP_S", "SPOT_PARAMS", "SPOT_STEPS",
              "SPOT_DEADLINE"):
        cmd += ["-x", k]
    cmd += [python, JOB]
    start = time.time()
    env["SPOT_DEADLINE"] = str(start + a.duration) if a.duration else "0"
    logf = open(os.path.join(out, "tutti-run.log"), "w")
    proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log = Log(os.path.join(out, "log.jsonl"))
    limit = (a.duration or a.steps * a.step_s * 3) + a.mode_timeout
    pending, hard_kills = list(events), []
    ended_by, progress, seen = None, start, 0
    while proc.poll() is None:
        time.sleep(0.05)
        now = time.time()
        log.poll()
        if len(log.records) > seen:
            seen, progress = len(log.records), now
        if now - start > limit or now - progress > a.stall_timeout:
            ended_by = (f"no log record for {a.stall_timeout:.0f} s" if now - start <= limit
                        else f"still running {limit:.0f} s after its start")
            stop(proc, out)
            break
        for hk in list(hard_kills):
            if now >= hk["at"]:
                hard_kills.remove(hk)
                if "link" in hk:
                    set_link(hk["link"], "up")
                    continue
                if "return" in hk:
                    absent.discard(hk["return"])
                    write_hostfile(hostfile, rig, absent)
                    continue
                left = [p for p in hk["pids"] if alive(p)]
                for p in left:
                    os.kill(p, signal.SIGKILL)
                hk["event"]["hard_killed"] = len(left)
        if not pending or now - start < pending[0]["at"]:
            continue
        job, training = log.current_job()
        ranks = ranks_of(out, job) if training else []
        if not ranks:
            continue
        e = pending.pop(0)
        rng = random.Random(f"{a.seed}-{e['at']}-{e['kind']}")
        done = [r["step"] for r in log.records if r["ev"] == "done" and job_of(r) == job]
        commits = [r["step"] for r in log.records if r["ev"] == "commit" and job_of(r) == job]
        e.update(job=list(job), fired=now, deferred_s=round(now - start - e["at"], 2),
                 done_before=max(done, default=None), committed_before=max(commits, default=None))
        if e["kind"] == "kill":
            victim = rng.choice(ranks)
            e["ranks"] = [victim["rank"]]
            os.kill(victim["pid"], signal.SIGKILL)
        else:
            host = rng.choice(sorted({r["host"] for r in ranks}))
            victims = [r for r in ranks if r["host"] == host]
            e["host"], e["ranks"] = host, [r["rank"] for r in victims]
            if a.elastic:
                # A cut host returns once its link is back: on the rig, tutti-run's
                # probe (`ip netns exec`) answers whether or not the link is up.
                absent.add(host)
                write_hostfile(hostfile, rig, absent)
                back = max(a.elastic, e["down_s"] + 1) if e["kind"] == "link" else a.elastic
                hard_kills.append({"at": now + back, "return": host})
            if e["kind"] == "link":
                set_link(host, "down")
                hard_kills.append({"at": now + e["down_s"], "link": host})
                continue
            if e["kind"] == "host":
                # Everything in the host's network namespace (its name is the
                # ranks' host name on the rig).
                pids = subprocess.run(["ip", "netns", "pids", host], capture_output=True,
                                      text=True).stdout.split()
                e["processes"] = len(pids)
                for p in pids:
                    try:
                        os.kill(int(p), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for r in victims:
                os.kill(r["pid"], signal.SIGUSR1 if e["kind"] == "notice" else signal.SIGKILL)
            if e["kind"] == "notice":
                e["hard_killed"] = 0
                hard_kills.append({"at": now + e["warning"], "pids": [r["pid"] for r in victims],
                                   "event": e})
    end = time.time()
    for hk in hard_kills:
        if "link" in hk:
            set_link(hk["link"], "up")
    logf.close()
    log.poll()
    with open(os.path.join(out, "tutti-run.log")) as f:
        tail = f.read()[-3000:]
    pids = []
    for name in sorted(os.listdir(os.path.join(out, "pids"))) if os.path.isdir(
            os.path.join(out, "pids")) else []:
        if name.endswith(".json") and not name.startswith("."):
            with open(os.path.join(out, "pids", name)) as f:
                pids.append(json.load(f))
    return {"mode": mode, "start": start, "end": end, "status": proc.returncode, "ranks": pids,
            "killed_by_bench": ended_by,
            "records": log.records, "events": events, "unfired": len(pending),
            "log_tail": tail, "command": cmd}


# ---- analysis ----------------------------------------------------------------------------
def step_time(records):
    """Median interval between consecutive completed steps of one job."""
    gaps, prev = [], None
    for r in records:
        if r["ev"] != "done":
            continue
        if prev is not None and job_of(prev) == job_of(r) and r["step"] == prev["step"] + 1:
            gaps.append(r["t"] - prev["t"])
        prev = r
    return statistics.median(gaps) if gaps else None


def analyse(res, t_ff):
    recs = res["records"]
    done = [r for r in recs if r["ev"] == "done"]
    commits = [r for r in recs if r["ev"] in ("commit", "stop")]
    final = max((r["step"] for r in commits), default=0)
    ended = any(r["ev"] == "end" for r in recs)
    wall = res["end"] - res["start"]
    starts = [r for r in recs if r["ev"] == "start"]
    res.update(wall=wall, final_step=final, completed=ended and res["status"] == 0,
               steps_done=len(done), recomputed=len(done) - len({r["step"] for r in done}),
               restarts=len({r["restart"] for r in starts}) - 1 if starts else 0,
               inprocess_recoveries=sum(1 for r in starts if r["entry"] > 1),
               first_step_s=(done[0]["t"] - res["start"]) if done else None,
               t_ff=t_ff, goodput=final * t_ff / wall if t_ff and wall > 0 else None)
    for e in res["events"]:
        if "fired" not in e:
            continue
        job = tuple(e["job"])
        nxt = next((r for r in done if r["t"] > e["fired"] and job_of(r) != job), None)
        new_start = next((r for r in starts if r["t"] > e["fired"] and job_of(r) != job), None)
        old_done = [r["step"] for r in done if job_of(r) == job]
        e["next_step_s"] = nxt["t"] - e["fired"] if nxt else None
        e["resumed_s"] = new_start["t"] - e["fired"] if new_start else None
        procs = [p["process_t"] for p in res["ranks"]
                 if new_start and p["restart"] == new_start["restart"] and p["restart"] > job[0]]
        e["new_processes_s"] = min(procs) - e["fired"] if procs else None
        e["resumed_from"] = new_start["step"] if new_start else None
        e["recovered"] = (None if new_start is None else
                          "in-process" if new_start["restart"] == job[0] else "restart")
        e["recomputed"] = (max(old_done, default=0) - new_start["step"]
                           if new_start else None)
        if e["kind"] == "notice":
            stop = [r for r in commits if job_of(r) == job and r["t"] >= e["fired"]]
            e["notice_to_commit_s"] = stop[0]["t"] - e["fired"] if stop else None
        e["_start"] = new_start
    # Restarts that no event caused (elastic tutti-run growing the job when a
    # host returns): from the old job's last record to the new job's first step.
    caused = [id(e.pop("_start")) for e in res["events"] if "_start" in e]
    res["other_restarts"] = []
    for s in starts[1:]:
        if id(s) in caused:
            continue
        before = [r for r in recs if r["t"] < s["t"] and job_of(r) != job_of(s)]
        first = next((r for r in done if job_of(r) == job_of(s)), None)
        res["other_restarts"].append({
            "at": s["t"] - res["start"], "size": [before[-1]["size"] if before else None,
                                                  s["size"]],
            "resumed_from": s["step"],
            "cost_s": first["t"] - before[-1]["t"] if first and before else None})
    return res


def fmt(v, spec=".2f", none="—"):
    return none if v is None else format(v, spec)


def table(results, unavailable, base):
    lines = ["| mode | wall s | first step s | final step | t_ff s | goodput | vs none "
             "| restarts | in-process recoveries | steps recomputed | events fired |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m in MODES:
        if m in unavailable:
            lines.append(f"| {m} | not available: {unavailable[m]} |" + " |" * 9)
            continue
        if m not in results:
            continue
        r = results[m]
        fired = sum(1 for e in r["events"] if "fired" in e)
        note = "" if r["completed"] else (
            f" (stopped by the bench: {r['killed_by_bench']})" if r["killed_by_bench"]
            else f" (tutti-run exited {r['status']}, unfinished)")
        rel = (r["goodput"] / base if base and r["goodput"] is not None else None)
        lines.append(
            f"| {m}{note} | {r['wall']:.1f} | {fmt(r['first_step_s'], '.1f')} | "
            f"{r['final_step']} | {fmt(r['t_ff'], '.3f')} | {fmt(r['goodput'], '.1%')} | "
            f"{fmt(rel, '.1%')} | {r['restarts']} | {r['inprocess_recoveries']} | "
            f"{r['recomputed']} | {fired}/{len(r['events'])} |")
    lines += ["", "| mode | event | at s (waited) | ranks | recovered by | failure -> next "
              "completed step s | of which: new processes s | commit loaded s "
              "| notice -> stop commit s | resumed from | steps recomputed |",
              "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for m in MODES:
        for e in results.get(m, {}).get("events", []):
            if "fired" not in e:
                lines.append(f"| {m} | {e['kind']} | {e['at']:.0f} | not fired (run ended) "
                             "| | | | | | | |")
                continue
            kind = e["kind"] + (f" ({e['warning']:.0f} s warning"
                                + (", hard-killed" if e.get("hard_killed") else "") + ")"
                                if e["kind"] == "notice" else
                                f" ({e['down_s']:.0f} s down)" if e["kind"] == "link" else "")
            lines.append(
                f"| {m} | {kind} | {e['at']:.0f} ({e['deferred_s']:.1f}) | "
                f"{','.join(map(str, e['ranks']))} | {e['recovered'] or '—'} | "
                f"{fmt(e['next_step_s'])} | {fmt(e['new_processes_s'])} | "
                f"{fmt(e['resumed_s'])} | {fmt(e.get('notice_to_commit_s'))} | "
                f"{fmt(e['resumed_from'], 'd')} | {fmt(e['recomputed'], 'd')} |")
        for o in results.get(m, {}).get("other_restarts", []):
            lines.append(
                f"| {m} | restart without an event (size {o['size'][0]} -> {o['size'][1]}: "
                f"last record -> next completed step) | {o['at']:.0f} | | restart | "
                f"{fmt(o['cost_s'])} | | | | {o['resumed_from']} | |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 1)[1])
    ap.add_argument("--duration", type=float, default=0,
                    help="seconds per mode: the job stops at the first step after it")
    ap.add_argument("--steps", type=int, default=0, help="instead: stop after this step")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--events", default="random:60",
                    help="'notice@20:30,kill@45,...' or 'random[:PERIOD]' (default random:60)")
    ap.add_argument("--warning", type=float, default=30, help="a notice's default warning, s")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--np", type=int, default=None,
                    help="ranks (default 2; on the rig hosts x S)")
    ap.add_argument("--hosts", default=None, metavar="PREFIX[:S]",
                    help="run on the netns rig PREFIX (scripts/netns_cluster.sh up N "
                    "--prefix PREFIX, made beforehand), S ranks per host (1); needs --ckpt-dir")
    ap.add_argument("--elastic", type=float, default=0, metavar="S",
                    help="on the rig: elastic tutti-run over a hostfile; a host that gets a "
                    "notice, is lost or has its link cut leaves the hostfile for S s (a cut "
                    "one at least until its link is back)")
    ap.add_argument("--ckpt-dir", default=None,
                    help="commit to DIR/<mode> (TUTTI_CKPT_DIR) instead of the memory tier: "
                    "needed on several hosts (the memory tier is one host's for now)")
    ap.add_argument("--step-s", type=float, default=0.5, help="a step's time before its "
                    "all-reduce (compute + sleep)")
    ap.add_argument("--params", type=int, default=1 << 20, help="float32 model parameters")
    ap.add_argument("--backoff", type=float, default=1, help="tutti-run --backoff "
                    "(its default: 1 s)")
    ap.add_argument("--comm-timeout", type=float, default=30, help="TUTTI_TIMEOUT of the ranks")
    ap.add_argument("--mode-timeout", type=float, default=300,
                    help="a mode is killed this long after its duration")
    ap.add_argument("--stall-timeout", type=float, default=120,
                    help="a mode is killed when its job logs nothing for this long")
    ap.add_argument("--mpirun", default=os.environ.get("TUTTI_MPIEXEC", "mpiexec"))
    ap.add_argument("--python", default=sys.executable, help="python of tutti-run and ranks")
    ap.add_argument("--pythonpath", default=None,
                    help="PYTHONPATH of the ranks (default: build/python_pkg if built, "
                    "else the caller's)")
    ap.add_argument("--ft-mpirun", default=None, help="inprocess mode's mpiexec "
                    "(Open MPI 5 with ULFM; default --mpirun)")
    ap.add_argument("--ft-python", default=None, help="inprocess mode's python (default --python)")
    ap.add_argument("--ft-pythonpath", default=None,
                    help="inprocess mode's PYTHONPATH (default --pythonpath)")
    ap.add_argument("--work", default=None, help="directory for the runs' files (default: a "
                    "new temporary one, kept)")
    ap.add_argument("--out", default=None, help="JSON of everything")
    a = ap.parse_args()
    if bool(a.duration) == bool(a.steps):
        ap.error("give one of --duration and --steps")
    rig = None
    if a.elastic and not a.hosts:
        ap.error("--elastic needs --hosts")
    if a.hosts:
        if not a.ckpt_dir:
            ap.error("--hosts needs --ckpt-dir: the memory tier keeps commits on one host")
        prefix, _, per = a.hosts.partition(":")
        rig = rig_args(prefix, int(per or 1))
        a.np = a.np or rig["slots"]
    a.np = a.np or 2
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"--modes: unknown {bad}; choose from {MODES}")
    horizon = a.duration or a.steps * a.step_s
    trace = parse_events(a.events, a.seed, horizon, a.warning,
                         ("notice", "kill", "host") if rig else ("notice", "kill"))
    if rig is None and any(e["kind"] in ("host", "link") for e in trace):
        ap.error("host@T and link@T need several hosts (--hosts)")
    pythonpath = a.pythonpath
    if pythonpath is None:
        built = os.path.join(ROOT, "build", "python_pkg")
        pythonpath = built if os.path.isdir(built) else os.environ.get("PYTHONPATH", "")
    work = a.work or tempfile.mkdtemp(prefix="tutti-spot-")
    os.makedirs(work, exist_ok=True)
    unavailable, results = {}, {}
    for m in modes:
        mpirun, python, pp, extra = a.mpirun, a.python, pythonpath, []
        if m == "inprocess":
            mpirun = a.ft_mpirun or a.mpirun
            python = a.ft_python or a.python
            pp = a.ft_pythonpath or pythonpath
            why = ulfm_status(mpirun)
            if why:
                unavailable[m] = why
                continue
            extra = ["--with-ft", "ulfm"]
        print(f"[spot_trace] mode {m}: running ({a.duration or a.steps} "
              f"{'s' if a.duration else 'steps'}, {len(trace) if m != 'none' else 0} events)",
              file=sys.stderr, flush=True)
        results[m] = run_mode(m, a, trace, work, mpirun, python, pp, extra, rig)
    base_tff = step_time(results["none"]["records"]) if "none" in results else None
    for m, r in results.items():
        analyse(r, base_tff or step_time(r["records"]))
    base = results["none"]["goodput"] if "none" in results else None
    text = table(results, unavailable, base)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "trace": trace, "work": work, "unavailable": unavailable,
                       "results": results, "table": text,
                       "load_average": os.getloadavg(), "cpus": os.cpu_count()}, f, indent=1)
    print(f"\n[spot_trace] files in {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
