"""Checkpoint shards are ordinary safetensors files: the real `safetensors`
library reads what tutti writes (values, dtypes, shapes, metadata,
checksums), and tutti's parser reads what the library writes.

usage: safetensors_interop.py PROBE MPIEXEC NP
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import load_file, save_file
from safetensors.torch import load_file as torch_load_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from xxh64 import xxh64  # noqa: E402

PROBE, MPIEXEC, NP = sys.argv[1], sys.argv[2], int(sys.argv[3])
DTYPES = ["float32", "float16", "bfloat16", "float64", "int8", "uint8", "int32", "int64"]
SIZES = [0, 1, 7, 1000]
NP_DTYPE = {"float32": np.float32, "float16": np.float16, "float64": np.float64,
            "int8": np.int8, "uint8": np.uint8, "int32": np.int32, "int64": np.int64}
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


def blob_value(seed, tensor, i, dtype):
    """Mirror of tests/checkpoint/ckpt_test_util.cc blob_value()."""
    v = (seed * 1000003 + tensor * 7919 + i * 31) % 101 - 50
    return v + 50 if dtype == "uint8" else v


def expected(step, rank, dtype_index, size_index):
    k = dtype_index * len(SIZES) + size_index
    seed = step * 100 + rank
    return [blob_value(seed, k, i, DTYPES[dtype_index]) for i in range(SIZES[size_index])]


def run(args, env=None, **kw):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", str(NP),
                           PROBE] + args, check=True, capture_output=True, text=True,
                          timeout=120, env=e, **kw)


def read_shard(ck, manifest, rank, bf16):
    """Checks shard `rank` against its manifest record; returns (tensors,
    __metadata__, header, raw bytes)."""
    path = os.path.join(ck, "rank-%05d.safetensors" % rank)
    raw = open(path, "rb").read()
    rec = [r for r in manifest["shards"] if r["rank"] == rank][0]
    hlen = int.from_bytes(raw[:8], "little")
    check(rec["bytes"] == len(raw), f"rank {rank}: manifest size")
    check(int(rec["header_xxh64"], 16) == xxh64(raw[:8 + hlen]), f"rank {rank}: header checksum")
    check((8 + hlen) % 8 == 0, "data region 8-byte aligned")
    tensors = torch_load_file(path) if bf16 else load_file(path)
    with safe_open(path, framework="np" if not bf16 else "pt") as f:
        meta = f.metadata()
    check(meta["tutti.step"] == str(manifest["step"]) and meta["tutti.rank"] == str(rank),
          f"rank {rank}: shard metadata {meta.get('tutti.step')}")
    return tensors, meta, json.loads(raw[8:8 + hlen]), raw[8 + hlen:]


def values(t, bf16):
    return t.float().tolist() if bf16 else t.astype(np.float64).tolist()


def check_tensor(name, t, meta, header, data, want, dt, bf16, facts):
    """One stored piece: values, dtype, its checksum (recomputed), its facts."""
    check(values(t, bf16) == [float(v) for v in want], f"{name}: values differ")
    extra = json.loads(meta["tutti.tensor." + name])
    b, e = header[name]["data_offsets"]
    check(int(extra["xxh64"], 16) == xxh64(data[b:e]), f"{name} checksum")
    check(all(extra[k] == v for k, v in facts.items()), f"{name} shard facts {extra}")
    if not bf16:
        check(t.dtype == NP_DTYPE[dt], f"{name} dtype {t.dtype}")
    else:
        check(str(t.dtype) == "torch." + dt, f"{name} dtype {t.dtype}")
    return int(extra["xxh64"], 16)


def tutti_written(tmp):
    """Rank-distinct values in tensors declared replicated: the per-rank
    layout (manifest version 2) puts every tensor in every rank's shard; the
    once layout (version 3) finds that the copies differ and lets every rank
    write its own, except the empty tensors, which are identical: rank 0
    writes those once."""
    step = 4
    for layout in ("per-rank", "once"):
        for bf16 in (False, True):
            d = os.path.join(tmp, layout + ("-bf16" if bf16 else "-numpy"))
            run(["save", "--dir", d, "--from", str(step), "--to", str(step)] +
                ([] if bf16 else ["--no-bf16"]), env={"TUTTI_CKPT_LAYOUT": layout})
            ck = os.path.join(d, "step-%08d" % step)
            manifest = json.load(open(os.path.join(ck, "manifest.json")))
            check(manifest["step"] == step and manifest["world_size"] == NP, "manifest step/world")
            check(manifest["version"] == (3 if layout == "once" else 2), f"{layout}: version")
            check(json.loads(json.dumps(manifest["metadata"])) == {"step": step}, "manifest metadata")
            check([r["rank"] for r in manifest["shards"]] == list(range(NP)),
                  f"{layout}: every rank wrote a shard")
            shards = {r: read_shard(ck, manifest, r, bf16) for r in range(NP)}
            for di, dt in enumerate(DTYPES):
                if dt == "bfloat16" and not bf16:
                    continue
                for si, n in enumerate(SIZES):
                    name = "blob/t%d_%s" % (di * len(SIZES) + si, dt)
                    holders = range(NP) if layout == "per-rank" or n > 0 else [0]
                    for rank in range(NP):
                        tensors, meta, header, data = shards[rank]
                        check((name in tensors) == (rank in holders),
                              f"{layout}: {name} in rank {rank}'s shard: {name in tensors}")
                        if name not in tensors:
                            continue
                        check(list(tensors[name].shape) == [n], f"{name} shape")
                        h = check_tensor(name, tensors[name], meta, header, data,
                                         expected(step, rank, di, si), dt, bf16,
                                         {"global_shape": [n], "dim": -1, "flat": False,
                                          "group": "world"})
                        if layout == "once":
                            pieces = manifest["tensors"][name]["pieces"]
                            mine = [p for p in pieces if p[0] == rank]
                            check(len(pieces) == len(holders) and len(mine) == 1 and
                                  mine[0][4] is None and int(mine[0][3], 16) == h,
                                  f"{name}: index pieces {pieces}")


def replicated_once(tmp):
    """The same values on every rank, 1 MiB chunks: each tensor is stored
    once; the 3,000,240 bytes are cut into 2 ranges (whole 1 MiB chunks), so
    min(NP, 2) ranks write, and a safetensors reader rebuilds every tensor
    from the pieces the manifest's index names."""
    step = 6
    sizes = [0, 1, 7, 100000]
    d = os.path.join(tmp, "replicated")
    run(["save", "--dir", d, "--from", str(step), "--to", str(step), "--replicated",
         "--sizes", ",".join(map(str, sizes))], env={"TUTTI_CKPT_CHUNK_MB": "1"})
    ck = os.path.join(d, "step-%08d" % step)
    manifest = json.load(open(os.path.join(ck, "manifest.json")))
    total = sum(sizes) * sum(np.dtype(t).itemsize if t != "bfloat16" else 2 for t in DTYPES)
    check(total == 3000240, f"total {total}")
    writers = min(NP, total // 2 ** 20)
    check([r["rank"] for r in manifest["shards"]] == list(range(writers)),
          f"writers {[r['rank'] for r in manifest['shards']]}, expected {writers}")
    check(sum(r["data_bytes"] for r in manifest["shards"]) == total, "bytes written once")
    shards = {r["rank"]: read_shard(ck, manifest, r["rank"], True) for r in manifest["shards"]}
    for di, dt in enumerate(DTYPES):
        for si, n in enumerate(sizes):
            name = "blob/t%d_%s" % (di * len(sizes) + si, dt)
            want = [float(blob_value(step * 100, di * len(sizes) + si, i, dt)) for i in range(n)]
            got = [None] * n
            for shard, b, e, h, place in manifest["tensors"][name]["pieces"]:
                tensors, meta, header, data = shards[shard]
                off = 0 if place is None else place["flat"]
                piece = values(tensors[name], True)
                check(int(h, 16) == xxh64(data[b:e]), f"{name}: piece checksum")
                got[off:off + len(piece)] = piece
            check(got == want, f"{name}: rebuilt from its pieces differs")


def library_written(tmp):
    path = os.path.join(tmp, "lib.safetensors")
    arrays = {
        "scalar": np.array(3.5, dtype=np.float64),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "m": np.arange(12, dtype=np.int32).reshape(3, 4),
        "h": np.linspace(-2, 2, 9).astype(np.float16),
        "u": np.arange(5, dtype=np.uint8),
        "i8": np.array([-128, 127], dtype=np.int8),
        "l": np.array([2 ** 40, -5], dtype=np.int64),
    }
    save_file(arrays, path, metadata={"format": "np", "note": "written by safetensors"})
    raw = open(path, "rb").read()
    hlen = int.from_bytes(raw[:8], "little")
    out = subprocess.run([PROBE, "inspect", path], capture_output=True, text=True, check=True)
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    meta = lines[-1]["__metadata__"]
    check(meta == {"format": "np", "note": "written by safetensors"}, f"metadata {meta}")
    seen = {x["name"]: x for x in lines[:-1]}
    header = json.loads(raw[8:8 + hlen])
    check(set(seen) == set(arrays), f"names {sorted(seen)}")
    for name, a in arrays.items():
        got = seen.get(name, {})
        check(got.get("shape") == list(a.shape), f"{name} shape {got.get('shape')}")
        check(got.get("dtype") == header[name]["dtype"], f"{name} dtype")
        check(got.get("data_offsets") == header[name]["data_offsets"], f"{name} offsets")
        check(int(got.get("xxh64", "0"), 16) == xxh64(a.tobytes()), f"{name} checksum")
    # The parser rejects a file whose header was tampered with.
    bad = bytearray(raw)
    bad[8 + hlen - 3:8 + hlen] = b"}}}"
    open(path, "wb").write(bytes(bad))
    out = subprocess.run([PROBE, "inspect", path], capture_output=True, text=True)
    check(out.returncode == 2 and "REJECTED" in out.stdout, "tampered header accepted")


with tempfile.TemporaryDirectory(prefix="tutti-interop-") as tmp:
    tutti_written(tmp)
    replicated_once(tmp)
    library_written(tmp)
if failures:
    print(f"{len(failures)} failures")
    sys.exit(1)
print("PASS: safetensors reads tutti shards and tutti reads safetensors files")
