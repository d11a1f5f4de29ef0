"""An AWS rebalance recommendation is an early warning: the job saves a
checkpoint at the next step boundary (PreemptionMonitor::decide ->
kSaveNow), keeps training to its last step and exits 0, with that
checkpoint committed and loadable.  A mock IMDSv2 server
(tests/preemption/mock_metadata.py) announces the recommendation and keeps
announcing it: the job saves once.

usage: save_now_test.py TINY_TRAIN MPIEXEC PYTHON NP
"""
import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "preemption"))
from jobs import Job, MockServer, fail, finish  # noqa: E402

TRAIN, MPIEXEC, PYTHON, NP = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
MPI = [MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", str(NP)]
STEPS = 150


def run(tmp):
    d = os.path.join(tmp, "ckpt")
    server = MockServer(PYTHON, "aws", tmp, rebalance=True)
    env = {"TUTTI_PREEMPT_POLL_MS": "50", "TUTTI_HTTP_TIMEOUT_MS": "1000",
           "TUTTI_PREEMPT_SOURCES": "aws", "TUTTI_AWS_METADATA_URL": server.url,
           "TUTTI_PREEMPT_STOP_ON_REBALANCE": "0"}
    # No grid saves: the only checkpoint is the one the recommendation asks for.
    job = Job(MPI + [TRAIN, "--dir", d, "--steps", str(STEPS), "--save-every", "100000",
                     "--step-ms", "20", "--zero", "--compress"], env=env, name="train")
    try:
        if not job.wait_for(r"^FRESH", 60):
            return fail(f"the job did not start:\n{job.output()[-3000:]}")
        # The aws source has polled the endpoint (an event, not a sleep).
        deadline = time.monotonic() + 60
        while not any(r["method"] == "GET" for r in server.requests()):
            if time.monotonic() > deadline or job.proc.poll() is not None:
                break
            time.sleep(0.05)
        if job.proc.poll() is not None:
            return fail(f"the job ended before the notice:\n{job.output()[-3000:]}")
        server.notice()
        rc = job.wait(120)
        out = job.output()
        # Rank 0 prints the source when its own monitor saw the notice, else
        # "another rank" (a node's ranks share one poller: the decision is
        # agreed; aws is the only source enabled).
        saves = re.findall(r"^SAVED-NOW (\d+) \(([^)]*)\)", out, re.M)
        if rc != 0:
            return fail(f"exit status {rc}, expected 0 (a rebalance keeps training):\n{out[-3000:]}")
        if len(saves) != 1 or saves[0][1] not in ("aws", "another rank"):
            return fail(f"expected one SAVED-NOW from aws, got {saves}:\n{out[-3000:]}")
        step = int(saves[0][0])
        if not re.search(rf"^DONE {STEPS}$", out, re.M) or step >= STEPS:
            return fail(f"the job did not train on to step {STEPS} after saving at {step}")
        print(f"SAVED-NOW at step {step}, then DONE {STEPS}", flush=True)
        names = sorted(n for n in os.listdir(d) if n.startswith("step-"))
        want = "step-%08d" % step
        if names != [want] or not os.path.exists(os.path.join(d, want, "manifest.json")):
            return fail(f"checkpoints {names}, expected exactly the committed {want}")
        if open(os.path.join(d, "latest")).read().strip() != want:
            return fail(f"latest does not name {want}")
    finally:
        job.kill()
        server.stop()
    # A fresh job resumes exactly there (every shard present and verified).
    again = Job(MPI + [TRAIN, "--dir", d, "--steps", str(step), "--zero", "--compress"],
                env={"TUTTI_PREEMPT_SOURCES": "signals"}, name="resume")
    if again.wait(120) != 0 or not again.wait_for(rf"^RESUMED {step} from {NP} ranks", 1):
        fail(f"a fresh run did not resume from step {step}:\n{again.output()[-2000:]}")


tmp = tempfile.mkdtemp(prefix="tutti-save-now-")
try:
    run(tmp)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
finish(f"rebalance recommendation -> save now, keep training, on {NP} ranks")
