#!/usr/bin/env python3
"""The main job: a data-parallel training run that survives a spot
interruption, end to end on this machine.

  1. a mock AWS instance-metadata service (IMDSv2) on 127.0.0.1;
  2. `tutti-run -np N dp_train ...`: compressed all-reduce, float16 loss
     scaling, asynchronous checkpoints, preemption sources signals + file + aws;
  3. mid-run the mock endpoint starts announcing a spot interruption: every
     rank agrees at the next step boundary, commits a checkpoint and exits
     with 75; tutti-run restarts the job, which resumes from that checkpoint;
  4. an uninterrupted reference run of the same job;
  5. the summary table, the loss curve (PNG) with the interruption marked,
     and the check that both runs end with bit-identical parameters.

With --elastic, the job shrinks and grows back instead (scripts/demo_elastic.py):
tutti-run --min-np N/2 --max-np N with a discovery script, a spot notice that
takes half the slots away, a replacement host that brings them back, and a
goodput summary.

Run through scripts/demo.sh (which installs and builds first).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import demo_report  # noqa: E402


def say(msg):
    print(f"\033[1m[demo]\033[0m {msg}", flush=True)


def start_mock(out):
    port_file = os.path.join(out, "aws.port")
    notice = os.path.join(out, "aws.notice")
    for f in (port_file, notice):
        if os.path.exists(f):
            os.remove(f)
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tests/preemption/mock_metadata.py"), "aws",
         "--port-file", port_file, "--notice-file", notice, "--lifetime", "900",
         "--log", os.path.join(out, "aws-requests.jsonl")])
    deadline = time.time() + 20
    while not os.path.exists(port_file) or not open(port_file).read().strip():
        if time.time() > deadline or proc.poll() is not None:
            proc.kill()
            sys.exit("demo: the mock metadata server did not start")
        time.sleep(0.05)
    return proc, int(open(port_file).read().strip()), notice


def follow(log, notice, notice_step, state):
    """Issues the spot notice once training passes `notice_step`, and
    withdraws it once the job has saved and exited, so the restarted job runs
    to the end (a real replacement instance gets no notice either)."""
    for rec in demo_report.follow_records(log, state):
        if "step" in rec and "event" not in rec and not state["issued"] \
                and rec["step"] >= notice_step:
            open(notice, "w").write("terminate\n")
            state["issued"] = True
            say(f"the mock AWS metadata endpoint now announces a spot interruption "
                f"(training is at step {rec['step']})")
        if rec.get("event") == "exit" and state["issued"] and os.path.exists(notice):
            os.remove(notice)
            say("job saved and exited with 75; tutti-run restarts it on a 'new instance'")


def train(args, out, name, env, extra_env, log, final, ckpt):
    for p in (log, final):
        if os.path.exists(p):
            os.remove(p)
    shutil.rmtree(ckpt, ignore_errors=True)
    cmd = [os.path.join(ROOT, "scripts/tutti-run"), "--max-restarts", "2", "--",
           "--oversubscribe", "--bind-to", "none", "-np", str(args.np),
           os.path.join(args.build, "examples/dp_train/dp_train"),
           "--steps", str(args.steps), "--ckpt-dir", ckpt, "--ckpt-every", str(args.ckpt_every),
           "--log", log, "--final", final, "--log-every", str(args.log_every),
           "--compression", args.compression, "--step-sleep-ms", str(args.step_sleep_ms)]
    e = dict(env)
    e.update(extra_env)
    say(f"{name}: {' '.join(cmd[:1] + ['...'] + cmd[cmd.index('-np'):cmd.index('-np') + 3])} "
        f"dp_train --steps {args.steps} --compression {args.compression}")
    return subprocess.call(cmd, env=e)


def timeline(out):
    """Merges the spot run's per-rank traces (both runs of the job) and
    renders rank 0's steps; returns the merged trace."""
    merged, png = os.path.join(out, "timeline.json"), os.path.join(out, "timeline.png")
    subprocess.check_call([sys.executable, os.path.join(ROOT, "scripts/timeline_merge.py"),
                           os.path.join(out, "timeline") + "/", "-o", merged])
    subprocess.check_call([sys.executable, os.path.join(ROOT, "scripts/timeline_png.py"), merged,
                           "-o", png, "--rank", "0"])
    say(f"timeline: {merged} (open it in https://ui.perfetto.dev or chrome://tracing), "
        f"steps of rank 0: {png}")
    return merged


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--ckpt-every", type=int, default=25)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--compression", help="default powersgd; fp16 with --elastic (the "
                    "error-feedback residuals of powersgd do not follow a change of size yet)")
    ap.add_argument("--notice-at", type=float, help="fraction of the run (default 0.45; "
                    "0.3 with --elastic)")
    ap.add_argument("--elastic", action="store_true",
                    help="shrink to --np/2 ranks on a notice, grow back to --np")
    ap.add_argument("--grow-after", type=int, default=60,
                    help="--elastic: steps at the small size before a host joins")
    ap.add_argument("--losses-s", type=float, default=40,
                    help="--elastic: seconds per path of the spot-loss scene (two killed "
                         "ranks, restart path against in-process recovery); 0: skip it")
    ap.add_argument("--step-sleep-ms", type=int, default=20)
    ap.add_argument("--timeline", action="store_true",
                    help="record the spot run with TUTTI_TIMELINE: demo-out/timeline.json "
                         "(Perfetto / chrome://tracing), timeline.png, and the overlap in the summary")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "demo-out"))
    args = ap.parse_args()
    if args.compression is None:
        args.compression = "fp16" if args.elastic else "powersgd"
    if args.notice_at is None:
        args.notice_at = 0.3 if args.elastic else 0.45
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OPENBLAS_NUM_THREADS": "1", "TUTTI_RESTART_BACKOFF_S": "1",
                "TUTTI_PREEMPT_POLL_MS": "200"})
    if args.elastic:
        import demo_elastic
        demo_elastic.run(args, out, env, start_mock, say)
    # Every run starts from none of the files a previous run wrote here (only
    # those: --out may be a folder of the user's): the watcher below reads
    # train.jsonl, and an old log would make it issue the spot notice at once.
    for name in ("train.jsonl", "train-reference.jsonl", "final.json", "final-reference.json",
                 "preempt.trigger", "aws-requests.jsonl", "loss.png", "timeline.json",
                 "timeline.png"):
        if os.path.exists(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    for name in ("ckpt", "ckpt-reference", "timeline"):
        shutil.rmtree(os.path.join(out, name), ignore_errors=True)

    mock, port, notice = start_mock(out)
    say(f"mock AWS instance metadata (IMDSv2) on 127.0.0.1:{port}")
    log, ref_log = os.path.join(out, "train.jsonl"), os.path.join(out, "train-reference.jsonl")
    final, ref_final = os.path.join(out, "final.json"), os.path.join(out, "final-reference.json")
    state = {"stop": False, "issued": False}
    watcher = threading.Thread(target=follow, args=(log, notice, int(args.steps * args.notice_at), state),
                               daemon=True)
    watcher.start()
    traced = {"TUTTI_TIMELINE": os.path.join(out, "timeline") + "/"} if args.timeline else {}
    try:
        rc = train(args, out, "spot run", env,
                   {**traced, "TUTTI_PREEMPT_SOURCES": "signals,file,aws",
                    "TUTTI_AWS_METADATA_URL": f"http://127.0.0.1:{port}",
                    "TUTTI_PREEMPT_FILE": os.path.join(out, "preempt.trigger")},
                   log, final, os.path.join(out, "ckpt"))
        state["stop"] = True
        if rc != 0:
            sys.exit(f"demo: the interrupted run failed with exit code {rc}")
        rc = train(args, out, "reference run (no interruption)", env,
                   {"TUTTI_PREEMPT_SOURCES": "signals"}, ref_log, ref_final,
                   os.path.join(out, "ckpt-reference"))
        if rc != 0:
            sys.exit(f"demo: the reference run failed with exit code {rc}")
    finally:
        state["stop"] = True
        mock.terminate()
    a, b = json.load(open(final)), json.load(open(ref_final))
    report = []
    if args.timeline:
        report = ["--timeline", timeline(out)]
    print()
    subprocess.check_call([sys.executable, os.path.join(ROOT, "scripts/demo_report.py"), log,
                           "--reference", ref_log, "--png", os.path.join(out, "loss.png")] + report)
    same = a["hash"] == b["hash"]
    say(f"final parameters: interrupted run {a['hash']}, uninterrupted run {b['hash']}: "
        + ("bit-identical" if same else "DIFFERENT"))
    if not state["issued"]:
        sys.exit("demo: the run ended before the interruption was issued (raise --steps)")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
