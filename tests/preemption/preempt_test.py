"""Preemption notices end a running job cleanly: every rank stops at the same
step boundary, the checkpoint of that step is committed, and the job exits
with 75 (tutti::kPreemptedExitCode).

usage: preempt_test.py TINY_TRAIN TUTTI_RUN MPIEXEC PYTHON NP CASE
CASE: sigterm-tutti-run | sigusr1-mpirun | aws | aws-rebalance | gcp | azure | file
      | aws-rebalance-continues (a rebalance recommendation alone does not stop
        the job unless TUTTI_PREEMPT_STOP_ON_REBALANCE=1)
"""
import os
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jobs import Job, MockServer, fail, finish  # noqa: E402

TRAIN, TUTTI_RUN, MPIEXEC, PYTHON, NP, CASE = sys.argv[1:7]
NP = int(NP)
MPI = [MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", str(NP)]


def train_args(d):
    # Long enough never to finish by itself; slow enough to notice steps.
    return [TRAIN, "--dir", d, "--steps", "1000000", "--save-every", "40", "--step-ms", "20",
            "--zero", "--compress"]


def check_stopped(job, d, t_notice, rc):
    """The job exited 75 right after the notice, with a committed checkpoint
    of the step it stopped at, loadable by a fresh run."""
    took = time.monotonic() - t_notice
    m = job.wait_for(r"^PREEMPTED (\d+).*", 1)
    if rc != 75:
        fail(f"{CASE}: exit status {rc}, expected 75\n{job.output()[-3000:]}")
    if not m:
        fail(f"{CASE}: no PREEMPTED line\n{job.output()[-3000:]}")
        return
    step = int(m.group(1))
    latest = open(os.path.join(d, "latest")).read().strip()
    print(f"{CASE}: {m.group(0)}, {took:.2f}s after the notice; latest={latest}",
          flush=True)
    if latest != "step-%08d" % step:
        fail(f"{CASE}: latest is {latest}, expected the stop step {step}")
    if took > 15:
        fail(f"{CASE}: took {took:.1f}s from notice to exit")
    # A fresh job resumes exactly there (every shard present and verified).
    again = Job(MPI + [TRAIN, "--dir", d, "--steps", str(step), "--zero", "--compress"],
                env={"TUTTI_PREEMPT_SOURCES": "signals"}, name="resume")
    if again.wait(120) != 0 or not again.wait_for(rf"^RESUMED {step} from {NP} ranks", 1):
        fail(f"{CASE}: a fresh run did not resume from step {step}:\n{again.output()[-2000:]}")


def wait_until(cond, timeout):
    """Polls cond() until it is true (True) or timeout seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def committed_step(d):
    """The step `latest` names, -1 before the first commit."""
    try:
        return int(open(os.path.join(d, "latest")).read().strip().split("-")[1].split(".")[0])
    except (OSError, IndexError, ValueError):
        return -1


def polled(server):
    """The source sent the mock endpoint a metadata GET (not only a token
    PUT); its answer (404: no notice yet, or azure's foreign event) is read."""
    return any(r["method"] == "GET" for r in server.requests())


def run_case(tmp):
    d = os.path.join(tmp, "ckpt")
    env = {"TUTTI_PREEMPT_POLL_MS": "50", "TUTTI_HTTP_TIMEOUT_MS": "1000"}
    server = None
    try:
        if CASE == "sigterm-tutti-run":
            job = Job([sys.executable, TUTTI_RUN, "--max-restarts", "3", "--mpirun", MPIEXEC]
                      + MPI[1:] + train_args(d),
                      env=env, name="tutti-run")
        elif CASE == "file":
            trigger = os.path.join(tmp, "preempt-now")
            open(trigger, "w").close()  # a leftover: must not count
            env.update(TUTTI_PREEMPT_SOURCES="signals,file", TUTTI_PREEMPT_FILE=trigger)
            job = Job(MPI + train_args(d), env=env)
        elif CASE in ("aws", "aws-rebalance", "aws-rebalance-continues", "gcp", "azure"):
            cloud = CASE.split("-")[0]
            server = MockServer(PYTHON, cloud, tmp, rebalance="rebalance" in CASE)
            # The cloud source alone proves it triggers; the rebalance case
            # also needs the signals, to end the job afterwards.
            env["TUTTI_PREEMPT_SOURCES"] = ("signals," if "continues" in CASE else "") + cloud
            env[f"TUTTI_{cloud.upper()}_METADATA_URL"] = server.url
            if CASE == "aws-rebalance":
                env["TUTTI_PREEMPT_STOP_ON_REBALANCE"] = "1"
            job = Job(MPI + train_args(d), env=env)
        else:
            job = Job(MPI + train_args(d), env=env)
        try:
            if not job.wait_for(r"^(FRESH|RESUMED)", 60):
                fail(f"{CASE}: the job did not start:\n{job.output()[-3000:]}")
                return
            # Events, not sleeps: some steps ran (a checkpoint is committed)
            # and each cloud source has polled its endpoint (for azure: seen
            # the foreign event it must ignore) before the notice.
            if not wait_until(lambda: os.path.exists(os.path.join(d, "latest")), 60):
                fail(f"{CASE}: no checkpoint committed before the notice:\n"
                     f"{job.output()[-3000:]}")
                return
            if server and not wait_until(lambda: polled(server), 60):
                fail(f"{CASE}: the {CASE.split('-')[0]} source never polled its endpoint")
                return
            if job.proc.poll() is not None:
                fail(f"{CASE}: the job ended before the notice:\n{job.output()[-3000:]}")
                return
            t_notice = time.monotonic()
            if CASE == "sigterm-tutti-run":
                job.proc.send_signal(signal.SIGTERM)
            elif CASE == "sigusr1-mpirun":
                job.proc.send_signal(signal.SIGUSR1)
            elif CASE == "file":
                os.utime(trigger)
            else:
                server.notice()
            if CASE == "aws-rebalance-continues":
                if not job.wait_for(r"notice \(rebalance\) from aws", 60):
                    fail(f"{CASE}: the rebalance recommendation was not logged:\n"
                         f"{job.output()[-3000:]}")
                    return
                # Still training after it: a later checkpoint gets committed.
                seen = committed_step(d)
                if not wait_until(lambda: committed_step(d) > seen or
                                  job.proc.poll() is not None, 60) or \
                        job.proc.poll() is not None:
                    fail(f"{CASE}: a rebalance recommendation stopped the job:\n"
                         f"{job.output()[-3000:]}")
                    return
                t_notice = time.monotonic()
                job.proc.send_signal(signal.SIGUSR1)
            rc = job.wait(60)
            check_stopped(job, d, t_notice, rc)
            if CASE == "sigterm-tutti-run":
                if "restart 1" in job.output():
                    fail("tutti-run restarted the job after its own SIGTERM")
                if "SIGUSR1 to mpirun" not in job.output():
                    fail("tutti-run did not report forwarding the notice")
                if not job.wait_for(r"^\[tutti-run\] status 75 is a clean preemption stop .*"
                                    r"banners above are expected", 1):
                    fail(f"tutti-run did not say that the stop with 75 was clean:\n"
                         f"{job.output()[-3000:]}")
            if server and CASE.startswith("aws"):
                reqs = server.requests()
                puts = [r for r in reqs if r["method"] == "PUT"]
                unauth = [r for r in reqs if r["status"] == 401]
                if not puts or unauth:
                    fail(f"aws: IMDSv2 handshake: {len(puts)} token PUTs, "
                         f"{len(unauth)} unauthenticated GETs")
            if server and CASE == "gcp":
                if any(r["status"] == 403 for r in server.requests()):
                    fail("gcp: a request lacked Metadata-Flavor: Google")
        finally:
            job.kill()
    finally:
        if server:
            server.stop()


tmp = tempfile.mkdtemp(prefix="tutti-preempt-")
try:
    run_case(tmp)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
finish(f"preemption case '{CASE}' on {NP} ranks")
