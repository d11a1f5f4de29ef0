"""scripts/demo.sh --elastic: the job shrinks and grows back on this one
machine, under `tutti-run --min-np N/2 --max-np N`.

  1. the fleet is a discovery script that prints `localhost:<slots>` from a
     file the demo rewrites (a cloud's instance list would be the source);
  2. `tutti-run` starts dp_train at N ranks;
  3. a spot notice arrives from the mock AWS metadata endpoint; the job
     saves and exits with 75, and the demo takes the doomed host's N/2
     slots out of the fleet: tutti-run restarts at N/2 ranks, which resume
     from that checkpoint with the same global batch (twice the per-rank
     batch) and the next sample;
  4. later a replacement host joins (the fleet is back to N slots):
     tutti-run asks the job to save and exit (SIGUSR1) and restarts it at N;
  5. a reference run follows the same size schedule by plain restarts
     (mpirun ... --stop-at), and the summary reports goodput (launches.jsonl
     and the job's log), the counters that survived the restarts, and
     whether the parameters are bit-identical to the reference;
  6. spot losses without notice, side by side (--losses-s, 0: skipped):
     bench/spot/spot_trace.py runs a Horovod-elastic job (commits every
     step in the memory tier, no checkpoint directory) under tutti-run with
     two ranks SIGKILLed, once on the restart path (--ulfm off) and once
     with in-process recovery (Open MPI 5's --with-ft ulfm, tutti-run's
     default there), and prints the goodput table and each loss's time to
     the next completed step.

Called by demo.py (which owns the mock endpoint and the console output).
"""
import json
import os
import shutil
import subprocess
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import demo_report  # noqa: E402

FILES = ("train-elastic.jsonl", "samples-elastic.jsonl", "final-elastic.json",
         "final-elastic-reference.json", "fleet.txt", "discover.sh", "loss-elastic.png",
         "elastic-reference.log", "spot-losses.json")
DIRS = ("ckpt-elastic", "ckpt-elastic-reference", "elastic", "spot-losses")


def write_fleet(path, slots):
    with open(path + ".tmp", "w") as f:
        f.write(f"localhost:{slots}\n")
    os.replace(path + ".tmp", path)  # the discovery script never reads half a file


def follow(log, notice, fleet, args, state, say):
    """Drives the scenario from the job's log: the notice (and the host
    leaving the fleet) at --notice-at of the run; its withdrawal once the job
    exited; the replacement host after --grow-after steps at the small size."""
    small = args.np // 2
    notice_step = int(args.steps * args.notice_at)
    for rec in demo_report.follow_records(log, state):
        ev = rec.get("event")
        if ev is None and state["phase"] == 0 and rec["step"] >= notice_step:
            with open(notice, "w") as n:
                n.write("terminate\n")
            write_fleet(fleet, small)
            state["phase"] = 1
            say(f"step {rec['step']}: the mock AWS endpoint announces a spot interruption "
                f"of one host; the fleet loses its {args.np - small} slots "
                f"(discovery now prints localhost:{small})")
        elif ev == "exit" and state["phase"] == 1:
            if os.path.exists(notice):
                os.remove(notice)
            state["phase"] = 2
            say(f"the job saved step {rec['step']} and exited with 75; tutti-run restarts "
                f"it on the {small} slots left")
        elif ev == "resume" and state["phase"] == 2 and rec["world"] == small:
            state["phase"] = 3
            state["small_from"] = rec["step"]
        elif ev is None and state["phase"] == 3 and \
                rec["step"] >= state["small_from"] + args.grow_after:
            write_fleet(fleet, args.np)
            state["phase"] = 4
            say(f"step {rec['step']}: a replacement host joins the fleet (discovery prints "
                f"localhost:{args.np}); tutti-run will ask the job to save and exit, then "
                f"restart it at {args.np} ranks")
        elif ev == "resume" and state["phase"] == 4 and rec["world"] == args.np:
            state["phase"] = 5
            say(f"resumed at {args.np} ranks from step {rec['step']}")


def dp_train_args(args, out, ckpt, final):
    return [os.path.join(args.build, "examples/dp_train/dp_train"),
            "--steps", str(args.steps), "--global-batch", str(32 * args.np),
            "--ckpt-dir", ckpt, "--ckpt-every", str(args.ckpt_every),
            "--compression", args.compression, "--log-every", str(args.log_every),
            "--final", final]


def reference(args, out, env, schedule, say):
    """The same size schedule by plain restarts: mpirun -np W --stop-at S."""
    ckpt = os.path.join(out, "ckpt-elastic-reference")
    final = os.path.join(out, "final-elastic-reference.json")
    shutil.rmtree(ckpt, ignore_errors=True)
    segments = [(w, schedule[i + 1][0] - 1 if i + 1 < len(schedule) else None)
                for i, (_, w) in enumerate(schedule)]
    say("reference run, the same sizes at the same steps by plain restarts: " +
        " -> ".join(f"mpirun -np {w}" + (f" --stop-at {s}" if s else "") for w, s in segments))
    with open(os.path.join(out, "elastic-reference.log"), "w") as logf:
        for w, stop in segments:
            cmd = [os.environ.get("TUTTI_MPIRUN", "mpirun"), "--oversubscribe", "--bind-to", "none",
                   "-np", str(w)] + dp_train_args(args, out, ckpt, final)
            if stop:
                cmd += ["--stop-at", str(stop)]
            rc = subprocess.call(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT)
            if rc != 0:
                sys.exit(f"demo: the reference run failed with exit code {rc} "
                         f"(see {logf.name})")
    return json.load(open(final))


def spot_losses(args, out, env, say):
    """Scene 6: two killed ranks, restart path against in-process recovery
    (bench/spot/spot_trace.py).  Returns False when a mode that ran did not
    complete, or the in-process mode (where available) did not recover."""
    d = args.losses_s
    work, result = os.path.join(out, "spot-losses"), os.path.join(out, "spot-losses.json")
    shutil.rmtree(work, ignore_errors=True)
    events = f"kill@{d * 0.3:.0f},kill@{d * 0.65:.0f}"
    pythonpath = os.path.join(args.build, "python_pkg")
    cmd = [sys.executable, os.path.join(ROOT, "bench/spot/spot_trace.py"), "--duration", str(d),
           "--np", str(args.np), "--events", events, "--modes", "restart,inprocess",
           "--step-s", "0.3", "--params", str(1 << 18),
           "--mpirun", os.environ.get("TUTTI_MPIRUN", "mpirun"), "--python", sys.executable,
           "--pythonpath", pythonpath, "--work", work, "--out", result]
    say(f"spot losses without notice: {args.np} ranks, a rank SIGKILLed at "
        f"{d * 0.3:.0f} s and at {d * 0.65:.0f} s of {d} s, on the restart path "
        "(tutti-run --ulfm off) and with in-process recovery (--ulfm on): "
        "bench/spot/spot_trace.py " + " ".join(cmd[2:10]))
    rc = subprocess.call(cmd, env=dict(env, PYTHONPATH=pythonpath))
    if rc != 0:
        say(f"spot losses: spot_trace.py exited {rc}")
        return False
    res = json.load(open(result))
    ok = all(r.get("completed") for r in res["results"].values())
    inproc = res["results"].get("inprocess")
    if inproc is not None:
        costs = [e.get("next_step_s") for e in inproc["events"] if e.get("fired")]
        ok = ok and inproc.get("inprocess_recoveries", 0) >= 1
        restart = res["results"].get("restart", {})
        before = [e.get("next_step_s") for e in restart.get("events", []) if e.get("fired")]
        fmt = lambda xs: ", ".join("—" if x is None else f"{x:.2f} s" for x in xs)
        say(f"a killed rank cost {fmt(costs)} to the next completed step in-process "
            f"({inproc.get('inprocess_recoveries', 0)} recoveries, {inproc.get('restarts', 0)} "
            f"restarts), against {fmt(before)} on the restart path")
    else:
        say("in-process recovery not available here: "
            f"{res['unavailable'].get('inprocess', '?')} (docs/elastic.md)")
    return ok


def run(args, out, env, start_mock, say):
    if args.np < 2 or args.np % 2:
        sys.exit("demo --elastic: --np must be even and at least 2 (it shrinks to half)")
    for name in FILES:
        if os.path.exists(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    for name in DIRS:
        shutil.rmtree(os.path.join(out, name), ignore_errors=True)
    fleet, discover = os.path.join(out, "fleet.txt"), os.path.join(out, "discover.sh")
    write_fleet(fleet, args.np)
    with open(discover, "w") as f:
        f.write(f"#!/bin/sh\n# Horovod's discovery contract: host:slots per line.\ncat '{fleet}'\n")
    os.chmod(discover, 0o755)
    mock, port, notice = start_mock(out)
    say(f"mock AWS instance metadata (IMDSv2) on 127.0.0.1:{port}; the fleet: {discover} "
        f"prints localhost:{args.np}")
    log, samples = os.path.join(out, "train-elastic.jsonl"), os.path.join(out, "samples-elastic.jsonl")
    final, ckpt = os.path.join(out, "final-elastic.json"), os.path.join(out, "ckpt-elastic")
    elastic_dir = os.path.join(out, "elastic")
    env = dict(env)
    env.update({"TUTTI_PREEMPT_SOURCES": "signals,file,aws",
                "TUTTI_AWS_METADATA_URL": f"http://127.0.0.1:{port}",
                "TUTTI_PREEMPT_FILE": os.path.join(out, "preempt.trigger")})
    cmd = [os.path.join(ROOT, "scripts/tutti-run"), "--min-np", str(args.np // 2),
           "--max-np", str(args.np), "--host-discovery-script", discover,
           "--elastic-dir", elastic_dir, "--ckpt-dir", ckpt,
           # Short intervals: the grow must come within a few dozen steps
           # of the fleet growing, however fast the steps are.
           "--discovery-interval", "0.5", "--grow-interval", "1",
           "--leaving-ttl", "1", "--max-restarts", "2", "--",
           "--oversubscribe", "--bind-to", "none"] + dp_train_args(args, out, ckpt, final) + \
          ["--log", log, "--samples-log", samples, "--step-sleep-ms", str(args.step_sleep_ms)]
    say(f"elastic run: tutti-run --min-np {args.np // 2} --max-np {args.np} "
        f"--host-discovery-script discover.sh -- dp_train --steps {args.steps} "
        f"--global-batch {32 * args.np} --compression {args.compression}")
    state = {"stop": False, "phase": 0}
    watcher = threading.Thread(target=follow, args=(log, notice, fleet, args, state, say),
                               daemon=True)
    watcher.start()
    try:
        rc = subprocess.call(cmd, env=env)
    finally:
        state["stop"] = True
        mock.terminate()
    if rc != 0:
        sys.exit(f"demo: the elastic run failed with exit code {rc}")
    if state["phase"] < 5:
        sys.exit(f"demo: the run ended before the scenario finished (phase {state['phase']} of 5; "
                 f"raise --steps or lower --grow-after)")
    check = demo_report.check_samples(samples, args.steps, 32 * args.np)
    ref_env = dict(env, TUTTI_PREEMPT_SOURCES="signals")
    ref = reference(args, out, ref_env, check["schedule"], say)
    print()
    subprocess.check_call([sys.executable, os.path.join(ROOT, "scripts/demo_report.py"), log,
                           "--launches", os.path.join(elastic_dir, "launches.jsonl"),
                           "--final", final, "--samples", samples, "--steps", str(args.steps),
                           "--global-batch", str(32 * args.np),
                           "--png", os.path.join(out, "loss-elastic.png")])
    a = json.load(open(final))
    same = a["hash"] == ref["hash"]
    say(f"final parameters: elastic run {a['hash']}, same schedule by plain restarts "
        f"{ref['hash']}: " + ("bit-identical" if same else "DIFFERENT"))
    losses_ok = spot_losses(args, out, env, say) if args.losses_s > 0 else True
    sys.exit(0 if same and check["ok"] and losses_ok else 1)
