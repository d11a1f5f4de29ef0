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
import torch.nn.functional as F

import tutti
from tutti.torch import tensor_parallel as tp

S, B, H, FFN = 8, 2, 8, 16  # divisible by TP 1, 2 and 4
STEPS, LR, MAX_NORM = 3, 0.1, 0.5
# float32, sums over positions taken in another order (per rank, then over
# the TP group); the weights are compared after three steps.
TOL = dict(rtol=1e-4, atol=2e-5)


class Dense(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.ln1, self.ln2 = torch.nn.LayerNorm(H), torch.nn.LayerNorm(H)
        self.fc1, self.fc2 = torch.nn.Linear(H, FFN), torch.nn.Linear(FFN, H)
        with torch.no_grad():  # LayerNorm parameters away from 1 and 0
            for ln in (self.ln1, self.ln2):
                ln.weight.uniform_(0.5, 1.5)
                ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.ln2(self.fc2(F.gelu(self.fc1(self.ln1(x)))))


class SequenceParallel(torch.nn.Module):
    """The same block on this rank's [S/p, B, H] slice, weights from dense."""

    def __init__(self, dense, mesh):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(H), torch.nn.LayerNorm(H)
        self.ln1.load_state_dict(dense.ln1.state_dict())
        self.ln2.load_state_dict(dense.ln2.state_dict())
        self.fc1 = tp.ColumnParallelLinear(H, FFN, mesh, gather_output=False,
                                           sequence_parallel=True, name="sp.fc1")
        self.fc2 = tp.RowParallelLinear(FFN, H, mesh, input_is_parallel=True,
                                        sequence_parallel=True, name="sp.fc2")
        self.fc1.layer.load_from_full(dense.fc1.weight.detach(), dense.fc1.bias.detach())
        self.fc2.layer.load_from_full(dense.fc2.weight.detach(), dense.fc2.bias.detach())
        tp.mark_sequence_parallel(*self.ln1.parameters(), *self.ln2.parameters())

    def forward(self, x):
        return self.ln2(self.fc2(F.gelu(self.fc1(self.ln1(x)))))


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
    dense = Dense()
    sp = SequenceParallel(dense, mesh)
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
