"""tutti.torch.elastic with real jobs: elastic_train.py (a Horovod elastic
script) under mpirun and tutti-run.  Run by plain pytest (it starts its own
mpirun jobs); registered by tests/python/CMakeLists.txt.

* a rank killed mid-epoch: tutti-run restarts the job, which resumes from the
  last commit (epoch 1, batch 3) and ends bit-identical to an uninterrupted
  run;
* a preemption notice (SIGUSR1) reaching one rank: every rank commits at the
  same batch and exits 75; the restarted job resumes there, bit-identical;
* a size change 2 -> 3 -> 2 (resize-requested, exit 75, the job started
  again at the new size on the same checkpoint directory): reset callbacks
  fire with the new size, the sampler keeps its global position (every
  sample trained exactly once per epoch), and the model matches a
  single-process emulation of the same schedule;
* the same under elastic tutti-run (--min-np 2 --max-np 3, a discovery
  script): the discovered slots grow from 2 to 3 (tutti-run asks the job to
  save and exit, and starts it at 3), then a rank dies and its "host"
  leaves discovery (the job comes back at 2 from the last commit).
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TRAIN = os.path.join(HERE, "elastic_train.py")
TUTTI_RUN = os.path.join(ROOT, "scripts", "tutti-run")
MPIRUN = os.environ.get("TUTTI_MPIEXEC", "mpirun")
sys.path.insert(0, HERE)
import elastic_train as et  # noqa: E402


def job_env(tmp, **extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "OMPI_MCA_orte", "ELASTIC_"))}
    env.update(TUTTI_CKPT_DIR=str(tmp / "ckpt"), ELASTIC_OUT=str(tmp / "out"),
               TUTTI_ELASTIC_DIR=str(tmp / "elastic"), TUTTI_PREEMPT_SOURCES="signals",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("TUTTI_RESTART_COUNT", None)
    env.update(extra)
    for d in ("out", "elastic"):
        os.makedirs(tmp / d, exist_ok=True)
    return env


def mpi_args(np_, env):
    args = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", str(np_)]
    for k in sorted(env):
        if k.startswith(("TUTTI_", "ELASTIC_")):
            args += ["-x", k]
    return args + [sys.executable, TRAIN]


def run(cmd, env, expect):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == expect, (
        f"{' '.join(cmd)} exited {p.returncode}, expected {expect}\n"
        f"{p.stdout[-4000:]}\n{p.stderr[-6000:]}")
    return p.stdout + p.stderr


def events(tmp):
    out = []
    for name in sorted(os.listdir(tmp / "out")):
        if name.startswith("events-"):
            with open(tmp / "out" / name) as f:
                out += [json.loads(line) for line in f]
    return out


def result(tmp):
    with open(tmp / "out" / "result.json") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 2-rank run."""
    tmp = tmp_path_factory.mktemp("reference")
    env = job_env(tmp)
    run(mpi_args(2, env), env, 0)
    return result(tmp)


def assert_complete(res, size):
    assert res["epoch"] == 3 and res["size"] == size
    assert res["seen"] == [3.0] * et.N          # every sample once per epoch
    assert res["commits_seen"] == [[0, 3], [1, 3], [2, 3]]


def test_reference_run(reference):
    assert_complete(reference, 2)
    assert reference["commit"] == 6      # 3 mid-epoch commits + 3 epoch ends


@pytest.mark.parametrize("fault", ["kill", "preempt", "stall"])
def test_fault_resumes_from_last_commit(tmp_path, reference, fault):
    """kill: rank 1 dies before epoch 1 batch 4 (last commit: epoch 1
    batch 3).  preempt: rank 1 gets SIGUSR1 before the commit at epoch 1
    batch 3; every rank commits there and exits 75.  stall: rank 1 stops
    before epoch 1 batch 4; rank 0's collective times out, and (without
    TUTTI_EXIT_ON_COMM_FAILURE) elastic.run lets the error end the process.
    Each time tutti-run restarts the job, which resumes at epoch 1 batch 3."""
    hook = {"kill": {"ELASTIC_KILL": "1:1:4"}, "preempt": {"ELASTIC_PREEMPT": "1:1:3"},
            "stall": {"ELASTIC_STALL": "1:1:4", "TUTTI_TIMEOUT": "10",
                      "TUTTI_EXIT_ON_COMM_FAILURE": "0"}}[fault]
    env = job_env(tmp_path, **hook)
    log = run([sys.executable, TUTTI_RUN, "--backoff", "0", "--max-restarts", "1", "--"]
              + mpi_args(2, env)[1:], env, 0)
    expected_status = {"kill": "failed with status 9",
                       "preempt": "stopped on a preemption notice",
                       "stall": "the communicator cannot be repaired in this process"}[fault]
    assert expected_status in log
    ev = events(tmp_path)
    starts = sorted((e["restart"], e["rank"], e["epoch"], e["batch"], e["commit"], e["position"])
                    for e in ev if e["kind"] == "start")
    # Commits so far: epoch-0 batch 3, epoch-0 end, epoch-1 batch 3 (the
    # third, after 24 of 48 samples of epoch 1).
    assert starts == [(0, 0, 0, 0, 0, 0), (0, 1, 0, 0, 0, 0),
                      (1, 0, 1, 3, 3, 24), (1, 1, 1, 3, 3, 24)], starts
    resets = sorted((e["restart"], e["rank"], e["lr"]) for e in ev if e["kind"] == "reset")
    assert resets == [(1, 0, 0.1), (1, 1, 0.1)]   # after the restart only
    res = result(tmp_path)
    assert_complete(res, 2)
    # Restored weights, momentum, sampler position: the same run.
    assert res["weight"] == reference["weight"] and res["bias"] == reference["bias"]
    assert all(e["same"] for e in ev if e["kind"] == "done")


def emulate(schedule):
    """Single-process emulation of elastic_train.py: ``schedule`` maps
    (epoch, batch) commit points to the world size from there on.  Rank r of
    W trains positions p + r, p + r + W, ... of the epoch's permutation from
    the position p where the size last changed; the step averages the
    ranks' gradients; the reset callback sets lr = BASE_LR * W."""
    data = et.dataset()
    x, y = data.tensors[0], data.tensors[1]
    torch.manual_seed(1000)                      # rank 0's init (sync broadcasts it)
    model = et.Net()
    w = schedule[(0, 0)]
    opt = torch.optim.SGD(model.parameters(), lr=et.BASE_LR * w, momentum=0.9)
    for epoch in range(3):
        perm = np.random.RandomState(11 + epoch).permutation(et.N)
        pos, batch, local = 0, 0, 0     # local: batches since the deal started
        while True:
            if schedule.get((epoch, batch), w) != w:
                pos += local * et.B * w
                w, local = schedule[(epoch, batch)], 0
                for g in opt.param_groups:
                    g["lr"] = et.BASE_LR * w
            left = np.arange(pos, et.N)
            per_rank = -(-len(left) // w)
            left = np.concatenate([left, left[:per_rank * w - len(left)]])
            shares = [left[r::w][local * et.B:(local + 1) * et.B] for r in range(w)]
            if len(shares[0]) == 0:
                break
            grads = []
            for share in shares:
                idx = torch.as_tensor(perm[share])
                model.zero_grad()
                torch.nn.functional.mse_loss(model(x[idx]), y[idx]).backward()
                grads.append([p.grad.clone() for p in model.parameters()])
            for p, *gs in zip(model.parameters(), *grads):
                p.grad = sum(gs) / w
            opt.step()
            for share in shares:
                model.seen[torch.as_tensor(perm[share])] += 1
            batch, local = batch + 1, local + 1
    return model


def test_emulation_matches_reference(reference):
    model = emulate({(0, 0): 2})
    assert np.allclose(model.lin.weight.detach().reshape(-1).numpy(), reference["weight"],
                       rtol=1e-12, atol=1e-12)
    assert model.seen.tolist() == reference["seen"]


def test_resize_2_3_2_on_one_checkpoint_dir(tmp_path):
    """rank 0 writes resize-requested before the commits at epoch 1 batch 3
    (to 3 ranks) and epoch 2 batch 3 (to 2): each job commits, exits 75,
    and the next is started at the requested size, as elastic tutti-run
    does (here by hand: three plain mpirun runs on one checkpoint dir)."""
    env = job_env(tmp_path, ELASTIC_RESIZE="1:3:3,2:3:2")
    for np_, status in ((2, 75), (3, 75), (2, 0)):
        log = run(mpi_args(np_, env), env, status)
        if status == 75:
            assert "tutti-run asked for a resize" in log and "exiting with 75" in log
    ev = events(tmp_path)
    starts = sorted((e["size"], e["epoch"], e["batch"], e["position"], e["lr"])
                    for e in ev if e["kind"] == "start" and e["rank"] == 0)
    assert starts == [(2, 0, 0, 0, 0.1), (2, 2, 3, 36, 0.1), (3, 1, 3, 24, 0.05 * 3)], starts
    resets = sorted((e["size"], e["rank"], e["lr"]) for e in ev if e["kind"] == "reset")
    assert resets == [(2, 0, 0.1), (2, 1, 0.1), (3, 0, 0.05 * 3), (3, 1, 0.05 * 3),
                      (3, 2, 0.05 * 3)], resets
    res = result(tmp_path)
    assert_complete(res, 2)                   # no sample repeated or skipped
    model = emulate({(0, 0): 2, (1, 3): 3, (2, 3): 2})
    assert model.seen.tolist() == res["seen"]
    assert np.allclose(model.lin.weight.detach().reshape(-1).numpy(), res["weight"],
                       rtol=1e-12, atol=1e-12)
    assert abs(model.lin.bias.item() - res["bias"]) < 1e-12


def schedule_of(ev):
    """{(epoch, batch): size} from rank 0's start events."""
    return {(e["epoch"], e["batch"]): e["size"] for e in ev
            if e["kind"] == "start" and e["rank"] == 0}


def test_grow_and_shrink_under_elastic_tutti_run(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:2\n")
    disc = tmp_path / "discover.sh"
    disc.write_text(f"#!/bin/sh\ncat {hosts}\n")
    disc.chmod(0o755)
    # The second run (at 3 ranks) loses rank 2 after 4 batches, and its
    # host's slot leaves discovery.
    env = job_env(tmp_path, ELASTIC_SLEEP="0.3", ELASTIC_LOSE="1:2:4",
                  ELASTIC_LOSE_WRITE=f"{hosts}=localhost:2\\n")
    del env["TUTTI_ELASTIC_DIR"]          # tutti-run's: $TUTTI_CKPT_DIR/.elastic
    exports = [a for k in sorted(env) if k.startswith("ELASTIC_") for a in ("-x", k)]
    # The lost rank stands for a lost host (it leaves discovery), which ends
    # an Open MPI 5 job even with fault tolerance on: --ulfm off keeps the
    # launcher's view of it as before (the rank's exit status, 9), where
    # --with-ft would let the survivors see it first (76).
    cmd = [sys.executable, TUTTI_RUN, "--mpirun", MPIRUN, "--min-np", "2", "--max-np", "3",
           "--host-discovery-script", str(disc), "--discovery-interval", "0.3",
           "--grow-interval", "0", "--backoff", "0", "--ulfm", "off", "--",
           "--oversubscribe", "--bind-to", "none"] + exports + [sys.executable, TRAIN]
    with open(tmp_path / "log.txt", "w+") as log:
        job = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while not any(e["kind"] == "start" for e in events(tmp_path)):
                assert job.poll() is None and time.monotonic() < deadline, "no start"
                time.sleep(0.1)
            hosts.write_text("localhost:3\n")     # a third slot appears
            status = job.wait(timeout=240)
        finally:
            if job.poll() is None:
                job.kill()
        log.seek(0)
        out = log.read()
    assert status == 0, out[-6000:]
    with open(tmp_path / "ckpt" / ".elastic" / "launches.jsonl") as f:
        launches = [json.loads(line) for line in f]
    assert [(r["np"], r["reason"]) for r in launches if r["event"] == "start"] == \
        [(2, "start"), (3, "resize"), (2, "failure")], out[-6000:]
    assert [r["status"] for r in launches if r["event"] == "end"] == [75, 9, 0]
    ev = events(tmp_path)
    sizes = [e["size"] for e in sorted(ev, key=lambda e: e["restart"])
             if e["kind"] == "start" and e["rank"] == 0]
    assert sizes == [2, 3, 2]
    resets = sorted((e["restart"], e["size"], e["lr"]) for e in ev if e["kind"] == "reset")
    assert resets == [(1, 3, 0.05 * 3)] * 3 + [(2, 2, 0.1)] * 2, resets
    res = result(tmp_path)
    assert res["epoch"] == 3 and res["seen"] == [3.0] * et.N
    model = emulate(schedule_of(ev))
    assert model.seen.tolist() == res["seen"]
    assert np.allclose(model.lin.weight.detach().reshape(-1).numpy(), res["weight"],
                       rtol=1e-12, atol=1e-12)


def test_example_runs_under_tutti_run(tmp_path):
    """examples/python/torch_elastic.py learns its task under tutti-run."""
    env = job_env(tmp_path, PYTHONPATH=os.environ.get("TUTTI_PYTHONPATH", ""))
    example = os.path.join(ROOT, "examples", "python", "torch_elastic.py")
    log = run([sys.executable, TUTTI_RUN, "--backoff", "0", "--max-restarts", "0", "--",
               "--oversubscribe", "--bind-to", "none", "-np", "2", "-x", "PYTHONPATH",
               sys.executable, example,
               "--epochs", "2"], env, 0)
    assert "size 2: epoch 0, batch 0" in log and "done: losses" in log, log[-3000:]


def kill_rank1_under_tutti_run(tmp_path, env):
    """Rank 1 dies before epoch 1 batch 4 (env has ELASTIC_KILL=1:1:4) under
    tutti-run, which restarts the job once; tutti-run's log after it checked
    the death and the progress to the 3rd commit."""
    log = run([sys.executable, TUTTI_RUN, "--backoff", "0", "--max-restarts", "1", "--"]
              + mpi_args(2, env)[1:], env, 0)
    assert "failed with status 9" in log
    assert "the committed step advanced to 3" in log, log[-3000:]
    return log


def assert_resumed_at_commit_3(tmp_path, reference):
    """Both ranks started fresh, then resumed from the 3rd commit (epoch 1,
    batch 3, sampler position 24), and the run ended bit-identical to the
    uninterrupted one."""
    ev = events(tmp_path)
    starts = sorted((e["restart"], e["rank"], e["epoch"], e["batch"], e["commit"], e["position"])
                    for e in ev if e["kind"] == "start")
    assert starts == [(0, 0, 0, 0, 0, 0), (0, 1, 0, 0, 0, 0),
                      (1, 0, 1, 3, 3, 24), (1, 1, 1, 3, 3, 24)], starts
    res = result(tmp_path)
    assert_complete(res, 2)
    assert res["weight"] == reference["weight"] and res["bias"] == reference["bias"]


def test_kill_resumes_from_the_memory_tier_without_a_checkpoint_dir(tmp_path, reference):
    """No TUTTI_CKPT_DIR: commits go to the memory tier (TUTTI_MEM_DIR here
    to look inside; /dev/shm by default).  Rank 1 dies before epoch 1 batch
    4; tutti-run restarts the job, which resumes from the commit in memory
    (epoch 1, batch 3) and ends bit-identical to the uninterrupted run.
    tutti-run sees the progress there and removes the job's directory when
    the run ends; a killed job's leftovers are swept at its start."""
    mem = tmp_path / "mem"
    mem.mkdir()
    user = mem / f"tutti-{os.getuid()}"
    # A job killed earlier left its commits: nothing holds them any more.
    (user / "killed-job" / "commits").mkdir(parents=True, mode=0o700)
    os.chmod(user, 0o700)
    (user / "killed-job" / "owner.lock").write_text("")
    env = job_env(tmp_path, ELASTIC_KILL="1:1:4", TUTTI_MEM_DIR=str(mem))
    env.pop("TUTTI_CKPT_DIR")
    env.pop("TUTTI_JOB_ID", None)
    log = kill_rank1_under_tutti_run(tmp_path, env)
    assert f"removed {user / 'killed-job'}" in log
    assert_resumed_at_commit_3(tmp_path, reference)
    assert not (tmp_path / "ckpt").exists()
    assert os.listdir(user) == [], os.listdir(user)   # the job's directory is gone


def test_kill_with_a_checkpoint_dir_resumes_from_ram(tmp_path, reference):
    """TUTTI_CKPT_DIR and the memory tier together (include/tutti/commit_tiers.h):
    every commit goes to memory, every 2nd (TUTTI_COMMIT_DURABLE_EVERY=2) to
    the directory too.  Rank 1 dies before epoch 1 batch 4, after the 3rd
    commit: the directory's newest is the 2nd, so the restarted job resumes
    from the memory tier's 3rd (epoch 1, batch 3), says so, and ends
    bit-identical to the uninterrupted run."""
    mem = tmp_path / "mem"
    mem.mkdir()
    env = job_env(tmp_path, ELASTIC_KILL="1:1:4", TUTTI_MEM_DIR=str(mem),
                  TUTTI_COMMIT_DURABLE_EVERY="2", TUTTI_LOG_LEVEL="info")
    env.pop("TUTTI_JOB_ID", None)
    log = kill_rank1_under_tutti_run(tmp_path, env)
    assert "the commit of step 3 came from the memory tier (the newest in" in log, log[-3000:]
    assert_resumed_at_commit_3(tmp_path, reference)
    assert any(n.startswith("step-") for n in os.listdir(tmp_path / "ckpt"))
    user = mem / f"tutti-{os.getuid()}"
    assert os.listdir(user) == [], os.listdir(user)   # removed when the job ended


def test_memory_tier_over_budget_keeps_commits_in_process_only(tmp_path, reference):
    """The job's memory-tier directory already holds more than
    TUTTI_MEM_BUDGET_MB: no commit is written (said once), restore() still
    works in-process, and after a killed rank the restarted job starts from
    the beginning (a fresh start, warned), then completes."""
    mem = tmp_path / "mem"
    job = "budget-job"
    ballast = mem / f"tutti-{os.getuid()}" / job
    ballast.mkdir(parents=True, mode=0o700)
    os.chmod(ballast.parent, 0o700)
    (ballast / "ballast").write_bytes(b"\0" * (2 << 20))
    env = job_env(tmp_path, ELASTIC_KILL="1:1:4", TUTTI_MEM_DIR=str(mem),
                  TUTTI_MEM_BUDGET_MB="1", TUTTI_JOB_ID=job)
    env.pop("TUTTI_CKPT_DIR")
    log = run([sys.executable, TUTTI_RUN, "--backoff", "0", "--max-restarts", "1", "--"]
              + mpi_args(2, env)[1:], env, 0)
    assert log.count("over its budget of 1.0 MiB (TUTTI_MEM_BUDGET_MB)") == 2, log[-4000:]
    ev = events(tmp_path)
    starts = sorted((e["restart"], e["rank"], e["epoch"], e["batch"], e["commit"])
                    for e in ev if e["kind"] == "start")
    assert starts == [(0, 0, 0, 0, 0), (0, 1, 0, 0, 0), (1, 0, 0, 0, 0), (1, 1, 0, 0, 0)], starts
    res = result(tmp_path)
    assert res["epoch"] == 3 and res["seen"] == [3.0] * et.N
    assert res["weight"] == reference["weight"] and res["bias"] == reference["bias"]
    assert not ballast.exists()
