"""CUDA tensors through the bindings (ctest label gpu): collectives on torch
(and CuPy, when installed) device tensors, zero copy, the reducer and
DistributedOptimizer on a CUDA model, torch's GradScaler with agreed
overflow, the loss scaler and tensor-parallel modules on the device.  NCCL
serves the CUDA tensors where every rank has a GPU of its own; where ranks
share one, the staged transport does, and a CUDA all-reduce must then equal
the host all-reduce bit for bit.  Skipped ("no CUDA device") where there is
none."""
import pytest

import gpu_skip  # noqa: E402

gpu_skip.require_gpus()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import tutti  # noqa: E402
import tutti.torch as hvd  # noqa: E402
import horovod_mlp  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def device(world):
    hvd.init()
    d = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(d)
    return d


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32])
def test_nccl_collectives_zero_copy(world, rank, size, device, dtype):
    x = (torch.arange(6, device=device) * 2 + rank).to(dtype)
    ptr = x.data_ptr()
    world.allreduce(x, op="sum", stream=torch.cuda.current_stream().cuda_stream)
    assert x.data_ptr() == ptr
    expect = (torch.arange(6) * 2 * size + sum(range(size))).to(dtype)
    assert torch.equal(x.cpu(), expect)
    got = hvd.allgather(torch.full((rank + 1, 2), float(rank), device=device))
    assert got.is_cuda and got.shape[0] == size * (size + 1) // 2
    b = hvd.broadcast(torch.full((3,), float(rank), device=device), size - 1)
    assert torch.equal(b.cpu(), torch.full((3,), float(size - 1)))


def test_staged_cuda_allreduce_is_the_host_paths_bits(world, rank, size, device):
    # Collective (every rank asks at the same point).
    if gpu_skip.gpu_transport() != "staged":
        pytest.skip("NCCL serves CUDA tensors here: its sums run in another order than MPI's")
    g = torch.Generator().manual_seed(100 + rank)
    stream = torch.cuda.current_stream().cuda_stream
    for dtype, bits in ((torch.float32, torch.int32), (torch.float16, torch.int16),
                        (torch.bfloat16, torch.int16)):
        for op in ("sum", "avg", "max"):
            host = torch.randn(10007, generator=g).to(dtype)
            dev = host.to(device)
            world.allreduce(dev, op=op, stream=stream)
            world.allreduce(host, op=op)
            assert torch.equal(dev.cpu().view(bits), host.view(bits)), (dtype, op)


def test_cupy_allreduce(world, rank, size, device):
    cupy = pytest.importorskip("cupy")
    with cupy.cuda.Device(device.index):
        a = cupy.full(4, rank, dtype=cupy.float32)
        world.allreduce(a, op="sum")
        assert cupy.asnumpy(a).tolist() == [float(sum(range(size)))] * 4


def test_distributed_optimizer_on_cuda_matches_full_batch(rank, size, device):
    x, y = (t.float().to(device) for t in horovod_mlp.dataset())
    model = horovod_mlp.make_model(1).float().to(device)
    ref = horovod_mlp.make_model(1).float().to(device)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    n = 12 // size
    for s in range(3):
        opt.zero_grad()
        F.mse_loss(model(x[s * 12 + rank * n:][:n]), y[s * 12 + rank * n:][:n]).backward()
        opt.step()
        ref_opt.zero_grad()
        F.mse_loss(ref(x[s * 12:(s + 1) * 12]), y[s * 12:(s + 1) * 12]).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6)


def test_torch_grad_scaler_agrees_on_overflow(rank, size, device):
    model = torch.nn.Linear(3, 2).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = hvd.GradScaler(init_scale=256.0)
    before = [p.detach().clone() for p in model.parameters()]
    scaler.scale(model(torch.ones(1, 3, device=device)).sum()).backward()
    if rank == size - 1:
        model.bias.grad[0] = float("inf")
    scaler.step(opt)
    scaler.update()
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b), "every rank skipped"
    assert scaler.get_scale() == 128.0


def test_loss_scaler_and_tp_modules_on_cuda(world, rank, size, device):
    g = [torch.full((4,), 1024.0, device=device, dtype=torch.float16)]
    s = tutti.amp.DynamicLossScaler(init_scale=1024.0)
    assert s.unscale_and_check(g, groups=[world],
                               stream=torch.cuda.current_stream().cuda_stream) is False
    assert torch.equal(g[0].cpu(), torch.ones(4, dtype=torch.float16))
    mesh = tutti.ProcessMesh(world, size)
    from tutti.torch import tensor_parallel as tp
    torch.manual_seed(0)
    dense = torch.nn.Linear(4, 2 * size).to(device)
    col = tp.ColumnParallelLinear(4, 2 * size, mesh, device=device)
    col.layer.load_from_full(dense.weight.detach().cpu(), dense.bias.detach().cpu())
    x = torch.randn(3, 4, device=device)
    torch.cuda.synchronize()
    assert torch.allclose(col(x), dense(x), rtol=1e-4, atol=1e-5)
