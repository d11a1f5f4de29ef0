"""tutti.torch.elastic's ElasticSampler across an in-process recovery (ULFM),
for tests/elastic/ulfm_mesh_test.py (case sampler), on CPU tensors.

  ulfm_sampler_probe.py OUT KILL_RANK KILL_STEP N BATCH [TP]

One epoch of N samples (shuffled, seed 3), BATCH per rank and step, a
TorchState (a 1x1 weight w, the sampler, epoch) committed every step to the
memory tier.  Step: every rank all-reduces the sum of its batch's indices
that are not tail padding (TP rank 0 of each replica), w += that sum.  KILL_RANK (numbered at start)
SIGKILLs itself in step KILL_STEP after that all-reduce (mid-step, before
the commit).  Each rank appends what it trained to OUT/records.rank<R>, one
JSON line per batch: {"gen": the number of the call of the training
function (0, then 1 after the recovery), "commit": the commit the step
ends with, "indices": [...], "padding": [...]} before the commit.  At the
end every finishing rank writes OUT/result.rank<R>; rank 0 writes
OUT/state.json: {"w", "commit" (the last), "resumed": [commit each call
started from], "sizes": {commit: world size}}.  Exits 77 where recovery is
not available.

TP > 1: a TP x DP job as far as the sampler and the loop know it
(``ElasticSampler(tp_size=TP)``, ``@elastic.run(tp_size=TP)``): the killed
rank's TP partners leave the job (SystemExit(0), written to
OUT/exit.rank<R>), the other TP groups go on with one DP replica less.
"""
import json
import os
import signal
import sys

import torch

import tutti
import tutti.torch as hvd
from ulfm_py_probe import init_or_skip

out, kill_rank, kill_step, n, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), int(sys.argv[5])
tp = int(sys.argv[6]) if len(sys.argv) > 6 else 1
start_rank = init_or_skip()
model = torch.nn.Linear(1, 1, bias=False)
with torch.no_grad():
    model.weight.zero_()
sampler = hvd.elastic.ElasticSampler(list(range(n)), shuffle=True, seed=3, tp_size=tp)
state = hvd.elastic.TorchState(model=model, sampler=sampler, epoch=0)
calls, sizes = [], {}
records = open(os.path.join(out, f"records.rank{start_rank}"), "a")


@hvd.elastic.run(tp_size=tp)
def train(state):
    gen = len(calls)
    calls.append(state.commit_step)
    steps = 0
    while state.epoch < 1:
        mine = list(state.sampler)   # this rank's share of what is not committed
        for b in range(-(-len(mine) // batch)):
            steps += 1
            idx = state.sampler.get_indices(b, batch)
            pad = state.sampler.padding(b, batch)
            # One rank of a TP group adds its replica's batch.
            mine_sum = sum(i for i, p in zip(idx, pad) if not p) if hvd.rank() % tp == 0 else 0
            total = torch.tensor([float(mine_sum)])
            total = hvd.allreduce(total, op=hvd.Sum, name="batch")
            if start_rank == kill_rank and gen == 0 and steps == kill_step:
                with open(os.path.join(out, f"killed.rank{start_rank}"), "w") as f:
                    f.write(f"{steps}\n")
                os.kill(os.getpid(), signal.SIGKILL)
            with torch.no_grad():
                model.weight.add_(total.item())
            state.sampler.record_batch(b, batch)
            commit = state.commit_step + 1
            sizes[commit] = hvd.size()
            records.write(json.dumps({"gen": gen, "commit": commit, "indices": idx,
                                      "padding": pad}) + "\n")
            records.flush()
            state.commit()
        state.epoch += 1
        state.sampler.set_epoch(state.epoch)
        state.commit()


try:
    train(state)
except SystemExit as e:      # a TP partner of the killed rank leaves
    with open(os.path.join(out, f"exit.rank{start_rank}"), "w") as f:
        f.write(f"{e.code}\n")
    raise
records.close()
with open(os.path.join(out, f"result.rank{start_rank}"), "w") as f:
    f.write(f"calls={len(calls)} resumed={calls[1:]} final_size={hvd.size()}\nOK\n")
if hvd.rank() == 0:
    with open(os.path.join(out, "state.json"), "w") as f:
        json.dump({"w": model.weight.item(), "commit": state.commit_step, "resumed": calls,
                   "sizes": sizes}, f)
tutti.shutdown()
