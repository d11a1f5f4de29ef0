"""tutti-run's elastic mode and restart rules with real processes: fake
hosts (UTS namespaces behind fake_agent.sh), a discovery script whose output
the test rewrites, and tiny_train (tests/checkpoint) or small shell jobs.

usage: elastic_test.py TINY_TRAIN TUTTI_RUN MPIEXEC CASE
CASE: shrink | grow | wait | unreachable | budget | spawn-signal | sigkill |
      return | vanish | np-multiple
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "preemption"))
from fake_hosts import host_processes  # noqa: E402
from jobs import Job, descendants, fail, finish  # noqa: E402

TRAIN, TUTTI_RUN, MPIEXEC, CASE = sys.argv[1:5]
AGENT = os.path.join(HERE, "fake_agent.sh")
# Ranks started through the agent live at least 0.5 s (`sh -c "...; sleep
# 0.5"`, not `true`): Open MPI 5.0's PRRTE daemon on another host can miss
# the exit of a rank that ends within milliseconds of its start, and mpirun
# then waits for it forever (seen in about 1 run in 10 with `true`; never in
# 10 with a rank that lives 0.2 s).
MPI_OPTS = ["--mca", "plm_rsh_agent", AGENT, "--mca", "plm_rsh_no_tree_spawn", "1",
            "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,tcp"]


class Rig:
    def __init__(self, tmp):
        self.tmp = tmp
        self.disc_out = os.path.join(tmp, "hosts.txt")
        self.disc = os.path.join(tmp, "discover.sh")
        with open(self.disc, "w") as f:
            f.write(f"#!/bin/sh\ncat {self.disc_out}\n")
        os.chmod(self.disc, 0o755)
        self.ckpt = os.path.join(tmp, "ckpt")
        self.edir = os.path.join(self.ckpt, ".elastic")
        self.triggers = os.path.join(tmp, "triggers")
        self.down = os.path.join(tmp, "down")
        os.makedirs(self.triggers)
        os.makedirs(self.down)

    def hosts(self, text):
        with open(self.disc_out + ".tmp", "w") as f:
            f.write(text)
        os.replace(self.disc_out + ".tmp", self.disc_out)

    def env(self, extra=None):
        e = {"TUTTI_CKPT_DIR": self.ckpt, "ELASTIC_TEST_TRIGGERS": self.triggers,
             "ELASTIC_TEST_DOWN": self.down, "TUTTI_PREEMPT_POLL_MS": "100"}
        e.update(extra or {})
        return e

    def run(self, lo, hi, program, opts=(), env=None, hostfile=False):
        source = ["--hostfile", self.disc_out] if hostfile else \
            ["--host-discovery-script", self.disc]
        cmd = [sys.executable, TUTTI_RUN, "--mpirun", MPIEXEC, "--min-np", str(lo),
               "--max-np", str(hi)] + source + ["--backoff", "0", "--discovery-interval",
                                                "0.3"] + list(opts) + ["--"] + MPI_OPTS + program
        return Job(cmd, env=self.env(env), name="tutti-run")

    def train(self, steps, step_ms=100):
        return [TRAIN, "--dir", self.ckpt, "--steps", str(steps), "--save-every", "5",
                "--step-ms", str(step_ms)]

    def launches(self):
        try:
            with open(os.path.join(self.edir, "launches.jsonl")) as f:
                return [json.loads(line) for line in f]
        except OSError:
            return []

    def starts(self):
        return [(r["np"], r["hosts"], r["reason"]) for r in self.launches()
                if r["event"] == "start"]

    def ends(self):
        return [r["status"] for r in self.launches() if r["event"] == "end"]


def expect_rc(job, rc, what, timeout=120):
    got = job.wait(timeout)
    if got != rc:
        fail(f"{what}: exit status {got}, expected {rc}\n{job.output()[-3000:]}")
    return got == rc


def resize_run(r, job, change, what, starts, steps, from_np):
    """Waits for tiny_train to start, applies change(), and checks that the
    job stopped once with 75, restarted as `starts` says and resumed from
    the stop step saved by from_np ranks.  Returns the output, or None."""
    if not job.wait_for(r"^FRESH", 60):
        fail(f"{what}: the job did not start:\n{job.output()[-3000:]}")
        job.kill()
        return None
    time.sleep(1.0)
    change()
    if not expect_rc(job, 0, what):
        return None
    out = job.output()
    if r.starts() != starts or r.ends() != [75, 0]:
        fail(f"{what}: starts {r.starts()}, ends {r.ends()}\n{out[-3000:]}")
    m = job.wait_for(r"^PREEMPTED (\d+)", 1)
    res = job.wait_for(rf"^RESUMED (\d+) from {from_np} ranks", 1)
    if not m or not res or m.group(1) != res.group(1) or f"DONE {steps}" not in out:
        fail(f"{what}: expected a stop, a resume from that step and DONE:\n{out[-3000:]}")
    return out


def case_shrink(r):
    # hostb's ranks get a notice (their trigger file): they record hostb as
    # leaving, every rank commits and exits 75, and the job comes back on
    # hosta alone from that checkpoint.
    r.hosts("hosta:2\nhostb:2\n")
    out = resize_run(r, r.run(2, 4, r.train(40)),
                     lambda: open(os.path.join(r.triggers, "hostb"), "w").close(), "shrink",
                     [(4, ["hosta:2", "hostb:2"], "start"), (2, ["hosta:2"], "preempted")],
                     40, 4)
    if out is None:
        return
    if "excluding hostb: its ranks received a preemption notice (file" not in out:
        fail(f"shrink: hostb was not excluded as leaving:\n{out[-3000:]}")
    rec_path = os.path.join(r.edir, "leaving", "hostb")
    try:
        rec = json.load(open(rec_path))
        if rec.get("host") != "hostb" or rec.get("source") != "file":
            fail(f"shrink: leaving record {rec}")
    except (OSError, ValueError) as e:
        fail(f"shrink: no readable leaving record {rec_path}: {e}")
    if os.path.exists(os.path.join(r.edir, "leaving", "hosta")):
        fail("shrink: hosta recorded as leaving")
    # A normal exit leaves nothing behind worth a log line.
    if "started by mpirun still running" in out or "of its session" in out:
        fail(f"shrink: a normal exit 75 was logged as leaving processes:\n{out[-3000:]}")
    # The record goes once discovery no longer lists hostb.
    r.hosts("hosta:2\n")
    job = r.run(2, 4, ["sh", "-c", "sleep 0.5"])  # not `true`: see MPI_OPTS
    expect_rc(job, 0, "run after hostb left discovery")
    if os.path.exists(rec_path) or "leaving record for hostb removed (no longer discovered)" \
            not in job.output():
        fail(f"the leaving record outlived hostb's discovery:\n{job.output()[-2000:]}")


def case_grow(r):
    # Discovery adds hostb: tutti-run asks for a save-and-exit (SIGUSR1 via
    # mpirun, which the ranks must not take as their node leaving) and
    # restarts on 4 ranks from the committed step.
    r.hosts("hosta:2\n")
    out = resize_run(r, r.run(2, 4, r.train(50), opts=["--grow-interval", "1"]),
                     lambda: r.hosts("hosta:2\nhostb:2\nhostc:2\n"),  # 6 slots, --max-np 4
                     "grow", [(2, ["hosta:2"], "start"), (4, ["hosta:2", "hostb:2"], "resize")],
                     50, 2)
    if out is None:
        return
    if "job stopped to resize" not in out:
        fail("grow: the resize exit was not reported as one")
    left = os.listdir(os.path.join(r.edir, "leaving"))
    if left:
        fail(f"grow: the forwarded SIGUSR1 recorded {left} as leaving")
    # At --max-np nothing more happens; and grows are spaced by --grow-interval.
    if out.count("asking the job to save and exit") != 1:
        fail(f"grow: expected exactly one resize request:\n{out[-3000:]}")


def case_wait(r):
    # Too few slots: wait, re-discovering, then give up with a clear message.
    r.hosts("hosta:1\n")
    t0 = time.monotonic()
    job = r.run(2, 4, ["true"], opts=["--wait-timeout", "2"])
    expect_rc(job, 1, "too few slots")
    took = time.monotonic() - t0
    out = job.output()
    if "fewer than --min-np 2: waiting up to 2 s" not in out or "gave up: 1 usable slot" not in out:
        fail(f"wait: messages missing:\n{out[-2000:]}")
    if not 1.8 < took < 20:
        fail(f"wait: gave up after {took:.1f}s (--wait-timeout 2)")
    if r.launches():
        fail(f"wait: nothing started, but the journal has {r.launches()}")
    # Capacity that appears while waiting is used: a hostfile (Open MPI's
    # syntax) re-read every --discovery-interval.
    r.hosts("hosta slots=1\n")
    job = r.run(2, 4, ["sh", "-c", "echo SIZE=$OMPI_COMM_WORLD_SIZE; sleep 0.5"],
                opts=["--wait-timeout", "60"], hostfile=True)
    if job.wait_for(r"waiting up to 60 s", 30):
        r.hosts("hosta slots=1\nhostb slots=2 # joined\n")
    if expect_rc(job, 0, "capacity while waiting") and job.output().count("SIZE=3") != 3:
        fail(f"wait: expected 3 ranks once hostb appeared:\n{job.output()[-2000:]}")
    starts = [x for x in r.launches() if x["event"] == "start"]
    if len(starts) != 1 or not 0.2 < starts[0]["waited_s"] < 30:
        fail(f"wait: the start record should carry the time waited: {starts}")
    # A leaving record older than --leaving-ttl no longer excludes its host.
    with open(os.path.join(r.edir, "leaving", "hostb"), "w") as f:
        json.dump({"host": "hostb", "source": "gcp"}, f)
    os.utime(os.path.join(r.edir, "leaving", "hostb"), (time.time() - 5, time.time() - 5))
    job = r.run(3, 4, ["sh", "-c", "sleep 0.5"], opts=["--leaving-ttl", "2", "--wait-timeout", "0"],
                hostfile=True)
    if expect_rc(job, 0, "expired leaving record") and \
            "leaving record for hostb removed (older than 2 s)" not in job.output():
        fail(f"wait: the expired record was not reported:\n{job.output()[-2000:]}")


def case_unreachable(r):
    # Hosts that refuse or hang are probed out (bounded by --probe-timeout).
    r.hosts("badx:2\nhosta:2\nslowy:2\n")
    t0 = time.monotonic()
    job = r.run(2, 6, ["sh", "-c", "echo ON=$(hostname); sleep 0.5"], opts=["--probe-timeout", "1"])
    if expect_rc(job, 0, "unreachable hosts"):
        out = job.output()
        took = time.monotonic() - t0
        if out.count("ON=hosta") != 2 or "ON=bad" in out or "ON=slow" in out:
            fail(f"unreachable: ranks not all on hosta:\n{out[-2000:]}")
        if "excluding badx: unreachable" not in out or \
                "excluding slowy: unreachable (no answer within 1 s)" not in out:
            fail(f"unreachable: exclusions not logged:\n{out[-2000:]}")
        if took > 15:
            fail(f"unreachable: took {took:.1f}s with --probe-timeout 1")
    # A node lost without notice: the job fails, the restart probes again
    # and runs on what is left.
    r.hosts("hosta:2\nhostb:2\n")
    prog = ("if [ $TUTTI_RESTART_COUNT = 0 ] && [ $(hostname) = hostb ]; then "
            f"touch {r.down}/hostb; exit 3; fi; sleep 0.5; echo ON=$(hostname)")
    job = r.run(2, 4, ["sh", "-c", prog])
    if expect_rc(job, 0, "node loss"):
        if r.starts()[-2:] != [(4, ["hosta:2", "hostb:2"], "start"), (2, ["hosta:2"], "failure")]:
            fail(f"node loss: starts {r.starts()}\n{job.output()[-3000:]}")


def case_budget(r):
    def plain(prog, opts):
        return Job([sys.executable, TUTTI_RUN, "--mpirun", MPIEXEC, "--backoff", "0"] + opts +
                   ["--oversubscribe", "-np", "1", "sh", "-c", prog], name="tutti-run")

    latest = os.path.join(r.ckpt, "latest")
    os.makedirs(r.ckpt, exist_ok=True)
    # Every failure advanced the committed step: never out of budget.
    prog = (f"n=$TUTTI_RESTART_COUNT; echo step-0000000$((n + 1)) > {latest}; "
            "echo ATTEMPT; [ $n -ge 4 ] && exit 0; exit 3")
    job = plain(prog, ["--max-restarts", "1", "--ckpt-dir", r.ckpt])
    if expect_rc(job, 0, "failures with progress") and job.output().splitlines().count("ATTEMPT") != 5:
        fail(f"progress: expected 5 attempts:\n{job.output()[-2000:]}")
    # Without progress the same budget runs out after one restart.
    job = plain("echo ATTEMPT; exit 3", ["--max-restarts", "1", "--ckpt-dir", r.ckpt])
    if expect_rc(job, 3, "failures without progress") and job.output().splitlines().count("ATTEMPT") != 2:
        fail(f"no progress: expected 2 attempts:\n{job.output()[-2000:]}")
    # A preemption exit (75) resets the count: fail, 75, fail, 75, fail, done.
    prog = ("n=$TUTTI_RESTART_COUNT; echo ATTEMPT; [ $n -ge 5 ] && exit 0; "
            "[ $((n % 2)) = 1 ] && exit 75; exit 3")
    job = plain(prog, ["--max-restarts", "1"])
    if expect_rc(job, 0, "75 resets the budget") and job.output().splitlines().count("ATTEMPT") != 6:
        fail(f"75 reset: expected 6 attempts:\n{job.output()[-2000:]}")
    # Elastic mode refuses mpirun's own host and size options.
    r.hosts("hosta:2\n")
    for bad in (["-np", "2"], ["-H", "hosta:2"], ["--hostfile", r.disc_out]):
        job = r.run(1, 2, bad + ["true"])
        if job.wait(30) == 0 or "tutti-run passes -np and -H itself" not in job.output():
            fail(f"elastic mode accepted {bad}:\n{job.output()[-1000:]}")
    job = Job([sys.executable, TUTTI_RUN, "--min-np", "1", "--max-np", "2", "--hostfile",
               r.disc_out, "true"], env={"TUTTI_CKPT_DIR": ""}, name="tutti-run")
    if job.wait(30) == 0 or "needs --elastic-dir" not in job.output():
        fail(f"elastic mode without a directory:\n{job.output()[-1000:]}")


def case_spawn_signal(r):
    # SIGTERM to tutti-run while mpirun is being started (the fork/exec held
    # open by a test hook, then mpirun's own start-up, then the ranks') must
    # still reach the ranks: they stop with 75 and nothing restarts.
    # The trap waits 0.3 s before exiting: Open MPI 5's launcher dropped the
    # GOT_USR1 line of a rank that exited at once (exit status 75 seen, line
    # lost; once in a fresh-clone suite).
    prog = "trap 'echo GOT_USR1; sleep 0.3; exit 75' USR1; echo READY; sleep 30 & wait"
    for delay, hook in ((0.3, "1.5"), (0.0, "0"), (0.1, "0"), (0.4, "0")):
        t0 = time.monotonic()
        job = Job([sys.executable, TUTTI_RUN, "--mpirun", MPIEXEC, "--max-restarts", "3",
                   "--oversubscribe", "-np", "2", "sh", "-c", prog],
                  env={"TUTTI_RUN_TEST_SPAWN_DELAY_S": hook}, name="tutti-run")
        if not job.wait_for(r"\[tutti-run\] starting", 30):
            fail("spawn-signal: tutti-run did not start the job")
            job.kill()
            continue
        time.sleep(delay)
        job.proc.send_signal(signal.SIGTERM)
        rc = job.wait(40)
        took = time.monotonic() - t0
        out = job.output()
        what = f"SIGTERM {delay} s after the spawn began (spawn hook {hook} s)"
        if rc != 75 or "GOT_USR1" not in out.splitlines() or "restart 1" in out or took > 25:
            fail(f"{what}: status {rc} after {took:.1f}s:\n{out[-2000:]}")
        elif "still running" in out or "of its session" in out:
            # The ranks finish just after mpirun: nothing worth a log line.
            fail(f"{what}: a normal stop was logged as leaving processes:\n{out[-2000:]}")
        else:
            print(f"{what}: stopped with 75 in {took:.1f}s", flush=True)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def case_sigkill(r):
    # tutti-run killed: the kernel's SIGTERM to mpirun (PDEATHSIG) ends the
    # job.  mpirun killed: MPI ranks die with their PMIx server, but other
    # processes mpirun started (here: sleep) would not; tutti-run kills
    # what is left of mpirun's session.
    train = [TRAIN, "--dir", os.path.join(r.tmp, "kill"), "--steps", "100000",
             "--save-every", "5", "--step-ms", "20"]
    for victim, program, rank_name in (("tutti-run", train, "tiny_train"),
                                        ("mpirun", ["sh", "-c", "echo FRESH; exec sleep 300"],
                                         "sleep")):
        job = Job([sys.executable, TUTTI_RUN, "--mpirun", MPIEXEC, "--max-restarts", "0",
                   "--oversubscribe", "--bind-to", "none", "-np", "2"] + program,
                  name="tutti-run")
        if not job.wait_for(r"^FRESH", 60):
            fail(f"{victim}: the job did not start:\n{job.output()[-2000:]}")
            job.kill()
            continue
        time.sleep(0.3)
        tree = descendants(job.proc.pid)
        argv0 = {p: os.path.basename(open(f"/proc/{p}/cmdline").read().split("\0")[0])
                 for p in tree}
        ranks = [p for p in tree if argv0[p] == rank_name]
        # Open MPI 5's mpiexec execs its launcher, prterun, in the same process.
        mpirun = [p for p in tree if argv0[p] in (os.path.basename(MPIEXEC), "prterun")]
        if len(ranks) != 2 or len(mpirun) != 1:
            fail(f"{victim}: expected 2 ranks and one mpirun below tutti-run, got "
                 f"{ranks} {mpirun}")
            job.kill()
            continue
        os.kill(job.proc.pid if victim == "tutti-run" else mpirun[0], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while any(alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = [p for p in tree if alive(p)]
        if survivors:
            fail(f"SIGKILL of {victim}: {survivors} still running 20 s later")
            for p in survivors:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        else:
            print(f"SIGKILL of {victim}: mpirun and both ranks gone", flush=True)
        if victim == "mpirun" and not job.wait_for(
                r"2 process\(es\) started by mpirun still running .*\(sleep\): killed them", 10):
            fail(f"SIGKILL of mpirun: the killed leftovers were not logged:\n"
                 f"{job.output()[-2000:]}")
        job.wait(30)


def case_return(r):
    # hostb is down at the start (its probe fails) and comes back while the
    # job runs: the grow follows within a few discoveries, not after a fixed
    # 30 s.  slowz never answers (each probe hangs --probe-timeout): the
    # probes run in the background and must not hold up the loop.
    r.hosts("hosta:2\nslowz:2\nhostb:2\n")
    open(os.path.join(r.down, "hostb"), "w").close()
    job = r.run(2, 4, r.train(150), opts=["--grow-interval", "1", "--probe-timeout", "3"])
    if not job.wait_for(r"^FRESH", 60):
        fail(f"return: the job did not start:\n{job.output()[-3000:]}")
        job.kill()
        return
    time.sleep(1.0)
    os.unlink(os.path.join(r.down, "hostb"))
    t0 = time.monotonic()
    took = time.monotonic() - t0
    if not job.wait_for(r"asking the job to save and exit", 30):
        fail(f"return: no grow within 30 s of hostb's return:\n{job.output()[-3000:]}")
    elif (took := time.monotonic() - t0) > 5:  # --discovery-interval 0.3: a few discoveries, whatever slowz does
        fail(f"return: the grow came {took:.1f} s after hostb answered again "
             f"(--discovery-interval 0.3)")
    else:
        print(f"return: grow requested {took:.1f} s after hostb came back", flush=True)
    if not expect_rc(job, 0, "return"):
        return
    out = job.output()
    if r.starts() != [(2, ["hosta:2"], "start"), (4, ["hosta:2", "hostb:2"], "resize")] or \
            r.ends() != [75, 0] or "hostb answers a probe again" not in out or \
            out.count("excluding slowz: unreachable") != 1:
        fail(f"return: starts {r.starts()}, ends {r.ends()}\n{out[-3000:]}")


def case_vanish(r):
    # hostb stops answering without closing anything (its daemon and ranks
    # SIGSTOPped, its probe failing): hosta's ranks time out (TUTTI_TIMEOUT)
    # and exit 76 leaving records in exited/, mpirun waits for hostb's
    # daemon forever, and tutti-run ends it after --exit-grace and restarts
    # on hosta from the last checkpoint.
    # First: a record left late by a rank of an earlier job (attempt 5) does
    # not end this one (attempt 0), even with --exit-grace 0.
    r.hosts("hosta:1\n")
    job = r.run(1, 1, ["sh", "-c", "sleep 2; echo DONE-OK"], opts=["--exit-grace", "0"])
    if job.wait_for(r"\[tutti-run\] starting", 30):
        os.makedirs(os.path.join(r.edir, "exited"), exist_ok=True)
        with open(os.path.join(r.edir, "exited", "hostz-1"), "w") as f:
            json.dump({"host": "hostz", "pid": 1, "status": 76, "attempt": 5}, f)
    if expect_rc(job, 0, "a stale exit record") and ("DONE-OK" not in job.output() or
                                                     "ended with status" in job.output()):
        fail(f"vanish: a stale exit record ended the job:\n{job.output()[-2000:]}")
    os.unlink(os.path.join(r.edir, "launches.jsonl"))
    r.hosts("hosta:2\nhostb:2\n")
    job = r.run(2, 4, r.train(200, step_ms=50), opts=["--exit-grace", "3"],
                env={"TUTTI_TIMEOUT": "3"})
    if not job.wait_for(r"^FRESH", 60):
        fail(f"vanish: the job did not start:\n{job.output()[-3000:]}")
        job.kill()
        return
    # The restart must resume from a 4-rank checkpoint: stop hostb only once
    # one is committed (a fixed sleep was too short on a loaded CI machine,
    # and the restart then rightly started FRESH).
    latest = os.path.join(r.ckpt, "latest")
    deadline = time.monotonic() + 60
    while not os.path.exists(latest) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not os.path.exists(latest):
        fail(f"vanish: no checkpoint committed within 60 s:\n{job.output()[-3000:]}")
        job.kill()
        return
    time.sleep(0.3)
    open(os.path.join(r.down, "hostb"), "w").close()
    victims = host_processes("hostb", r.triggers)
    for p in victims:
        os.kill(p, signal.SIGSTOP)
    t0 = time.monotonic()
    if len(victims) < 3:  # orted, 2 ranks
        fail(f"vanish: found only {victims} on hostb")
    ok = expect_rc(job, 0, "vanish", timeout=90)
    for p in victims:  # the "host" is gone: tutti-run cannot reach these
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if not ok:
        return
    out = job.output()
    if r.starts() != [(4, ["hosta:2", "hostb:2"], "start"), (2, ["hosta:2"], "failure")] or \
            r.ends() != [76, 0]:
        fail(f"vanish: starts {r.starts()}, ends {r.ends()}\n{out[-3000:]}")
    if "rank(s) on hosta ended with status 76" not in out or \
            "after a rank ended on a communication failure" not in out:
        fail(f"vanish: the forced end was not logged:\n{out[-3000:]}")
    if not job.wait_for(r"^RESUMED \d+ from 4 ranks", 1) or "DONE 200" not in out:
        fail(f"vanish: expected a resume from the 4-rank checkpoint and DONE:\n{out[-3000:]}")
    print(f"vanish: done {time.monotonic() - t0:.1f} s after hostb stopped", flush=True)


def case_np_multiple(r):
    # 3 usable slots, sizes must be even: 2 ranks, not 3.
    r.hosts("hosta:2\nhostb:1\n")
    prog = ["sh", "-c", "echo SIZE=$OMPI_COMM_WORLD_SIZE; sleep 0.5"]
    job = r.run(1, 4, prog, opts=["--np-multiple-of", "2"])
    if expect_rc(job, 0, "np-multiple") and (job.output().count("SIZE=2") != 2 or
                                              r.starts() != [(2, ["hosta:2"], "start")]):
        fail(f"np-multiple: expected 2 ranks on hosta:\n{job.output()[-2000:]}")
    # 1 usable slot: no even size >= 1 fits; wait, then give up.
    r.hosts("hosta:1\n")
    job = r.run(1, 4, prog, opts=["--np-multiple-of", "2", "--wait-timeout", "1"])
    if expect_rc(job, 1, "np-multiple, too few") and \
            "no size in [--min-np 1, 1] is a multiple of --np-multiple-of 2" not in job.output():
        fail(f"np-multiple: the wait was not explained:\n{job.output()[-2000:]}")
    # No multiple between --min-np and --max-np: refused at once.
    job = r.run(3, 3, prog, opts=["--np-multiple-of", "2"])
    if job.wait(30) == 0 or "no multiple of 2 between --min-np 3 and --max-np 3" \
            not in job.output():
        fail(f"np-multiple: an impossible range was accepted:\n{job.output()[-1000:]}")


if CASE in ("shrink", "grow", "wait", "unreachable", "return", "vanish", "np-multiple"):
    probe = subprocess.run(["unshare", "--uts", "true"], capture_output=True)
    if probe.returncode != 0:
        print("SKIP: fake hosts need 'unshare --uts' (root)")
        sys.exit(77)
tmp = tempfile.mkdtemp(prefix="tutti-elastic-test-")
try:
    {"shrink": case_shrink, "grow": case_grow, "wait": case_wait,
     "unreachable": case_unreachable, "budget": case_budget,
     "spawn-signal": case_spawn_signal, "sigkill": case_sigkill, "return": case_return,
     "vanish": case_vanish, "np-multiple": case_np_multiple}[CASE](Rig(tmp))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
finish(f"elastic case '{CASE}'")
