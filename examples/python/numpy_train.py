"""Data-parallel training with numpy only: softmax regression on a synthetic
task, gradients averaged by tutti.Reducer (bucketed, compressed if asked),
a dynamic loss scaler's fused unscale + check, and checkpoints that resume.

    mpirun -np 4 python examples/python/numpy_train.py --steps 200 --compression fp16

No framework: tutti takes numpy arrays through DLPack (zero copy).  Exits
non-zero if the replicas differ or the loss did not drop: the replica check
compares every rank with every other (an all-reduce of each parameter's max
and min), so every rank reaches the same verdict; ``--perturb-rank R``
nudges rank R's parameters just before it, to watch it fail.
"""
import argparse
import sys

import numpy as np

import tutti


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64, help="per rank")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--compression", default="none")
    ap.add_argument("--ckpt-dir", default="")
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--perturb-rank", type=int, default=-1,
                    help="this rank adds 1e-3 to a weight before the replica check "
                         "(to see the check fail)")
    args = ap.parse_args()

    tutti.init()
    world = tutti.world()
    rank, size = world.rank, world.size
    features, classes = 32, 4

    # The task: labels from a fixed random linear map (same on every rank).
    truth = np.random.default_rng(1234).standard_normal((features, classes))

    def batch(step):
        rng = np.random.default_rng([step, rank])  # each rank its own shard
        x = rng.standard_normal((args.batch, features)).astype(np.float32)
        return x, np.argmax(x @ truth, axis=1)

    # Parameters and the gradient buffers the reducer averages in place.
    rng = np.random.default_rng(rank)  # deliberately different: broadcast fixes it
    params = {"w": (0.01 * rng.standard_normal((features, classes))).astype(np.float32),
              "b": np.zeros(classes, np.float32)}
    grads = {k: np.zeros_like(v) for k, v in params.items()}
    reducer = tutti.Reducer(world, compressor=args.compression, bucket_cap_mb=1.0)
    index = {k: reducer.add_parameter(k, params[k], grads[k]) for k in params}
    reducer.build()
    scaler = tutti.amp.DynamicLossScaler(init_scale=1024.0, growth_interval=100)

    start = 0
    mgr = None
    state = {"model": params, "scaler": scaler}
    if args.ckpt_dir:
        mgr = tutti.CheckpointManager(world, args.ckpt_dir, keep_last=2)
        if mgr.latest_step() is not None:
            start = mgr.load(state)["step"]
            if rank == 0:
                print(f"resumed from step {start}")
    if start == 0:
        reducer.broadcast_parameters(0)

    first = last = None
    for step in range(start, args.steps):
        x, y = batch(step)
        logits = x @ params["w"] + params["b"]
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
        reducer.set_gradient_scale(scaler.scale)  # compressors' residuals follow it
        # Backward of the scaled loss, last layer first (as autograd would).
        d = p.copy()
        d[np.arange(len(y)), y] -= 1.0
        d *= scaler.scale / len(y)
        grads["b"][...] = d.sum(axis=0)
        reducer.grad_ready(index["b"])
        grads["w"][...] = x.T @ d
        reducer.grad_ready(index["w"])
        reducer.synchronize()  # grads now hold the average over ranks
        skip = scaler.unscale_and_check([grads["w"], grads["b"]], groups=[world])
        if not skip:
            for k in params:
                params[k] -= args.lr * grads[k]
        scaler.update()
        loss = float(tutti.allreduce(np.array([loss], np.float64), op="avg")[0])
        first = loss if first is None else first
        last = loss
        if rank == 0 and ((step + 1) % 50 == 0 or step + 1 == args.steps):
            print(f"step {step + 1:4d}/{args.steps} | loss {loss:.4f} | scale {scaler.scale:g}")
        if mgr and (step + 1) % args.ckpt_every == 0:
            mgr.save(step + 1, state)
    if mgr:
        mgr.wait()
        mgr.close()

    # Every replica must hold the same parameters, bit for bit: the spread of
    # each element over the ranks (max - min), the same on every rank.  (Not
    # a comparison with rank 0's broadcast, which on rank 0 compares rank 0
    # with itself.)  NaN or infinity anywhere counts as a difference.
    if rank == args.perturb_rank:
        params["w"].flat[0] += 1e-3
    flat = np.concatenate([params["w"].ravel(), params["b"]]).astype(np.float64)
    finite = tutti.allreduce(np.array([np.isfinite(flat).all()], np.int32), op="min")[0]
    spread = (tutti.allreduce(flat, op="max") - tutti.allreduce(flat, op="min")).max()
    diff = float(spread) if finite else float("inf")
    same = diff == 0.0
    ok = same and (start > 0 or last < 0.6 * first)
    if rank == 0 and first is not None:
        verdict = "identical" if same else f"DIFFER (max difference {diff:.3g})"
        print(f"loss {first:.4f} -> {last:.4f}; replicas {verdict}")
    tutti.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
