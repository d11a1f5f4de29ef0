"""A Horovod elastic training script (Horovod API names only) that the
process-level tests (elastic_jobs.py) run under mpirun / tutti-run.

The model is a float64 linear regression with SGD + momentum; its buffer
``seen`` counts how often each sample was trained (summed over the ranks at
every step), so the count is committed and rolled back exactly like the
weights: at the end it shows whether any sample was repeated or skipped.

Test hooks (environment):
  ELASTIC_OUT        directory for events-<pid>.jsonl and result.json
  ELASTIC_KILL       "rank:epoch:batch": that rank dies (os._exit(9)) before
                     training that batch, in the first run only
  ELASTIC_RESIZE     "epoch:batch:np[,epoch:batch:np...]": rank 0 writes
                     $TUTTI_ELASTIC_DIR/resize-requested {"np": np} before the
                     commit at that batch (as tutti-run does before a grow)
  ELASTIC_STALL      "rank:epoch:batch": that rank stops (sleeps 120 s) before
                     training that batch, in the first run only: the other
                     ranks' collectives time out (TUTTI_TIMEOUT)
  ELASTIC_PREEMPT    "rank:epoch:batch": that rank sends itself SIGUSR1 (a
                     preemption notice) before the commit at that batch, in
                     the first run only
  ELASTIC_LOSE       "restart:rank:n": in the run with that TUTTI_RESTART_COUNT,
                     that rank dies after training n batches, first writing
                     ELASTIC_LOSE_WRITE ("path=text") (a host lost: the test's
                     discovery file shrinks)
  ELASTIC_SLEEP      seconds to sleep per batch (gives tutti-run time to grow)
  ELASTIC_EPOCHS     epochs (default 3)
"""
import json
import os
import signal
import sys
import time

import torch

if os.environ.get("TUTTI_PYTHONPATH"):
    sys.path.insert(0, os.environ["TUTTI_PYTHONPATH"])

import tutti.torch as hvd  # noqa: E402

N, D, B = 48, 4, 4          # samples, features, per-rank batch
COMMIT_EVERY = 3
BASE_LR = 0.05


def dataset():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    w = torch.arange(1, D + 1, dtype=torch.float64)
    y = x @ w + 0.5
    return torch.utils.data.TensorDataset(x, y, torch.arange(N))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(D, 1).double()
        self.register_buffer("seen", torch.zeros(N, dtype=torch.float64))

    def forward(self, x):
        return self.lin(x).squeeze(1)


def event(kind, **fields):
    out = os.environ.get("ELASTIC_OUT")
    if not out:
        return
    fields.update(kind=kind, rank=hvd.rank(), size=hvd.size(),
                  restart=int(os.environ.get("TUTTI_RESTART_COUNT", "0") or 0))
    with open(os.path.join(out, f"events-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(fields) + "\n")


def parse_points(text):
    return [tuple(int(v) for v in p.split(":")) for p in text.split(",") if p]


def main():
    hvd.init()
    torch.manual_seed(1000 + hvd.rank())     # ranks differ until sync()
    data = dataset()
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=11)
    loader = torch.utils.data.DataLoader(data, batch_size=B, sampler=sampler)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR * hvd.size(), momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    epochs = int(os.environ.get("ELASTIC_EPOCHS", "3"))
    restart = int(os.environ.get("TUTTI_RESTART_COUNT", "0") or 0)
    first_run = restart == 0
    lose = [p for p in parse_points(os.environ.get("ELASTIC_LOSE", "")) if p[0] == restart]
    sleep_s = float(os.environ.get("ELASTIC_SLEEP", "0"))
    trained = [0]
    kill = parse_points(os.environ.get("ELASTIC_KILL", ""))
    resizes = parse_points(os.environ.get("ELASTIC_RESIZE", ""))
    preempt = parse_points(os.environ.get("ELASTIC_PREEMPT", ""))
    stall = parse_points(os.environ.get("ELASTIC_STALL", ""))

    def on_reset():
        for group in opt.param_groups:
            group["lr"] = BASE_LR * hvd.size()
        event("reset", lr=opt.param_groups[0]["lr"])

    state = hvd.elastic.TorchState(model=model, optimizer=opt, sampler=sampler,
                                   epoch=0, batch=0, commits_seen=[])
    state.register_reset_callbacks([on_reset])

    def maybe_request_resize(epoch, batch):
        for (e, b, np_) in resizes:
            if (e, b) == (epoch, batch) and hvd.rank() == 0 and hvd.size() != np_:
                path = os.path.join(os.environ["TUTTI_ELASTIC_DIR"], "resize-requested")
                with open(path, "w") as f:
                    json.dump({"np": np_}, f)

    @hvd.elastic.run
    def train(state):
        event("start", epoch=state.epoch, batch=state.batch, commit=state.commit_step,
              position=sampler.processed(), lr=opt.param_groups[0]["lr"])
        while state.epoch < epochs:
            batch_offset = state.batch
            for idx, (x, y, index) in enumerate(loader):
                state.batch = batch_offset + idx
                if idx > 0 and state.batch % COMMIT_EVERY == 0:
                    maybe_request_resize(state.epoch, state.batch)
                    if first_run and (hvd.rank(), state.epoch, state.batch) in preempt:
                        event("preempt", epoch=state.epoch, batch=state.batch)
                        os.kill(os.getpid(), signal.SIGUSR1)
                    state.commits_seen.append([state.epoch, state.batch])
                    state.commit()
                if first_run and (hvd.rank(), state.epoch, state.batch) in kill:
                    event("kill", epoch=state.epoch, batch=state.batch)
                    os._exit(9)
                if first_run and (hvd.rank(), state.epoch, state.batch) in stall:
                    event("stall", epoch=state.epoch, batch=state.batch)
                    time.sleep(120)
                if any(p[1:] == (hvd.rank(), trained[0]) for p in lose):
                    path, _, text = os.environ.get("ELASTIC_LOSE_WRITE", "").partition("=")
                    if path:
                        with open(path, "w") as f:
                            f.write(text.replace("\\n", "\n"))
                    event("lose", epoch=state.epoch, batch=state.batch)
                    os._exit(9)
                time.sleep(sleep_s)
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                counts = torch.zeros(N, dtype=torch.float64)
                counts[index] += 1
                model.seen += hvd.allreduce(counts, op=hvd.Sum, name="seen")
                sampler.record_batch(idx, B)
                trained[0] += 1
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    # sync() made every rank equal at the start; training keeps them equal.
    flat = torch.cat([p.detach().reshape(-1) for p in model.state_dict().values()])
    same = bool(torch.equal(hvd.broadcast(flat, 0, name="final"), flat))
    event("done", epoch=state.epoch, commit=state.commit_step, same=same)
    if hvd.rank() == 0 and os.environ.get("ELASTIC_OUT"):
        result = {"weight": model.lin.weight.detach().reshape(-1).tolist(),
                  "bias": model.lin.bias.item(), "seen": model.seen.tolist(),
                  "epoch": state.epoch, "commit": state.commit_step,
                  "commits_seen": state.commits_seen, "size": hvd.size()}
        with open(os.path.join(os.environ["ELASTIC_OUT"], "result.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
