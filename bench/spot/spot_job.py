"""The training job of bench/spot/spot_trace.py: a Horovod elastic script
(``import tutti.torch as hvd``, ``hvd.elastic.run``) that commits every step
into the memory tier (no TUTTI_CKPT_DIR), with a step of controlled duration:
a small model's forward and backward, then a sleep up to SPOT_STEP_S, then
the gradient all-reduce, the optimizer step and ``state.commit()``.

Environment (set by spot_trace.py):
  SPOT_OUT       directory: rank 0 appends log.jsonl (flushed per record);
                 every rank writes pids/<pid>.json when it enters the
                 training function (pid, rank, size, host, restart, entry)
  SPOT_STEP_S    seconds of a step before its all-reduce (compute + sleep)
  SPOT_PARAMS    float32 parameters of the model
  SPOT_STEPS     stop after this step (0: no limit)
  SPOT_DEADLINE  Unix time: stop at the first step completed after it (0: none)

log.jsonl records (rank 0 of the moment), each with t (Unix time), restart
(TUTTI_RESTART_COUNT), entry (calls of the training function in this
process: > 1 after an in-process recovery), size:
  {"ev": "start", "step": S}   the function was entered from commit S
  {"ev": "done", "step": S}    step S completed (gradients all-reduced, applied)
  {"ev": "commit", "step": S, "commit_s": c}   state.commit() of S returned
  {"ev": "stop", "step": S, "commit_s": c}     the same, when the commit
                 raised HostsUpdatedInterrupt (a notice): the job exits 75
  {"ev": "end", "step": S}     the job finished
"""
import json
import os
import socket
import time

T0 = time.time()
import torch  # noqa: E402
import tutti.torch as hvd  # noqa: E402

OUT = os.environ["SPOT_OUT"]
RESTART = int(os.environ.get("TUTTI_RESTART_COUNT", "0") or 0)
STEP_S = float(os.environ.get("SPOT_STEP_S", "0.5"))
PARAMS = int(os.environ.get("SPOT_PARAMS", str(1 << 20)))
STEPS = int(os.environ.get("SPOT_STEPS", "0"))
DEADLINE = float(os.environ.get("SPOT_DEADLINE", "0"))

hvd.init()
WIDTH = 256
model = torch.nn.Linear(WIDTH, max(1, PARAMS // WIDTH), bias=False)
opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
# Constructed early: it installs the notice handlers (a SIGUSR1 is a notice).
state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
entries = 0
log_file = None


def record(ev, **kv):
    global log_file
    if hvd.rank() != 0:
        return
    if log_file is None:
        log_file = open(os.path.join(OUT, "log.jsonl"), "a")
    kv.update(ev=ev, t=time.time(), restart=RESTART, entry=entries, size=hvd.size())
    log_file.write(json.dumps(kv) + "\n")
    log_file.flush()


def write_pid():
    d = os.path.join(OUT, "pids")
    os.makedirs(d, exist_ok=True)
    info = {"pid": os.getpid(), "rank": hvd.rank(), "size": hvd.size(),
            "host": socket.gethostname(), "restart": RESTART, "entry": entries,
            "t": time.time(), "process_t": T0}
    tmp = os.path.join(d, f".{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, os.path.join(d, f"{os.getpid()}.json"))


def should_stop(step):
    if STEPS and step >= STEPS:
        return True
    if not DEADLINE:
        return False
    # Rank 0's clock decides, so that every rank stops at the same step.
    flag = torch.tensor([1.0 if time.time() >= DEADLINE else 0.0])
    return bool(hvd.broadcast(flag, 0, name="spot.stop").item() > 0)


@hvd.elastic.run
def train(state):
    global entries
    entries += 1
    write_pid()
    record("start", step=state.step)
    x = torch.ones(8, WIDTH)
    step = state.step
    while not should_stop(step):
        step = state.step + 1
        t = time.time()
        opt.zero_grad()
        model(x).square().mean().backward()
        rest = STEP_S - (time.time() - t)
        if rest > 0:
            time.sleep(rest)
        for p in model.parameters():
            p.grad = hvd.allreduce(p.grad, name="grad")
        opt.step()
        state.step = step
        record("done", step=step)
        c = time.time()
        try:
            state.commit()
        except hvd.elastic.HostsUpdatedInterrupt:
            # A notice: this commit is the stop step's; run() exits with 75.
            record("stop", step=step, commit_s=time.time() - c)
            raise
        record("commit", step=step, commit_s=time.time() - c)
    record("end", step=step)


train(state)
