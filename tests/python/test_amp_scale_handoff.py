"""Each loss scaler hands its scale to the reducers of the models its loss
reaches, and only to those (issue 17: the old module global gave every
reducer the scale of the newest scale() call in the process).  The
error-feedback residuals of each compressor are kept in its own scaler's
units: state "<...>/grad_scale"."""
import torch

import tutti
import tutti.torch as hvd
from tutti.torch import ddp_comm_hooks as hooks


def residual_scales(compressor):
    return {float(v[0]) for k, v in compressor.state_dict().items() if k.endswith("/grad_scale")}


def test_two_scalers_two_models_in_one_process(rank, size):
    torch.manual_seed(0)
    net_a, net_b = torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)
    opt_a = hvd.DistributedOptimizer(torch.optim.SGD(net_a.parameters(), lr=0.01),
                                     named_parameters=net_a.named_parameters(),
                                     compression=tutti.make_compressor("topk"))
    ddp_b = hvd.DistributedDataParallel(net_b, compression=tutti.make_compressor("onebit"))
    opt_b = torch.optim.SGD(ddp_b.parameters(), lr=0.01)
    scaler_a = hvd.LossScaler(init_scale=512.0, growth_interval=1000)
    scaler_b = hvd.LossScaler(init_scale=64.0, growth_interval=1000)
    x = torch.randn(4, 16) * (rank + 1)

    def step():
        opt_a.zero_grad()
        opt_b.zero_grad()
        # Both losses are scaled before either backward runs.
        loss_a = scaler_a.scale(net_a(x).pow(2).mean())
        loss_b = scaler_b.scale(ddp_b(x).pow(2).mean())
        loss_a.backward()
        opt_a.synchronize()  # A's compressor thread is done before B's starts
        loss_b.backward()
        for scaler, opt in ((scaler_a, opt_a), (scaler_b, opt_b)):
            scaler.step(opt)

    step()  # the first step already knows its scale
    assert residual_scales(opt_a.compressor) == {512.0}
    assert residual_scales(ddp_b.compressor) == {64.0}
    scaler_a.update(new_scale=256.0)
    scaler_b.update()
    step()
    assert residual_scales(opt_a.compressor) == {256.0}
    assert residual_scales(ddp_b.compressor) == {64.0}


def test_comm_hook_compressor_follows_its_scaler(rank, size):
    torch.manual_seed(0)
    net = torch.nn.Linear(16, 8)
    ddp = hvd.DistributedDataParallel(net)
    state = hooks.CompressorState(hvd.Compression.topk(ratio=0.25))
    ddp.register_comm_hook(state, hooks.compressor_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    scaler = hvd.LossScaler(init_scale=128.0, growth_interval=1000)
    other = hvd.LossScaler(init_scale=2.0)  # a second scaler in the process
    x = torch.randn(4, 16) * (rank + 1)
    for want in (128.0, 32.0):
        opt.zero_grad()
        loss = scaler.scale(ddp(x).pow(2).mean())
        other.scale(torch.ones(1, requires_grad=True).sum())
        loss.backward()
        scaler.step(opt)
        assert residual_scales(state.compressors[0]) == {want}
        scaler.update(new_scale=32.0)
