#!/usr/bin/env python3
"""TUTTI_TIMELINE end to end, with real processes (dp_train, np 2):

  on        every rank's file is a Chrome trace (JSON Array Format) with the
            expected events; bucket collectives carry their bytes in closed
            form; merge and PNG work
  preempt   a preemption notice, the coordinated save and exit_preempted
            (exit 75) under TUTTI_RESTART_COUNT=1: the files are
            rank<R>.restart1.json, closed, with the notice, the commit, the
            restart and compression encode/decode events
  off       TUTTI_TIMELINE unset: nothing is written
  sigkill   a rank killed with SIGKILL mid-run leaves a loadable trace

  timeline_test.py DP_TRAIN MPIEXEC SOURCE_DIR
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

DP_TRAIN, MPIEXEC, SRC = sys.argv[1:4]
sys.path.insert(0, os.path.join(SRC, "scripts"))
import timeline_trace as tt  # noqa: E402

WIDTHS = [8, 16, 4]
PARAMS = sum(a * b + b for a, b in zip(WIDTHS, WIDTHS[1:]))  # 212
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
            "int8": 1, "uint8": 1}
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def env(**extra):
    e = dict(os.environ)
    e.pop("TUTTI_TIMELINE", None)
    e.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
              "OPENBLAS_NUM_THREADS": "1", "TUTTI_PREEMPT_SOURCES": "signals",
              "TUTTI_FIRST_BUCKET_MB": "0"})
    e.update({k: str(v) for k, v in extra.items()})
    return e


def dp_train_cmd(work, steps, extra_args=(), np_=2, **extra_env):
    cmd = [MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", str(np_)]
    for k in list(extra_env) + ["TUTTI_PREEMPT_SOURCES", "TUTTI_FIRST_BUCKET_MB"]:
        cmd += ["-x", k]
    return cmd + [DP_TRAIN, "--steps", str(steps), "--widths", ",".join(map(str, WIDTHS)),
                  "--bucket-mb", "0.0005", "--learn-ratio", "0",
                  "--ckpt-dir", os.path.join(work, "ckpt"), "--ckpt-every", "2",
                  "--log-every", "100", *extra_args]


def dp_train(work, steps, extra_args=(), **extra_env):
    return subprocess.run(dp_train_cmd(work, steps, extra_args, **extra_env), cwd=work,
                          env=env(**extra_env), capture_output=True, text=True, timeout=120)


def kinds(events):
    return {(e.get("cat"), e["name"]) for e in events}


def check_on(work):
    base = os.path.join(work, "tl")
    r = dp_train(work, 4, ["--compression", "none"], TUTTI_TIMELINE=base)
    check(r.returncode == 0, f"dp_train with TUTTI_TIMELINE exits 0 (got {r.returncode}: {r.stderr[-2000:]})")
    files = tt.rank_files(base)
    check([os.path.basename(f) for f in files] == ["tl.rank0.json", "tl.rank1.json"],
          f"one file per rank: {files}")
    for rank, f in enumerate(files):
        text = open(f).read()
        check(text.rstrip().endswith("]"), f"{f}: closed at shutdown")
        ev = tt.load(f)
        problems = tt.validate(ev)
        check(not problems, f"{f}: Chrome trace-event format: {problems[:5]}")
        check({e["pid"] for e in ev} == {rank}, f"{f}: pid is the rank")
        names = {e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
        for track in ("compute", "comm world", "bucket 0", "checkpoint", "checkpoint writer"):
            check(track in names, f"{f}: track '{track}' is named ({sorted(names)})")
        check(any(e.get("name") == "process_name" and e["args"]["name"] == f"rank {rank}"
                  for e in ev), f"{f}: process named 'rank {rank}'")
        k = kinds(ev)
        for want in [("bucket", "fill"), ("bucket", "launch"), ("bucket", "allreduce"),
                     ("bucket", "ready"), ("comm", "agreement"), ("reducer", "synchronize"),
                     ("checkpoint", "snapshot"), ("checkpoint", "persist"),
                     ("checkpoint", "commit"), ("user", "forward_backward"),
                     ("meta", "timeline_start")]:
            check(want in k, f"{f}: has a {want} event")
        check(any(c == "comm" and n.startswith("enqueue ") for c, n in k), f"{f}: enqueue instants")
        colls = [e for e in ev if e.get("cat") == "comm" and e["ph"] == "X" and e["name"] != "agreement"]
        for e in colls:
            a = e["args"]
            if a["op"] in ("allreduce", "broadcast"):
                check(a["bytes"] == a["count"] * ITEMSIZE[a["dtype"]],
                      f"{f}: {e['name']}: bytes {a['bytes']} = count {a['count']} x {a['dtype']}")
            check(a["group"] and a["backend"] == "mpi" and a["seq"] >= 1, f"{f}: {e['name']} args {a}")
        buckets = [e for e in colls if tt.BUCKET.search(e["name"]) and e["args"]["op"] == "allreduce"]
        per_step = {}
        for e in buckets:
            per_step.setdefault(e["args"]["name"], []).append(e)
        steps = {len(v) for v in per_step.values()}
        check(steps == {4}, f"{f}: every bucket all-reduced once per step (4 steps): {steps}")
        one_step = sum(v[0]["args"]["bytes"] for v in per_step.values())
        dtype = buckets[0]["args"]["dtype"] if buckets else "float32"
        check(one_step == PARAMS * ITEMSIZE[dtype],
              f"{f}: the buckets of a step carry {PARAMS} params x {dtype} = "
              f"{PARAMS * ITEMSIZE[dtype]} bytes (got {one_step})")
        launches = [e["args"]["bytes"] for e in ev if e["name"] == "launch"]
        check(sorted(launches) == sorted(e["args"]["bytes"] for e in buckets),
              f"{f}: launch bytes match the bucket collectives")
        loss = [e for e in colls if e["name"] == "allreduce loss+bytes"]
        check(len(loss) == 4 and all(e["args"]["count"] == 2 for e in loss),
              f"{f}: 'loss+bytes' all-reduced once per step with 2 elements")
        ratio, c, m, hidden = tt.overlap(ev)
        check(ratio is not None and 0 <= ratio <= 1 and c > 0 and m > 0,
              f"{f}: overlap ratio {ratio} from compute {c} us, comm {m} us")
    merged = os.path.join(work, "merged.json")
    r = subprocess.run([sys.executable, os.path.join(SRC, "scripts/timeline_merge.py"), base,
                        "-o", merged], capture_output=True, text=True)
    check(r.returncode == 0, f"timeline_merge: {r.stdout}{r.stderr}")
    if r.returncode == 0:
        ev = tt.load(merged)
        check(tt.pids(ev) == [0, 1], f"merged trace has one process per rank: {tt.pids(ev)}")
        check(not tt.validate(ev), "the merged trace is a valid trace")
    png = os.path.join(work, "steps.png")
    r = subprocess.run([sys.executable, os.path.join(SRC, "scripts/timeline_png.py"), merged,
                        "-o", png, "--rank", "1"], capture_output=True, text=True)
    check(r.returncode == 0 and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n",
          f"timeline_png writes a PNG: {r.stdout}{r.stderr[-1500:]}")


def check_preempt(work):
    base = os.path.join(work, "tl") + "/"
    trigger = os.path.join(work, "stop-now")
    extra = dict(TUTTI_TIMELINE=base, TUTTI_RESTART_COUNT=1, TUTTI_PREEMPT_SOURCES="file",
                 TUTTI_PREEMPT_FILE=trigger, TUTTI_PREEMPT_POLL_MS=50,
                 TUTTI_CKPT_FRESH_START="allow")
    p = subprocess.Popen(dp_train_cmd(work, 400, ["--compression", "fp16", "--step-sleep-ms", "10"],
                                      **extra),
                         cwd=work, env=env(**extra), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    # The notice comes once training runs (a trigger file older than the
    # job is not a notice).
    first = os.path.join(base, "rank0.restart1.json")
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None and \
            (not os.path.exists(first) or b"forward_backward" not in open(first, "rb").read()):
        time.sleep(0.05)
    open(trigger, "w").write("test\n")
    out, _ = p.communicate(timeout=120)
    check(p.returncode == 75, f"a preempted dp_train exits 75 (got {p.returncode}: {out[-2000:]})")
    files = tt.rank_files(base)
    check([os.path.basename(f) for f in files] == ["rank0.restart1.json", "rank1.restart1.json"],
          f"restart files in the directory: {files}")
    for f in files:
        check(open(f).read().rstrip().endswith("]"), f"{f}: closed by exit_preempted")
        ev = tt.load(f)
        check(not tt.validate(ev), f"{f}: valid trace")
        k = kinds(ev)
        for want in [("preemption", "restart"), ("checkpoint", "commit"),
                     ("compression", "encode"), ("compression", "decode")]:
            check(want in k, f"{f}: has a {want} event")
        check(any(e.get("cat") == "preemption" and e["name"] not in ("restart",) for e in ev),
              f"{f}: the preemption notice is on the timeline")


def check_off(work):
    before = set(os.listdir(work))
    r = dp_train(work, 2, ["--compression", "none"])
    check(r.returncode == 0, f"dp_train without TUTTI_TIMELINE exits 0 ({r.stderr[-1500:]})")
    new = [n for n in set(os.listdir(work)) - before if n != "ckpt"]
    check(new == [], f"TUTTI_TIMELINE unset writes nothing: {new}")


def check_sigkill(work):
    base = os.path.join(work, "killed")
    p = subprocess.Popen([DP_TRAIN, "--steps", "100000", "--widths", "8,16,4", "--learn-ratio", "0",
                          "--log-every", "100000", "--step-sleep-ms", "5"],
                         cwd=work, env=env(TUTTI_TIMELINE=base, TUTTI_WORLD="local"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    f = base + ".rank0.json"
    deadline = time.time() + 30
    while time.time() < deadline and (not os.path.exists(f) or os.path.getsize(f) < 20000):
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    check(os.path.exists(f) and not open(f).read().rstrip().endswith("]"),
          "a SIGKILLed rank leaves an unterminated array")
    ev = tt.load(f)
    check(len(ev) > 20 and not tt.validate(ev),
          f"the SIGKILLed trace loads and is valid ({len(ev)} events)")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in (("on", check_on), ("preempt", check_preempt), ("off", check_off),
                         ("sigkill", check_sigkill)):
            work = os.path.join(tmp, name)
            os.makedirs(work)
            t0 = time.time()
            fn(work)
            print(f"{name}: {time.time() - t0:.1f} s", flush=True)
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("timeline_test: all checks passed")


if __name__ == "__main__":
    main()
