"""tutti-run's host probes are bounded (--probe-concurrency): at a thousand
hosts an agent process per host at once would exhaust file descriptors and
processes.  A fake agent records how many of it run at once; 40 hosts probed
with a bound of 6 must never have more than 6 agents alive, must use them
(6 at once at some point), must answer every host, and reports the time it
took (not asserted: a loaded machine stretches it).  Then the same through the
background pool a running elastic job uses, and the option's validation.
usage: probe_pool_test.py SCRIPTS_DIR"""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, sys.argv[1])
from tutti_run import cli, hosts as H  # noqa: E402
from tutti_run.runner import Runner  # noqa: E402

AGENT = textwrap.dedent("""\
    #!/usr/bin/env python3
    import fcntl, json, os, sys, time
    state = os.environ["PROBE_POOL_STATE"]
    def update(delta):
        with open(state + ".lock", "a") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            s = json.load(open(state)) if os.path.exists(state) else {"running": 0, "max": 0, "calls": 0}
            s["running"] += delta
            s["max"] = max(s["max"], s["running"])
            s["calls"] += delta > 0
            json.dump(s, open(state, "w"))
    update(1)
    time.sleep(0.3)
    update(-1)
    sys.exit(255 if sys.argv[1].startswith("bad") else 0)
""")

failures = []


def check(what, ok):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)


with tempfile.TemporaryDirectory() as d:
    agent = os.path.join(d, "agent.py")
    with open(agent, "w") as f:
        f.write(AGENT)
    os.chmod(agent, 0o755)
    state = os.path.join(d, "state.json")
    os.environ["PROBE_POOL_STATE"] = state
    names = [f"node{i:03d}" for i in range(37)] + ["bad0", "bad1", "bad2"]

    t0 = time.monotonic()
    result = H.probe(names, [agent], timeout=10, local=set(), concurrency=6)
    took = time.monotonic() - t0
    s = json.load(open(state))
    check(f"at most 6 agents at once (saw {s['max']})", s["max"] <= 6)
    check(f"the bound is used: 6 at once at some point (saw {s['max']})", s["max"] == 6)
    check(f"every host probed once ({s['calls']} calls for {len(names)} hosts)", s["calls"] == len(names))
    check("reachable hosts answer, bad ones carry the agent's status",
          all(result[n] is None for n in names[:37]) and
          all(result[n] and "exited with 255" in result[n] for n in names[37:]))
    # Not a timed assertion (a loaded machine stretches it): for the record.
    print(f"note: {len(names)} probes of 0.3 s, 6 at a time, took {took:.2f} s")

    # The background pool of a running elastic job (Runner.probe_in_background).
    os.remove(state)
    opts, rest = cli.parse_args(["--min-np", "1", "--max-np", "64", "--probe-concurrency", "4",
                                 "--probe-command", agent, "--hostfile", os.path.join(d, "hf"),
                                 "--elastic-dir", d, "true"])
    r = Runner(opts, rest)
    for n in names[:20]:
        r.probe_in_background(n)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with r.lock:
            if len(r.answered) == 20:
                break
        time.sleep(0.05)
    s = json.load(open(state))
    check(f"background probes: at most 4 agents at once (saw {s['max']}), all 20 answered "
          f"({len(r.answered)})", s["max"] <= 4 and len(r.answered) == 20)

    # Validation.
    p = subprocess.run([sys.executable, os.path.join(sys.argv[1], "tutti-run"), "--probe-concurrency",
                        "0", "true"], capture_output=True, text=True)
    check("--probe-concurrency 0 is refused with the reason",
          p.returncode != 0 and "--probe-concurrency must be >= 1" in p.stderr + p.stdout)

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("PASS: bounded host probes")
