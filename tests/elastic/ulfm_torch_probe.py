"""tutti.torch.elastic.run recovering in-process from a killed rank (ULFM),
for tests/elastic/ulfm_test.py (case torch-elastic), on CPU tensors.

  ulfm_torch_probe.py OUT KILL_RANK KILL_STEP STEPS

State: a Linear(4, 1) weight w (replicated) and `step`, committed every
step to the memory tier; step s checks w is the same on every rank (an
all-reduce), then w = w / 2 + s * size().  KILL_RANK SIGKILLs itself after
step KILL_STEP's check.  Exits 77 where recovery is not available.
Writes OUT/result.rank<R> (R: the rank at start) and, on rank 0 at the
end, OUT/state.json with w and the size every step ran at.
"""
import json
import os
import signal
import sys
import time

import torch

import tutti
import tutti.torch as hvd
from ulfm_py_probe import init_or_skip

out, kill_rank, kill_step, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4])
start_rank = init_or_skip()
model = torch.nn.Linear(4, 1, bias=False)
with torch.no_grad():
    model.weight.fill_(1.0)
opt = torch.optim.SGD(model.parameters(), lr=0.0)
state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
resets = []
state.register_reset_callbacks([lambda: resets.append(hvd.size())])
sizes = {}
calls = []


@hvd.elastic.run
def train(state):
    calls.append(state.step)
    while state.step < steps:
        step = state.step + 1
        w = model.weight.detach().clone()
        total = hvd.allreduce(w, op=hvd.Sum, name="check")
        assert torch.equal(total, w * hvd.size()), (step, total, w)
        if start_rank == kill_rank and step == kill_step:
            with open(os.path.join(out, f"killed.rank{start_rank}"), "w") as f:
                f.write(f"{time.time():.6f}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        sizes[step] = hvd.size()
        with torch.no_grad():
            model.weight.mul_(0.5).add_(float(step * hvd.size()))
        state.step = step
        state.commit()


train(state)
with open(os.path.join(out, f"result.rank{start_rank}"), "w") as f:
    f.write(f"calls={len(calls)} resumed={calls[1:]} resets={resets} final_size={hvd.size()} "
            f"pid={os.getpid()}\nOK\n")
if hvd.rank() == 0:
    with open(os.path.join(out, "state.json"), "w") as f:
        json.dump({"w": model.weight.detach().flatten().tolist(),
                   "sizes": [sizes[s] for s in range(1, steps + 1)]}, f)
tutti.shutdown()
