"""Checkpoint costs per rank at several rank counts, asserted with counts.

usage: ckpt_scale.py PROBE MPIEXEC NP [NP ...]

Runs ckpt_scale_probe (one save, one load of 8 MiB of replicated model and
4 MiB of flat optimizer state, 1 MiB chunks) at each rank count and checks:
  * bytes written per save: the state's size exactly (model once, each
    optimizer piece once), independent of W; shard headers at most 8 KiB
    per file;
  * files opened per rank at load: at most 5 (its own shard, its share of
    the replicated chunks, the shards it verifies round-robin, and the
    manifest on rank 0), and bytes read in all at most 3x the state
    (verification before the agreement, then the copy; replicated bytes
    once per node, not once per rank);
  * commit messages per rank: 5 collective calls per save whatever W (two
    all-reduces electing the writers, the directory broadcast, the
    durability all-reduce, the outcome broadcast), and the reports' tree
    gather: rank 0 receives exactly 2 ceil(log2 W) messages, every other rank
    sends 2 and receives at most 2 ceil(log2 W); the maximum grows by at most
    2 per doubling of W;
  * the load: the same number of collective calls at every W, no point-to-
    point message, and one data broadcast in the node per stored chunk of
    the model: min(W, 8) (8 MiB in 1 MiB chunks), whatever the ranks.
Times are printed, never asserted (oversubscribed cores).
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

PROBE, MPIEXEC, NPS = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3:]]
MODEL, OPT = 8 << 20, 4 << 20
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg, flush=True)


def run(np_):
    tmp = tempfile.mkdtemp(prefix="tutti-scale-ckpt-")
    env = dict(os.environ, TUTTI_CKPT_CHUNK_MB="1")
    try:
        t0 = time.time()
        r = subprocess.run([MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", str(np_),
                            PROBE, os.path.join(tmp, "ckpt")], capture_output=True, text=True,
                           env=env, timeout=240)
        wall = time.time() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [json.loads(line[6:]) for line in r.stdout.splitlines() if line.startswith("SCALE ")]
    if r.returncode != 0 or len(rows) != np_:
        check(False, f"np {np_}: rc {r.returncode}, {len(rows)} rows\n{r.stdout}\n{r.stderr[-3000:]}")
    return sorted(rows, key=lambda x: x["rank"]), wall


table = []
load_collectives = None
for np_ in NPS:
    rows, wall = run(np_)
    if len(rows) != np_:
        continue
    log2w = math.ceil(math.log2(np_)) if np_ > 1 else 0
    check(all(r["ok"] for r in rows), f"np {np_}: a rank loaded wrong values")
    written = sum(r["written_bytes"] for r in rows)
    check(written == MODEL + OPT, f"np {np_}: {written} bytes written, expected {MODEL + OPT}")
    files = [r for r in rows if r["shard_file_bytes"] > 0]
    check(len(files) == np_, f"np {np_}: {len(files)} shards (every rank owns optimizer state)")
    headers = sum(r["shard_file_bytes"] for r in rows) - written
    check(0 < headers <= 8192 * len(files), f"np {np_}: {headers} header bytes in {len(files)} files")
    msgs = []
    for r in rows:
        check(r["save_collectives"] == 5, f"np {np_} rank {r['rank']}: {r['save_collectives']} "
              "collective calls in a save, expected 5")
        check(r["save_sent"] == (0 if r["rank"] == 0 else 2),
              f"np {np_} rank {r['rank']}: sent {r['save_sent']} messages")
        check(r["save_received"] <= 2 * log2w,
              f"np {np_} rank {r['rank']}: received {r['save_received']} > 2 ceil(log2 W)")
        msgs.append(r["save_sent"] + r["save_received"])
    check(rows[0]["save_received"] == 2 * log2w,
          f"np {np_}: rank 0 received {rows[0]['save_received']}, expected {2 * log2w}")
    opened = max(r["files_opened"] for r in rows)
    check(opened <= 5, f"np {np_}: a rank opened {opened} files at load")
    read = sum(r["bytes_read"] for r in rows)
    check(read <= 3 * (MODEL + OPT) + np_ * 65536, f"np {np_}: {read} bytes read in all")
    lc = rows[0]["load_collectives"]
    check(all(r["load_collectives"] == lc for r in rows), f"np {np_}: load collectives differ")
    if load_collectives is None:
        load_collectives = lc
    check(lc == load_collectives, f"np {np_}: {lc} load collectives, {load_collectives} at np {NPS[0]}")
    check(all(r["load_sent"] == 0 and r["load_received"] == 0 for r in rows),
          f"np {np_}: point-to-point messages in a load that succeeded")
    check(all(r["load_data_broadcasts"] == min(np_, MODEL >> 20) for r in rows),
          f"np {np_}: {[r['load_data_broadcasts'] for r in rows]} data broadcasts, expected "
          f"{min(np_, MODEL >> 20)} (one per stored chunk of the model)")
    table.append((np_, written, len(files), opened, sum(r["files_opened"] for r in rows), read,
                  max(msgs), rows[0]["save_collectives"], lc,
                  max(r["save_s"] for r in rows), max(r["load_s"] for r in rows), wall))

for a, b in zip(table, table[1:]):
    if b[0] == 2 * a[0]:
        check(b[6] - a[6] <= 2, f"commit messages per rank grew from {a[6]} to {b[6]} "
              f"between np {a[0]} and {b[0]}")

print(f"{'np':>3} {'bytes written':>13} {'shards':>6} {'max opened':>10} {'opened':>6} "
      f"{'bytes read':>11} {'p2p msgs':>8} {'save coll':>9} {'load coll':>9} "
      f"{'save s':>7} {'load s':>7} {'wall s':>6}")
for t in table:
    print(f"{t[0]:>3} {t[1]:>13} {t[2]:>6} {t[3]:>10} {t[4]:>6} {t[5]:>11} {t[6]:>8} "
          f"{t[7]:>9} {t[8]:>9} {t[9]:>7.3f} {t[10]:>7.3f} {t[11]:>6.1f}")
if failures:
    print(f"{len(failures)} failures")
    sys.exit(1)
print("PASS: checkpoint bytes, files and messages per rank within their bounds")
