"""Megatron's sequence-parallel recipe against a dense model, at TP 2 and
TP 4 (run by explicit ctests at np 2 and np 4: python_sp_recipe_np*; not
named test_*.py, so the np 1-3 suites do not collect it).

The block is LayerNorm -> column-parallel linear -> GELU -> row-parallel
linear -> LayerNorm with sequence parallelism on: activations outside the
TP region are split on the sequence dimension, the LayerNorm parameters are
marked (tp.mark_sequence_parallel) and their partial gradients summed once
per step (tp.allreduce_sequence_parallel_grads).  Over three SGD steps with
tp.clip_grad_norm_, every rank's output slice, every gradient (its shard of
the sharded ones), the clip norm and the updated weights match the dense
block on the whole sequence."""
import pytest
import torch

import tutti
from tutti.torch import tensor_parallel as tp
# The dense block and its SP twin (LayerNorm -> column -> GELU -> row ->
# LayerNorm, the LayerNorms marked) are test_torch_tp.py's.
from test_torch_tp import DenseSPBlock, SPBlock

S, B, H, FFN = 8, 2, 8, 16  # divisible by TP 1, 2 and 4
STEPS, LR, MAX_NORM = 3, 0.1, 0.5
# float32, sums over positions taken in another order (per rank, then over
# the TP group); the weights are compared after three steps.
TOL = dict(rtol=1e-4, atol=2e-5)


def dense_block():
    torch.manual_seed(5)
    return DenseSPBlock(H, FFN)


def my_part(name, t, mesh):
    """This TP rank's part of a dense tensor named like the parameter."""
    p, r = mesh.tp_size, mesh.tp_rank
    if name in ("fc1.weight", "fc1.bias"):
        return t.chunk(p, 0)[r]  # column parallel: output features
    if name == "fc2.weight":
        return t.chunk(p, 1)[r]  # row parallel: input features
    return t                     # replicated (LayerNorms, fc2.bias)


@pytest.mark.parametrize("tp_size", [2, 4])
def test_sequence_parallel_recipe_matches_dense(world, tp_size):
    if world.size % tp_size:
        pytest.skip(f"TP {tp_size} needs a world that is a multiple of it (np {world.size})")
    mesh = tutti.ProcessMesh(world, tp_size)
    p, r = mesh.tp_size, mesh.tp_rank
    dense = dense_block()
    sp = SPBlock(dense, mesh)
    dense_opt = torch.optim.SGD(dense.parameters(), lr=LR)
    sp_opt = torch.optim.SGD(sp.parameters(), lr=LR)
    names = [n for n, _ in dense.named_parameters()]
    assert names == [n for n, _ in sp.named_parameters()]
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step)
        x, target = torch.randn(S, B, H, generator=g), torch.randn(S, B, H, generator=g)
        dense_opt.zero_grad()
        sp_opt.zero_grad()
        y = dense(x)
        (y * target).sum().backward()
        y_sp = sp(x.chunk(p, 0)[r])
        torch.testing.assert_close(y_sp, y.chunk(p, 0)[r], **TOL)
        # Each rank's loss covers its sequence slice; their sum is the dense loss.
        (y_sp * target.chunk(p, 0)[r]).sum().backward()
        tp.allreduce_sequence_parallel_grads(sp, mesh)
        for n, q in sp.named_parameters():
            want = my_part(n, dense.get_parameter(n).grad, mesh)
            torch.testing.assert_close(q.grad, want, **TOL, msg=lambda m, n=n: f"{n}: {m}")
        want_norm = torch.nn.utils.clip_grad_norm_(dense.parameters(), MAX_NORM)
        norm = tp.clip_grad_norm_(sp.parameters(), MAX_NORM, mesh)
        assert float(norm) == pytest.approx(float(want_norm), rel=1e-5), step
        assert float(want_norm) > MAX_NORM  # the clipping scaled every gradient
        for n, q in sp.named_parameters():  # the clipped gradients
            torch.testing.assert_close(q.grad, my_part(n, dense.get_parameter(n).grad, mesh),
                                       **TOL)
        dense_opt.step()
        sp_opt.step()
    for n, q in sp.named_parameters():
        torch.testing.assert_close(q.detach(), my_part(n, dense.get_parameter(n).detach(), mesh),
                                   **TOL)
