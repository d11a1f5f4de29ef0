"""The training job of bench/spot/restart_cost.py: a Horovod elastic script
(``import tutti.torch as hvd``) that stamps the wall clock at each phase of
its start, so that a restart's time can be cut into parts.

Environment: RC_OUT (directory for phases-<restart>-<rank>.json), RC_PARAMS
(model size in float32 parameters), RC_STEPS, RC_COMMIT_EVERY, RC_KILL
("rank:step": that rank os._exit(9)s before that step, first attempt only).
"""
import json
import os
import time

T = {"process": time.time()}
import torch  # noqa: E402
T["import_torch"] = time.time()
import tutti.torch as hvd  # noqa: E402
T["import_tutti"] = time.time()

out = os.environ["RC_OUT"]
restart = int(os.environ.get("TUTTI_RESTART_COUNT", "0") or 0)
params = int(os.environ.get("RC_PARAMS", str(1 << 22)))
steps = int(os.environ.get("RC_STEPS", "12"))
every = int(os.environ.get("RC_COMMIT_EVERY", "3"))
kill = os.environ.get("RC_KILL", "")

hvd.init()
T["init"] = time.time()
model = torch.nn.Linear(params // 64, 64, bias=False)
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
T["state"] = time.time()


def dump():
    with open(os.path.join(out, f"phases-{restart}-{hvd.rank()}.json"), "w") as f:
        json.dump(T, f)


@hvd.elastic.run
def train(state):
    T["loaded"] = time.time()
    x = torch.ones(8, params // 64)
    for step in range(state.step + 1, steps + 1):
        if restart == 0 and kill == f"{hvd.rank()}:{step}":
            T["killed"] = time.time()
            dump()
            os._exit(9)
        opt.zero_grad()
        model(x).sum().backward()
        for p in model.parameters():
            p.grad = hvd.allreduce(p.grad, name="grad")
        opt.step()
        state.step = step
        if "first_step" not in T:
            T["first_step"] = time.time()
            T["first_step_number"] = step
        if step % every == 0:
            t = time.time()
            state.commit()
            T.setdefault("commit_s", []).append(time.time() - t)


train(state)
T["done"] = time.time()
dump()
