"""Checkpoints and preemption through the bindings: round trips of numpy,
torch and Stateful state, sharded tensors resharded on load, async snapshot
isolation, corruption fallback, safetensors interop, mismatches on every
rank; preemption notices (code, signal, trigger file, a mock AWS metadata
server) agreed across ranks; and tutti.torch.checkpoint resuming a training
run bit-exactly (model, Adam, loss scaler, compressor, RNG, data position).
A directory that cannot be used (a file in the way, no write permission)
raises CheckpointError from the constructor and from save() alike."""
import http.server
import os
import shutil
import signal
import tempfile
import threading
import time

import numpy as np
import pytest

import tutti

torch = pytest.importorskip("torch")
import tutti.torch as hvd  # noqa: E402


@pytest.fixture
def ckpt_dir(world):
    """One directory for every rank (created by rank 0, name broadcast,
    removed afterwards)."""
    name = np.zeros(256, np.uint8)
    if world.rank == 0:
        path = tempfile.mkdtemp(prefix="tutti-ckpt-").encode()
        name[:len(path)] = np.frombuffer(path, np.uint8)
    world.broadcast(name, root=0)
    path = name.tobytes().rstrip(b"\0").decode()
    yield path
    world.barrier()
    if world.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def test_round_trip_with_metadata_and_stateful(world, rank, size, ckpt_dir):
    mgr = tutti.CheckpointManager(world, ckpt_dir, keep_last=2)
    w = torch.arange(6.0).reshape(2, 3) + rank * 0  # replicated
    b = np.full(4, 7, np.int64)
    scaler = tutti.amp.DynamicLossScaler(init_scale=32.0)
    state = {"model": {"w": w, "b": b}, "scaler": scaler}
    for step in (10, 20, 30):
        w += 1
        mgr.save(step, state, {"data_position": {"epoch": step // 10}, "lr": 0.1})
    mgr.wait()
    if rank == 0:  # rank 0 applies retention before its save completes
        assert [c["step"] for c in mgr.list()] == [20, 30], "keep_last=2"
    assert mgr.list()[-1]["step"] == 30
    assert mgr.latest_step() == 30 and mgr.last_save_stats()["step"] == 30
    assert [c["step"] for c in tutti.list_checkpoints(ckpt_dir)][-1] == 30
    assert tutti.verify_checkpoint(mgr.list()[-1]["path"]) == ""
    w.zero_()
    b[:] = 0
    sd = scaler.state_dict()
    sd["amp/loss_scaler/scale"][0] = 1.0
    scaler.load_state_dict(sd)
    res = mgr.load(state)
    assert res["step"] == 30 and res["metadata"] == {"data_position": {"epoch": 3}, "lr": 0.1}
    assert res["saved_world_size"] == size and res["skipped"] == []
    assert torch.equal(w, torch.arange(6.0).reshape(2, 3) + 3)
    assert b.tolist() == [7] * 4 and scaler.scale == 32.0
    older = mgr.load({"model": {"w": w}}, step=20)
    assert older["step"] == 20 and torch.equal(w, torch.arange(6.0).reshape(2, 3) + 2)
    mgr.close()


def test_async_snapshot_isolation_and_safetensors_interop(world, rank, size, ckpt_dir):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    with tutti.CheckpointManager(world, ckpt_dir, async_save=True, direct_io=False) as mgr:
        x = np.full((1, 1000), float(rank), np.float32)
        mgr.save(1, {"m": {"x": (x, {"global_shape": [size, 1000], "dim": 0, "offset": rank})}})
        x[:] = -1  # after save() returned: not in the checkpoint
        mgr.wait()
        shard = os.path.join(mgr.list()[-1]["path"], f"rank-{rank:05d}.safetensors")
        got = safetensors_numpy.load_file(shard)
        assert got["m/x"].tolist() == [[float(rank)] * 1000]


def test_resharding_rows_to_replicated(world, rank, size, ckpt_dir):
    """Each rank saves its rows of a global [2 size, 3] tensor; every rank
    then loads the whole tensor (and a different split of it)."""
    mgr = tutti.CheckpointManager(world, ckpt_dir, async_save=False)
    glob = np.arange(2 * size * 3, dtype=np.float64).reshape(2 * size, 3)
    mine = np.ascontiguousarray(glob[2 * rank:2 * rank + 2])
    mgr.save(5, {"t": {"x": (mine, {"global_shape": [2 * size, 3], "dim": 0,
                                    "offset": 2 * rank, "group": "tp"})}})
    whole = np.zeros_like(glob)
    mgr.load({"t": {"x": whole}})
    np.testing.assert_array_equal(whole, glob)
    cols = np.zeros((2 * size, 1))
    mgr.load({"t": {"x": (cols, {"global_shape": [2 * size, 3], "dim": 1, "offset": 1})}})
    np.testing.assert_array_equal(cols[:, 0], glob[:, 1])
    mgr.close()


def test_corruption_falls_back_and_mismatch_raises_everywhere(world, rank, size, ckpt_dir):
    mgr = tutti.CheckpointManager(world, ckpt_dir, async_save=False, keep_last=5)
    v = np.ones(64, np.float32)
    mgr.save(1, {"m": {"v": v}})
    v[:] = 2
    mgr.save(2, {"m": {"v": v}})
    world.barrier()
    if rank == 0:  # flip a byte in the newest shard's data
        path = os.path.join(mgr.list()[-1]["path"], "rank-00000.safetensors")
        with open(path, "r+b") as f:
            f.seek(-4, os.SEEK_END)
            byte = f.read(1)
            f.seek(-4, os.SEEK_END)
            f.write(bytes([byte[0] ^ 0xFF]))
    world.barrier()
    assert tutti.verify_checkpoint(mgr.list()[-1]["path"]) != ""
    v[:] = 0
    assert mgr.load({"m": {"v": v}})["step"] == 1
    assert v.tolist() == [1.0] * 64
    with pytest.raises(tutti.MismatchError, match="m/v"):
        mgr.load({"m": {"v": np.zeros(65, np.float32)}})
    with pytest.raises(tutti.InvalidArgumentError):
        mgr.save(3, {"bad/name": {"v": v}})
    mgr.close()
    with pytest.raises(tutti.InvalidArgumentError, match="closed"):
        mgr.wait()


def test_layouts_through_the_bindings(world, rank, size, ckpt_dir):
    """layout= picks who writes what: "once" stores replicated state once
    across the job (manifest version 3 with the tensor index; the ranks'
    written_bytes add up to the state), "per-rank" every rank all it holds
    (version 2, size copies); both load, reporting this rank's reads; an
    unknown layout is an InvalidArgumentError."""
    import json
    w = np.arange(1000, dtype=np.float32)  # replicated, the same on every rank
    for layout, version, copies in (("once", 3, 1), ("per-rank", 2, size)):
        d = os.path.join(ckpt_dir, layout)
        mgr = tutti.CheckpointManager(world, d, async_save=False, layout=layout)
        mgr.save(1, {"m": {"w": w}})
        stats = mgr.last_save_stats()
        written = np.array([stats["written_bytes"]], np.int64)
        world.allreduce(written, op="sum")
        assert stats["bytes"] == 4000 and written[0] == copies * 4000, (layout, written)
        world.barrier()
        with open(os.path.join(d, "step-00000001", "manifest.json")) as f:
            manifest = json.load(f)
        assert manifest["version"] == version and ("tensors" in manifest) == (version == 3)
        got = np.zeros_like(w)
        res = mgr.load({"m": {"w": got}})
        assert res["step"] == 1 and np.array_equal(got, w)
        assert res["files_opened"] >= (1 if rank == 0 else 0) and res["bytes_read"] >= 0
        mgr.close()
    with pytest.raises(tutti.InvalidArgumentError, match="layout"):
        tutti.CheckpointManager(world, ckpt_dir, layout="twice")


def test_no_checkpoint_yet(world, ckpt_dir):
    with tutti.CheckpointManager(world, ckpt_dir) as mgr:
        assert mgr.load({"m": {"v": np.zeros(2)}}) is None and mgr.latest_step() is None
        assert hvd.checkpoint.load(mgr, model=torch.nn.Linear(2, 2)) is None


def _unwritable_dir(world, base):
    """A directory in which this process cannot create entries (the same on
    every rank), or None: a 0500 directory stops an ordinary user, and sysfs
    refuses new entries even to root."""
    ro = os.path.join(base, "read-only")
    if world.rank == 0:
        os.mkdir(ro, 0o500)
        os.chmod(ro, 0o500)
    world.barrier()
    found = None
    for d in (ro, "/sys"):
        probe = os.path.join(d, f".tutti-write-probe-{os.getpid()}")
        try:
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            os.unlink(probe)
        except OSError:
            if os.path.isdir(d):
                found = d
                break
    which = np.array([[None, ro, "/sys"].index(found)], np.int64)
    lo, hi = which.copy(), which.copy()
    world.allreduce(lo, op="min")
    world.allreduce(hi, op="max")
    assert lo[0] == hi[0], f"ranks disagree about an unwritable directory (this rank: {found})"
    return found


def _expect_checkpoint_error(call, *wanted):
    """call() raises CheckpointError (not InvalidArgumentError) naming every
    one of `wanted`, and never "File exists"."""
    with pytest.raises(tutti.CheckpointError) as info:
        call()
    msg = str(info.value)
    assert info.value.code == "I/O error", msg
    assert not isinstance(info.value, tutti.InvalidArgumentError), msg
    for w in wanted:
        assert w in msg, f"expected {w!r} in: {msg}"
    assert "File exists" not in msg, msg


def _save_fails_while_replaced(world, base, put, *wanted):
    """save() after rank 0 moved the manager's directory aside and `put`
    something in its place; then the directory comes back and saves work."""
    root, moved = os.path.join(base, "ckpt"), os.path.join(base, "ckpt.moved")
    with tutti.CheckpointManager(world, root, async_save=True) as mgr:
        w = np.ones(3)
        mgr.save(1, {"m": {"w": w}})
        mgr.wait()
        world.barrier()
        if world.rank == 0:
            os.rename(root, moved)
            put(root)
        world.barrier()

        def save():
            mgr.save(2, {"m": {"w": w}})
            mgr.wait()
        _expect_checkpoint_error(save, "checkpoint step 2 not saved", *wanted)
        world.barrier()
        if world.rank == 0:
            os.unlink(root)
            os.rename(moved, root)
        world.barrier()
        mgr.save(3, {"m": {"w": w}})
        mgr.wait()
        assert mgr.latest_step() == 3, "the manager stays usable"


def test_a_file_in_the_way_is_a_checkpoint_error_from_the_constructor_and_save(world,
                                                                                ckpt_dir):
    file = os.path.join(ckpt_dir, "file")
    if world.rank == 0:
        with open(file, "w") as f:
            f.write("not a directory\n")
    world.barrier()
    not_a_dir = f"creating directory '{file}' failed: it exists and is not a directory " \
                "(a regular file)"
    for d in (file, os.path.join(file, "ckpt")):
        _expect_checkpoint_error(lambda: tutti.CheckpointManager(world, d), not_a_dir,
                                 f"the checkpoint directory '{d}' cannot be created or written")

    def put_file(root):
        with open(root, "w") as f:
            f.write("x")
    root = os.path.join(ckpt_dir, "ckpt")
    _save_fails_while_replaced(world, ckpt_dir, put_file, f"creating directory '{root}' failed: "
                               "it exists and is not a directory (a regular file)")


def test_an_unwritable_directory_is_a_checkpoint_error_from_the_constructor_and_save(world,
                                                                                     ckpt_dir):
    ro = _unwritable_dir(world, ckpt_dir)
    if ro is None:
        pytest.skip("no directory refuses this process new entries (root without /sys)")
    _expect_checkpoint_error(lambda: tutti.CheckpointManager(world, ro),
                             f"the checkpoint directory '{ro}' cannot be created or written",
                             f"creating the checkpoint directory lock '{ro}/tutti.lock' failed")
    root = os.path.join(ckpt_dir, "ckpt")
    _save_fails_while_replaced(world, ckpt_dir, lambda r: os.symlink(ro, r),
                               f"creating directory '{root}/step-00000002' failed")


# ---- preemption -------------------------------------------------------------------

def test_notice_on_one_rank_stops_every_rank(world, rank, size):
    with tutti.PreemptionMonitor(sources="none") as mon:
        assert mon.local() == tutti.NoticeKind.NONE and not mon.should_stop()
        if rank == size - 1:
            mon.notify(tutti.NoticeKind.STOP, "test", "maintenance")
        assert mon.should_stop() is True
        assert mon.agree() == tutti.NoticeKind.STOP
        if rank == size - 1:
            assert mon.notice()["source"] == "test"
    with tutti.PreemptionMonitor(sources="none", stop_on_rebalance=False) as mon:
        mon.notify(tutti.NoticeKind.REBALANCE, "test")
        assert mon.agree() == tutti.NoticeKind.REBALANCE and not mon.should_stop()


def test_signal_and_trigger_file(world, rank, size, ckpt_dir):
    trigger = os.path.join(ckpt_dir, f"preempt-{rank}")
    with tutti.PreemptionMonitor(sources="signals,file", trigger_file=trigger,
                                 poll_ms=20) as mon:
        assert set(mon.sources) == {"signals", "file"}
        if rank == 0:
            os.kill(os.getpid(), signal.SIGUSR1)  # what mpirun forwards
        deadline = time.time() + 5
        while rank == 0 and mon.local() != tutti.NoticeKind.STOP and time.time() < deadline:
            time.sleep(0.01)
        assert mon.should_stop()
    with tutti.PreemptionMonitor(sources="file", trigger_file=trigger, poll_ms=20) as mon:
        if rank == size - 1:
            open(trigger, "w").close()
        deadline = time.time() + 5
        while (rank == size - 1 and mon.local() != tutti.NoticeKind.STOP
               and time.time() < deadline):
            time.sleep(0.01)
        assert mon.should_stop()


class _FakeAws(http.server.BaseHTTPRequestHandler):
    def do_PUT(self):  # IMDSv2 token
        self._reply(200, b"token")

    def do_GET(self):
        if self.path.endswith("spot/instance-action"):
            self._reply(200, b'{"action": "terminate", "time": "2030-01-01T00:00:00Z"}')
        else:
            self._reply(404, b"")

    def _reply(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_aws_spot_notice_from_a_mock_metadata_server(world, rank, size):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeAws)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with tutti.PreemptionMonitor(sources="aws" if rank == 0 else "none", aws_url=url,
                                     poll_ms=20, http_timeout_ms=500) as mon:
            deadline = time.time() + 10
            while rank == 0 and mon.local() != tutti.NoticeKind.STOP and time.time() < deadline:
                time.sleep(0.02)
            if rank == 0:
                assert mon.notice()["source"] == "aws"
                assert "terminate" in mon.notice()["detail"]
            assert mon.should_stop()
    finally:
        server.shutdown()


# ---- tutti.torch.checkpoint ---------------------------------------------------------

def _training(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.3),
                                torch.nn.Linear(16, 2))
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.topk(ratio=0.25))
    scaler = hvd.LossScaler(init_scale=256.0, growth_interval=3)
    return model, opt, scaler


def _steps(model, opt, scaler, begin, end, rank):
    for step in range(begin, end):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)
        opt.zero_grad()
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        torch.rand(3)  # the RNG stream moves on, as dropout and shuffles do


def test_torch_training_resumes_bit_exactly(world, rank, size, ckpt_dir):
    hvd.init()
    mgr = tutti.CheckpointManager(world, ckpt_dir, keep_last=3)
    model, opt, scaler = _training(seed=1)
    hvd.broadcast_parameters(model.state_dict(), 0)
    torch.manual_seed(50 + rank)
    _steps(model, opt, scaler, 0, 4, rank)
    hvd.checkpoint.save(mgr, 4, model=model, optimizer=opt, scaler=scaler,
                        data_position={"epoch": 0, "batch": 4}, metadata={"note": "x"})
    _steps(model, opt, scaler, 4, 8, rank)
    expect = [p.detach().clone() for p in model.parameters()]
    expect_scale = scaler.get_scale()
    # A fresh process's objects: other weights, no optimizer state, other RNG.
    model2, opt2, scaler2 = _training(seed=2)
    torch.manual_seed(999)
    res = hvd.checkpoint.load(mgr, model=model2, optimizer=opt2, scaler=scaler2)
    assert res["step"] == 4 and res["data_position"] == {"epoch": 0, "batch": 4}
    assert res["metadata"] == {"note": "x"} and res["skipped"] == []
    _steps(model2, opt2, scaler2, 4, 8, rank)
    for p, q in zip(model2.parameters(), expect):
        assert torch.equal(p, q)
    assert scaler2.get_scale() == expect_scale
    assert opt2.param_groups[0]["betas"] == opt.param_groups[0]["betas"]
    mgr.close()


def test_decide_saves_now_on_a_rebalance_and_stops_on_a_stop(world, rank, size):
    A = tutti.checkpoint.PreemptionAction
    with tutti.PreemptionMonitor(sources="none", stop_on_rebalance=False) as mon:
        assert mon.decide() == A.CONTINUE
        if rank == 0:
            mon.notify(tutti.NoticeKind.REBALANCE, "test")
        assert mon.decide(world) == A.SAVE_NOW  # every rank, the same call
        assert mon.decide() == A.CONTINUE       # once per monitor
        if rank == size - 1:
            mon.notify(tutti.NoticeKind.STOP, "test")
        assert mon.decide() == A.STOP and mon.should_stop()


def _tree(path):
    return sorted(os.listdir(path))


def test_read_only_load_resume_false_changes_nothing(world, rank, size, ckpt_dir):
    mgr = tutti.CheckpointManager(world, ckpt_dir, keep_last=5)
    w = np.zeros(3, np.float32)
    for step in (1, 2):
        w[:] = step
        mgr.save(step, {"m": {"w": w}})
    mgr.wait()
    world.barrier()
    before = _tree(ckpt_dir)
    res = mgr.load({"m": {"w": w}}, step=1, resume=False)
    assert res["step"] == 1 and w.tolist() == [1.0] * 3
    world.barrier()
    assert _tree(ckpt_dir) == before, "a read-only load renamed or removed something"
    res = mgr.load({"m": {"w": w}}, step=1)  # resume=True: step 2 is abandoned
    world.barrier()
    assert "abandoned-step-00000002" in _tree(ckpt_dir)
    assert [c["step"] for c in mgr.list() if c["complete"]] == [1]
    mgr.close()


def test_fresh_start_and_permission_options(world, rank, size, ckpt_dir):
    F = tutti.checkpoint.FreshStart
    assert {F.FROM_SETTING, F.AUTO, F.ALLOW, F.REFUSE} == set(F.__members__.values())
    empty = os.path.join(ckpt_dir, "empty")
    with tutti.CheckpointManager(world, empty, fresh_start=F.REFUSE) as mgr:
        with pytest.raises(tutti.CheckpointError, match="history was expected"):
            mgr.load({"m": {"w": np.zeros(1)}})
    with tutti.CheckpointManager(world, empty, fresh_start=F.ALLOW) as mgr:
        assert mgr.load({"m": {"w": np.zeros(1)}}) is None
    modes = os.path.join(ckpt_dir, "modes")
    old = os.umask(0o022)
    try:
        with tutti.CheckpointManager(world, modes, file_mode=0o640, dir_mode=0o750,
                                     async_save=False) as mgr:
            mgr.save(1, {"m": {"w": np.ones(2)}})
            step_dir = mgr.list()[-1]["path"]
    finally:
        os.umask(old)
    world.barrier()
    assert os.stat(step_dir).st_mode & 0o777 == 0o750
    shard = [f for f in os.listdir(step_dir) if f.endswith(".safetensors")][0]
    assert os.stat(os.path.join(step_dir, shard)).st_mode & 0o777 == 0o640
    assert os.stat(os.path.join(step_dir, "manifest.json")).st_mode & 0o777 == 0o640


def test_per_rank_dict_tensors_and_the_rng_after_a_resize(world, rank, size, ckpt_dir):
    """Per-rank tensors come back as each rank's own row; saved by k = size - 1
    ranks and loaded by all, tutti.torch restores rank r's RNG where the saving
    job had a rank r and reseeds the new rank from (step, rank)."""
    if size < 2:
        pytest.skip("needs two ranks")
    k = size - 1
    sub = world.split(0 if rank < k else -1, rank, "savers")
    expect_rng = None
    if sub is not None:
        torch.manual_seed(1000 + rank)
        expect_rng = torch.get_rng_state().clone()
        blob = hvd.checkpoint._rng_blob()
        with tutti.CheckpointManager(sub, ckpt_dir, async_save=False) as mgr:
            mine = np.full(3, rank + 1, np.float32)
            mgr.save(7, {"pr": {"v": (mine, {"per_rank": True})},
                         "rng": {"state": (blob, {"global_shape": [k, hvd.checkpoint.RNG_BYTES],
                                                  "dim": 0, "offset": rank})}})
            mine[:] = 0
            mgr.load({"pr": {"v": (mine, {"per_rank": True})}})
            assert mine.tolist() == [rank + 1.0] * 3  # its own row, not rank 0's
    world.barrier()
    torch.manual_seed(5)  # a fresh process's state
    with tutti.CheckpointManager(world, ckpt_dir) as mgr:
        v = np.zeros(3, np.float32)
        with pytest.raises(tutti.MismatchError, match=f"per-rank state of {k} ranks"):
            mgr.load({"pr": {"v": (v, {"per_rank": True})}}, resume=False)
        res = mgr.load({"pr": {"v": (v, {"per_rank": True})}}, optional=["pr/"], resume=False)
        assert res["skipped"] == ["pr/v"] and v.tolist() == [0.0] * 3
        with pytest.warns(RuntimeWarning, match="reseeded") if rank >= k else _no_warning():
            res = hvd.checkpoint.load(mgr)
    assert res["step"] == 7 and res["saved_world_size"] == k
    if rank < k:
        assert torch.equal(torch.get_rng_state(), expect_rng)
    else:
        assert torch.initial_seed() == hvd.checkpoint.rng_seed(7, rank)


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
