"""tutti.optim.step side by side with PyTorch for 20 steps over several
parameters (sizes 1 to 4101, so vector lanes and scalar tails) and a grid of
hyper-parameters.

Two references:
* a line-by-line transcription of torch 2.x's single-tensor SGD / Adam /
  AdamW (torch/optim/{sgd,adam}.py, ``foreach=False``, ``capturable=False``,
  ``amsgrad=False``) run with the installed torch's CPU kernels: tutti must
  match it bit for bit (params and states);
* the installed ``torch.optim.{SGD,Adam,AdamW}(foreach=False)``: SGD bit for
  bit.  Adam/AdamW within a bound: torch < 2.0 updates exp_avg with
  ``mul_(beta1).add_(grad, alpha=1-beta1)`` where 2.x uses
  ``lerp_(grad, 1-beta1)``; the two float32 operation orders round exp_avg
  differently by at most an ulp, which moves the update by ~lr * 1e-7, far
  below an ulp of the parameter, so each step the parameters can differ by
  at most one rounding of the final addition: the bound is
  steps * ulp(max |p|) (torch 1.13: at most 2.4e-7 measured, one ulp of a
  parameter in [2, 4); bound 4.8e-6 for these parameters).
Hyper-parameters are float32 values (tutti's Hyper holds float), passed to
torch as the same Python floats.
"""
import math
import os
import sys

import numpy as np
import pytest

if os.environ.get("TUTTI_PYTHONPATH"):
    sys.path.insert(0, os.environ["TUTTI_PYTHONPATH"])

import tutti  # noqa: E402

torch = pytest.importorskip("torch")

STEPS = 20
SIZES = (1, 7, 32, 1003, 4101)


def f32(x):
    return float(np.float32(x))


# ---- torch 2.x single-tensor formulas, line by line --------------------------------

def torch2_sgd(p, g, buf, first, lr, momentum, dampening, nesterov, weight_decay, maximize):
    d_p = g if not maximize else -g
    if weight_decay != 0:
        d_p = d_p.add(p, alpha=weight_decay)
    if momentum != 0:
        if first:
            buf.copy_(d_p)
        else:
            buf.mul_(momentum).add_(d_p, alpha=1 - dampening)
        d_p = d_p.add(buf, alpha=momentum) if nesterov else buf
    p.add_(d_p, alpha=-lr)


def torch2_adam(p, g, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay,
                maximize, decoupled):
    grad = g if not maximize else -g
    if weight_decay != 0:
        if decoupled:
            p.mul_(1 - lr * weight_decay)
        else:
            grad = grad.add(p, alpha=weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad.conj(), value=1 - beta2)
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = lr / bias_correction1
    denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)
    p.addcdiv_(exp_avg, denom, value=-step_size)


SGD_CASES = [
    dict(lr=0.1),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-2),
    dict(lr=0.01, momentum=0.5, nesterov=True, maximize=True, weight_decay=1e-3),
]
ADAM_CASES = [
    ("adam", dict()),
    ("adam", dict(lr=1e-2, weight_decay=0.1)),
    ("adam", dict(lr=3e-3, betas=(0.3, 0.99), eps=1e-6, maximize=True)),
    ("adamw", dict(lr=1e-2)),
    ("adamw", dict(lr=1e-2, weight_decay=0.1, betas=(0.8, 0.95))),
    ("adamw", dict(lr=1e-3, weight_decay=1e-2, maximize=True, betas=(0.0, 0.999))),
]


def make_params(seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=gen) for n in SIZES], gen


def grads_for(params, gen, t):
    scale = 10.0 ** ((t % 5) - 2)  # 1e-2 .. 1e2: small and large moments
    return [torch.randn(p.numel(), generator=gen) * scale for p in params]


def ulp_bound(params):
    """steps * (float32 ulp of the largest parameter magnitude)."""
    top = max(float(p.abs().max()) for p in params)
    return STEPS * float(np.spacing(np.float32(top)))


@pytest.mark.parametrize("case", SGD_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_sgd_matches_torch_bit_for_bit(case):
    hp = {k: (f32(v) if isinstance(v, float) else v) for k, v in case.items()}
    lr, momentum = hp["lr"], hp.get("momentum", 0.0)
    dampening, wd = hp.get("dampening", 0.0), hp.get("weight_decay", 0.0)
    nesterov, maximize = hp.get("nesterov", False), hp.get("maximize", False)
    p0, gen = make_params(1)
    ours = [p.clone() for p in p0]
    ref = [p.clone() for p in p0]
    bufs = [[torch.zeros_like(p)] for p in p0]
    ref_bufs = [torch.zeros_like(p) for p in p0]
    mods = [p.clone().requires_grad_(True) for p in p0]
    opt = torch.optim.SGD(mods, lr=lr, momentum=momentum, dampening=dampening,
                          nesterov=nesterov, weight_decay=wd, maximize=maximize, foreach=False)
    for t in range(1, STEPS + 1):
        grads = grads_for(p0, gen, t)
        tutti.optim.step(ours, grads, bufs, kind="sgd", lr=lr, momentum=momentum,
                         dampening=dampening, nesterov=nesterov, weight_decay=wd,
                         maximize=maximize, step=t)
        for p, g, b in zip(ref, grads, ref_bufs):
            torch2_sgd(p, g, b, t == 1, lr, momentum, dampening, nesterov, wd, maximize)
        for m, g in zip(mods, grads):
            m.grad = g.clone()
        opt.step()
        for i in range(len(SIZES)):
            assert torch.equal(ours[i], ref[i]), f"step {t} param {i}: vs torch 2.x formulas"
            assert torch.equal(ours[i], mods[i].detach()), f"step {t} param {i}: vs torch.optim.SGD"
            if momentum:
                assert torch.equal(bufs[i][0], ref_bufs[i]), f"step {t} buffer {i}"


@pytest.mark.parametrize("kind,case", ADAM_CASES,
                         ids=lambda c: c if isinstance(c, str) else ",".join(f"{k}={v}" for k, v in c.items()))
def test_adam_matches_torch(kind, case):
    lr = f32(case.get("lr", 1e-3))
    beta1, beta2 = (f32(b) for b in case.get("betas", (0.9, 0.999)))
    eps, wd = f32(case.get("eps", 1e-8)), f32(case.get("weight_decay", 0.0))
    maximize = case.get("maximize", False)
    p0, gen = make_params(2)
    ours = [p.clone() for p in p0]
    ref = [p.clone() for p in p0]
    states = [[torch.zeros_like(p), torch.zeros_like(p)] for p in p0]
    ref_states = [[torch.zeros_like(p), torch.zeros_like(p)] for p in p0]
    mods = [p.clone().requires_grad_(True) for p in p0]
    cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    opt = cls(mods, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd,
              maximize=maximize, foreach=False)
    worst = 0.0
    for t in range(1, STEPS + 1):
        grads = grads_for(p0, gen, t)
        tutti.optim.step(ours, grads, states, kind=kind, lr=lr, betas=(beta1, beta2), eps=eps,
                         weight_decay=wd, maximize=maximize, step=t)
        for p, g, (m, v) in zip(ref, grads, ref_states):
            torch2_adam(p, g, m, v, float(t), lr, beta1, beta2, eps, wd, maximize, kind == "adamw")
        for m, g in zip(mods, grads):
            m.grad = g.clone()
        opt.step()
        for i in range(len(SIZES)):
            assert torch.equal(ours[i], ref[i]), f"step {t} param {i}: vs torch 2.x formulas"
            assert torch.equal(states[i][0], ref_states[i][0]), f"step {t} exp_avg {i}"
            assert torch.equal(states[i][1], ref_states[i][1]), f"step {t} exp_avg_sq {i}"
            worst = max(worst, float((ours[i] - mods[i].detach()).abs().max()))
    bound = ulp_bound(ours)
    assert worst <= bound, f"{kind}: max |tutti - torch.optim| = {worst} > {bound}"


def test_low_precision_grads_scale_and_model_copies():
    """bfloat16/float16 gradients times grad_scale step exactly like float32
    gradients holding those values; model copies are the rounded params."""
    gen = torch.Generator().manual_seed(3)
    p = [torch.randn(300, generator=gen) for _ in range(2)]
    ref = [x.clone() for x in p]
    g = [torch.randn(300, generator=gen).to(torch.bfloat16), torch.randn(300, generator=gen).half()]
    wide = [x.float() * 0.5 for x in g]
    st = [[torch.zeros(300), torch.zeros(300)] for _ in p]
    rst = [[torch.zeros(300), torch.zeros(300)] for _ in p]
    copies = [torch.full((300,), float("nan")).half(), torch.full((300,), float("nan")).bfloat16()]
    for t in (1, 2):
        tutti.optim.step(p, g, st, kind="adamw", weight_decay=0.01, step=t, grad_scale=0.5,
                         model_copies=copies)
        tutti.optim.step(ref, wide, rst, kind="adamw", weight_decay=0.01, step=t)
        for i in range(2):
            assert torch.equal(p[i], ref[i])
        assert torch.equal(copies[0], p[0].half())
        assert torch.equal(copies[1], p[1].bfloat16())


def test_errors_name_the_parameter():
    p = [torch.zeros(4), torch.zeros(5)]
    g = [torch.zeros(4), torch.zeros(6)]
    st = [[torch.zeros(4), torch.zeros(4)], [torch.zeros(5), torch.zeros(5)]]
    with pytest.raises(tutti.InvalidArgumentError, match=r"parameter #1 'fc.bias'.*6 elements"):
        tutti.optim.step(p, g, st, names=["fc.weight", "fc.bias"])
    with pytest.raises(tutti.InvalidArgumentError, match=r"parameter #0 .*1 state tensors"):
        tutti.optim.step(p[:1], g[:1], [st[0][:1]])
    with pytest.raises(ValueError, match="kind"):
        tutti.optim.step(p, g, st, kind="lamb")
    assert tutti.optim.num_states("sgd") == 1 and tutti.optim.num_states("adamw") == 2
    q = torch.ones(3)
    tutti.optim.step([q], [torch.full((3,), 2.0)], None, kind="sgd", lr=0.25)  # no state
    assert torch.equal(q, torch.full((3,), 0.5))
