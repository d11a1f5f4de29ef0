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


def run(args, **kw):
    return subprocess.run([MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", str(NP),
                           PROBE] + args, check=True, capture_output=True, text=True,
                          timeout=120, **kw)


def tutti_written(tmp):
    step = 4
    for bf16 in (False, True):
        d = os.path.join(tmp, "bf16" if bf16 else "numpy")
        run(["save", "--dir", d, "--from", str(step), "--to", str(step)] +
            ([] if bf16 else ["--no-bf16"]))
        ck = os.path.join(d, "step-%08d" % step)
        manifest = json.load(open(os.path.join(ck, "manifest.json")))
        check(manifest["step"] == step and manifest["world_size"] == NP, "manifest step/world")
        check(json.loads(json.dumps(manifest["metadata"])) == {"step": step}, "manifest metadata")
        for rank in range(NP):
            path = os.path.join(ck, "rank-%05d.safetensors" % rank)
            raw = open(path, "rb").read()
            rec = manifest["shards"][rank]
            hlen = int.from_bytes(raw[:8], "little")
            check(rec["bytes"] == len(raw), f"rank {rank}: manifest size")
            check(int(rec["header_xxh64"], 16) == xxh64(raw[:8 + hlen]),
                  f"rank {rank}: header checksum")
            check((8 + hlen) % 8 == 0, "data region 8-byte aligned")
            tensors = torch_load_file(path) if bf16 else load_file(path)
            with safe_open(path, framework="np" if not bf16 else "pt") as f:
                meta = f.metadata()
            check(meta["tutti.step"] == str(step) and meta["tutti.rank"] == str(rank),
                  f"rank {rank}: shard metadata {meta.get('tutti.step')}")
            header = json.loads(raw[8:8 + hlen])
            for di, dt in enumerate(DTYPES):
                if dt == "bfloat16" and not bf16:
                    continue
                for si, n in enumerate(SIZES):
                    name = "blob/t%d_%s" % (di * len(SIZES) + si, dt)
                    check(name in tensors, f"rank {rank}: {name} missing")
                    if name not in tensors:
                        continue
                    t = tensors[name]
                    vals = (t.float().tolist() if bf16 else t.astype(np.float64).tolist())
                    check(list(t.shape) == [n], f"{name} shape {list(t.shape)}")
                    check(vals == [float(v) for v in expected(step, rank, di, si)],
                          f"rank {rank}: {name} values differ")
                    extra = json.loads(meta["tutti.tensor." + name])
                    b, e = header[name]["data_offsets"]
                    data = raw[8 + hlen + b:8 + hlen + e]
                    check(int(extra["xxh64"], 16) == xxh64(data), f"{name} checksum")
                    check(extra["global_shape"] == [n] and extra["dim"] == -1
                          and extra["flat"] is False and extra["group"] == "world",
                          f"{name} shard facts {extra}")
                    if not bf16:
                        check(t.dtype == NP_DTYPE[dt], f"{name} dtype {t.dtype}")
                    else:
                        check(str(t.dtype) == "torch." + dt, f"{name} dtype {t.dtype}")


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
    library_written(tmp)
if failures:
    print(f"{len(failures)} failures")
    sys.exit(1)
print("PASS: safetensors reads tutti shards and tutti reads safetensors files")
