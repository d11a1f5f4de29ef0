"""torch's GradScaler (tutti.torch.GradScaler, CUDA only in torch) hands its
scale to error-feedback compressors, as LossScaler does: the residuals follow
the scale through a backoff.  Skipped ("no CUDA device") where there is none.
"""
import pytest

import gpu_skip  # noqa: E402

gpu_skip.require_gpus()

import torch  # noqa: E402
import tutti  # noqa: E402
import tutti.torch as hvd  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("algo", ["topk", "onebit"])
def test_grad_scaler_hands_its_scale_to_error_feedback(rank, size, algo):
    hvd.init()
    device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8).to(device)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(),
                                   compression=tutti.make_compressor(algo))
    scaler = hvd.GradScaler(init_scale=512.0, growth_interval=1000)
    comp = opt.compressor
    x = torch.randn(4, 16, device=device) * (rank + 1)

    def step(poison=False):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        if poison and rank == size - 1:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    def residual_scales():
        return {k: float(v[0]) for k, v in comp.state_dict().items()
                if k.endswith("/grad_scale")}

    step()
    assert residual_scales() and set(residual_scales().values()) == {512.0}
    step(poison=True)  # one rank overflows: every rank backs off to 256
    assert scaler.get_scale() == 256.0
    step()
    assert set(residual_scales().values()) == {256.0}, residual_scales()
