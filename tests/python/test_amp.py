"""tutti.amp through the bindings: fused unscale/check, casts, norms and
clipping on numpy and torch tensors, and the loss scaler's decisions agreed
across ranks (an overflow on one rank skips the step on all)."""
import math

import numpy as np
import pytest

import tutti

torch = pytest.importorskip("torch")


def test_unscale_and_check_reports_and_writes_in_place():
    a = np.array([2.0, 4.0, 8.0], dtype=np.float32)
    b = torch.tensor([6.0, float("inf")], dtype=torch.float16)
    c = torch.tensor([1.0, -2.0], dtype=torch.bfloat16)
    ptr = a.ctypes.data
    rep = tutti.amp.unscale_and_check([a, b, c], 0.5)
    assert rep.found and rep.tensors == [1] and bool(rep)
    assert a.ctypes.data == ptr
    np.testing.assert_array_equal(a, [1.0, 2.0, 4.0])
    assert b[0].item() == 3.0 and math.isinf(b[1].item())
    assert torch.equal(c, torch.tensor([0.5, -1.0], dtype=torch.bfloat16))
    assert rep.describe(["a", "b", "c"]) == "'b'"
    assert not tutti.amp.check_finite([a, c])


def test_casts_and_norms():
    master = [np.array([1.0, 70000.0, -3.5], dtype=np.float32), np.array([0.25], dtype=np.float32)]
    model = [np.zeros(3, dtype=np.float16), torch.zeros(1, dtype=torch.bfloat16)]
    rep = tutti.amp.copy_master_to_model(master, model)
    assert rep.tensors == [0]  # 70000 overflows float16
    assert model[0][0] == 1.0 and np.isinf(model[0][1]) and model[0][2] == -3.5
    assert model[1].item() == 0.25
    grads16 = [np.array([512.0, -1024.0], dtype=np.float16)]
    out = [np.zeros(2, dtype=np.float32)]
    rep = tutti.amp.model_grads_to_master(grads16, out, 1.0 / 256)
    assert not rep.found
    np.testing.assert_array_equal(out[0], [2.0, -4.0])
    ss, mx = tutti.amp.multi_tensor_norms([np.array([3.0, -4.0], np.float32),
                                           torch.tensor([1.0, 2.0, -2.0], dtype=torch.float16)])
    assert ss == [25.0, 9.0] and mx == [4.0, 2.0]
    dst = [np.zeros(2, np.float32)]
    tutti.amp.scale_copy([np.array([1.5, 2.0], np.float32)], dst, 4.0)
    np.testing.assert_array_equal(dst[0], [6.0, 8.0])


def test_grad_norm_and_clip_over_a_group(world, rank, size):
    # Each rank holds a different shard [rank+1, rank+1] and a replicated
    # tensor [1, 1, 1, 1] counted once: norm^2 = sum_r 2 (r+1)^2 + 4.
    shard = np.full(2, rank + 1.0, dtype=np.float32)
    rep = torch.ones(4)
    expect = math.sqrt(sum(2 * (r + 1) ** 2 for r in range(size)) + 4)
    n = tutti.amp.grad_norm([shard, rep], group=world, replicated=[False, True])
    assert n == pytest.approx(expect, rel=1e-12)
    inf_norm = tutti.amp.grad_norm([shard, rep], norm_type=math.inf, group=world)
    assert inf_norm == size
    res = tutti.amp.clip_grad_norm([shard, rep], 1.0, group=world, replicated=[False, True])
    assert res.clipped and res.total_norm == pytest.approx(expect)
    coef = 1.0 / (expect + 1e-6)
    assert res.clip_coef == pytest.approx(coef)
    np.testing.assert_allclose(shard, np.full(2, (rank + 1) * coef), rtol=1e-6)
    # Already small enough: untouched.
    small = [np.full(3, 0.1, np.float32)]
    assert not tutti.amp.clip_grad_norm(small, 10.0).clipped
    np.testing.assert_array_equal(small[0], np.full(3, 0.1, np.float32))
    with pytest.raises(tutti.InvalidArgumentError, match="'bad'"):
        tutti.amp.clip_grad_norm([np.array([np.nan], np.float32)], 1.0,
                                 names=["bad"], error_if_nonfinite=True)


def test_loss_scaler_skip_is_agreed_across_ranks(world, rank, size):
    scaler = tutti.amp.DynamicLossScaler(init_scale=1024.0, growth_interval=2)
    assert scaler.dynamic and scaler.scale == 1024.0 and scaler.inv_scale == 1 / 1024
    # Step 0: only the last rank overflows; every rank must skip.
    g = np.full(3, 2048.0, dtype=np.float16)
    if rank == size - 1:
        g[1] = np.inf
    skip = scaler.unscale_and_check([g], names=["w"], groups=[world])
    assert skip is True and scaler.found_non_finite
    u = scaler.update()
    assert u.skipped and u.backed_off and u.old_scale == 1024.0 and u.new_scale == 512.0
    # Two clean steps grow the scale back.
    for step in range(2):
        g = np.full(3, 512.0, dtype=np.float16)
        assert scaler.unscale_and_check([g], groups=world) is False
        np.testing.assert_array_equal(g, np.ones(3, np.float16))
        scaler.update()
    assert scaler.scale == 1024.0 and scaler.steps == 3 and scaler.skipped_steps == 1
    assert scaler.last_overflow_step == 0
    # state_dict: numpy copies that restore bit-exactly.
    sd = scaler.state_dict()
    assert sd["amp/loss_scaler/scale"].dtype == np.float32
    assert sd["amp/loss_scaler/skipped_steps"][0] == 1
    fresh = tutti.amp.DynamicLossScaler()
    fresh.load_state_dict(sd)
    assert fresh.scale == 1024.0 and fresh.steps == 3 and fresh.last_overflow_step == 0
    sd["amp/loss_scaler/scale"][0] = 1.0  # a copy: the scaler is unchanged
    assert scaler.scale == 1024.0


def test_loss_scaler_views_agree_and_errors(world, rank, size):
    scaler = tutti.amp.DynamicLossScaler(init_scale=4.0, min_scale=2.0)
    views = scaler.state_views()
    scale = torch.from_dlpack(views["amp/loss_scaler/scale"])
    assert scale.data_ptr() == views["amp/loss_scaler/scale"].data_ptr
    # agree() on a report computed elsewhere; rank 0 saw an overflow.
    local = tutti.amp.NonFiniteReport(found=rank == 0, tensors=[0] if rank == 0 else [])
    assert scaler.agree(local, names=["x"], groups=[world]) is True
    scaler.update()
    assert scale.item() == 2.0, "the view sees the live scale"
    with pytest.raises(tutti.InvalidArgumentError, match="check"):
        scaler.update()  # no check recorded this step
    # At the minimum scale an overflow is an error naming the tensor.
    g = np.array([np.inf], np.float32)
    scaler.unscale_and_check([g], names=["layer.w"], groups=[world])
    with pytest.raises(tutti.InvalidArgumentError, match="minimum"):
        scaler.update()
    with pytest.raises(tutti.InvalidArgumentError, match="missing key"):
        scaler.load_state_dict({"amp/loss_scaler/scale": 8.0})
    with pytest.raises(ValueError, match="at_min_scale"):
        tutti.amp.DynamicLossScaler(at_min_scale="ignore")


def test_bfloat16_scaler_keeps_scale_one():
    s = tutti.amp.DynamicLossScaler(precision="bfloat16")
    assert not s.dynamic and s.scale == 1.0
    g = torch.tensor([3.0, -1.0], dtype=torch.bfloat16)
    assert s.unscale_and_check([g]) is False
    assert torch.equal(g, torch.tensor([3.0, -1.0], dtype=torch.bfloat16))
    assert s.update().new_scale == 1.0
    assert s.options["precision"] == "bfloat16"
