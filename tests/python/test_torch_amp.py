"""Loss scaling in tutti.torch: LossScaler (tutti's C++ scaler behind
GradScaler's interface) with DistributedOptimizer, skip decisions agreed
across ranks, state dicts, and the found_inf agreement torch's GradScaler
subclass uses (torch 1.13's GradScaler itself needs CUDA)."""
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tutti  # noqa: E402
import tutti.torch as hvd  # noqa: E402

import horovod_mlp  # noqa: E402


def run(steps, scaler, rank, size):
    x, y = (t.float() for t in horovod_mlp.dataset())
    model = horovod_mlp.make_model(5).float()  # AMP takes float32/16/bfloat16
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    n = 12 // size
    for step in range(steps):
        xb, yb = x[step * 12 + rank * n:][:n], y[step * 12 + rank * n:][:n]
        opt.zero_grad()
        loss = F.mse_loss(model(xb), yb)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    return model


def test_scaled_training_equals_unscaled(rank, size):
    # Power-of-two scales commute with rounding: the results are identical.
    scaler = hvd.LossScaler(init_scale=1024.0, growth_interval=2)
    scaled = run(4, scaler, rank, size)
    plain = run(4, None, rank, size)
    for p, q in zip(scaled.parameters(), plain.parameters()):
        assert torch.equal(p, q)
    assert scaler.get_scale() == 4096.0 and scaler.skipped_steps == 0


def test_overflow_on_one_rank_skips_everywhere(rank, size):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # local: no DistributedOptimizer
    scaler = hvd.LossScaler(init_scale=256.0)
    before = [p.detach().clone() for p in model.parameters()]
    scaler.scale(model(torch.ones(1, 3)).sum()).backward()
    if rank == size - 1:
        model.bias.grad[0] = float("inf")
    assert scaler.step(opt) is None
    scaler.update()
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b), "every rank skipped"
    assert scaler.get_scale() == 128.0 and scaler.skipped_steps == 1
    # The next clean step applies, with gradients unscaled exactly.
    opt.zero_grad()
    scaler.scale(model(torch.ones(1, 3)).sum()).backward()
    scaler.unscale_(opt)
    assert torch.equal(model.bias.grad, torch.ones(2))
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    assert torch.equal(model.bias, before[1] - 1.0)


def test_state_dict_and_migration():
    a = hvd.LossScaler(init_scale=8.0)
    sd = a.state_dict()
    assert sd["loss_scaler/scale"][0] == 8.0
    b = hvd.LossScaler()
    b.load_state_dict(sd)
    assert b.get_scale() == 8.0
    b.load_state_dict({"scale": 32.0, "_growth_tracker": 3})  # a torch GradScaler's
    assert b.get_scale() == 32.0 and b.scaler.growth_tracker == 3
    off = hvd.LossScaler(enabled=False)
    t = torch.ones(2)
    assert off.scale(t) is t and off.get_scale() == 1.0
    bf = hvd.LossScaler(precision="bfloat16")
    assert bf.get_scale() == 1.0


def test_update_with_new_scale_does_not_apply_the_growth_rule(rank, size):
    # torch's GradScaler.update(new_scale) only sets the scale: the growth
    # tracker is neither advanced nor reset.  With growth_interval=2 and
    # clean steps: 1024 -> update(100) -> 100 -> update() -> 100 (tracker 1)
    # -> update() -> 200 (tracker 2 = interval).
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = hvd.LossScaler(init_scale=1024.0, growth_interval=2)

    def step(new_scale, x=1.0):
        opt.zero_grad()
        scaler.scale(model(torch.tensor([[x, 1.0]])).sum()).backward()
        scaler.step(opt)
        scaler.update(new_scale)
        return scaler.get_scale()

    trajectory = [scaler.get_scale()] + [step(s) for s in (100.0, None, None)]
    assert trajectory == [1024.0, 100.0, 100.0, 200.0]
    assert scaler.scaler.steps == 3  # every update() ends a step
    # A tensor works as in torch; an overflow step still counts as skipped,
    # and the given scale wins over the backoff.
    assert step(torch.tensor(64.0), x=float("inf")) == 64.0
    assert scaler.skipped_steps == 1


def test_found_inf_agreement_for_torch_grad_scaler(rank, size):
    flags = {torch.device("cpu"): torch.tensor([1.0 if rank == 1 else 0.0])}
    agreed = hvd.agree_found_inf(flags)
    expect = 1.0 if size > 1 else 0.0
    assert agreed.item() == expect and flags[torch.device("cpu")].item() == expect
    assert issubclass(hvd.GradScaler, torch.cuda.amp.GradScaler)


def test_overflow_at_the_minimum_scale_names_the_parameter(rank, size):
    model = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    scaler = hvd.LossScaler(init_scale=1.0, min_scale=1.0)
    x = torch.tensor([[float("inf") if rank == 0 else 1.0, 1.0]])
    scaler.scale(model(x).sum()).backward()
    scaler.step(opt)  # skipped: the averaged weight gradient is Inf everywhere
    with pytest.raises(tutti.InvalidArgumentError, match="'weight'"):
        scaler.update()
    assert scaler.skipped_steps == 1


@pytest.mark.parametrize("algo", ["topk", "onebit"])
def test_loss_scaler_with_error_feedback_compressor(rank, size, algo):
    # LossScaler.scale() hands its scale to the DistributedOptimizer's
    # reducer: the residuals are kept at that scale (state "grad_scale"), and
    # one rank's overflow marks the bucket NaN everywhere without touching
    # the residuals, so every rank skips the step.
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(),
                                   compression=tutti.make_compressor(algo))
    scaler = hvd.LossScaler(init_scale=512.0, growth_interval=1000)
    comp = opt.compressor
    x = torch.randn(4, 16) * (rank + 1)

    def step(poison=False):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        if poison and rank == size - 1:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    step()
    scales = {k: v for k, v in comp.state_dict().items() if k.endswith("/grad_scale")}
    assert scales and all(float(v[0]) == 512.0 for v in scales.values()), scales
    residuals = {k: v.copy() for k, v in comp.state_dict().items() if k.endswith("/residual")}
    weights = [p.detach().clone() for p in model.parameters()]
    step(poison=True)
    assert scaler.skipped_steps == 1 and scaler.get_scale() == 256.0
    for p, w in zip(model.parameters(), weights):
        assert torch.equal(p, w), "the overflow step was skipped on every rank"
    after = comp.state_dict()
    for k, v in residuals.items():
        assert (after[k] == v).all(), f"{k} changed in the skipped step"
    assert comp.stats()["nonfinite_steps"] == 1
    step()  # the next step runs at the backed-off scale
    scales = {k: v for k, v in comp.state_dict().items() if k.endswith("/grad_scale")}
    assert all(float(v[0]) == 256.0 for v in scales.values()), scales
