#!/usr/bin/env bash
# Multi-node for real: two "hosts" (network namespaces joined by veth and a
# bridge, scripts/netns_cluster.sh), two ranks each, OpenMPI over TCP
# between them (ranks started through an rsh agent that enters each
# namespace).  Checks:
#   1. dp_train across 2 hosts x 2 ranks ends with the parameters the same
#      job has on one host (bit-identical hash);
#   2. killing one host's ranks mid-run makes mpirun fail the job, tutti-run
#      restarts it, it resumes from the newest checkpoint and ends with the
#      uninterrupted run's parameters.
# Exits 77 (ctest: skipped) where network namespaces cannot be created
# (not root, no iproute2/unshare, or a container without CAP_NET_ADMIN).
#
#   multinode_test.sh BUILD_DIR SOURCE_DIR MPIEXEC
set -euo pipefail
build=$1 src=$2 mpiexec=$3
cluster=$src/scripts/netns_cluster.sh
dp=$build/examples/dp_train/dp_train
prefix=mn$$
prefix=${prefix:0:8}
export TUTTI_NETNS_STATE=${TUTTI_NETNS_STATE:-/run/tutti-netns}

skip() { echo "SKIPPED: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root for network namespaces"
for t in ip tc unshare; do command -v $t >/dev/null || skip "no '$t'"; done
[[ -x $dp ]] || skip "dp_train not built"
work=$(mktemp -d "$build/multinode.XXXXXX")
cleanup() { "$cluster" down --prefix "$prefix" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
subnet=10.$((200 + RANDOM % 50)).$((RANDOM % 250))
# Creating the namespaces, bridge and veths is the capability probe.
"$cluster" up --prefix "$prefix" 2 --subnet "$subnet" > "$work/up.log" 2>&1 ||
  { cat "$work/up.log"; skip "cannot create network namespaces, bridges or veths here"; }
cat "$work/up.log"

hash_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["hash"])' "$1"; }

echo "== 1. 2 hosts x 2 ranks vs 1 host x 4 ranks"
args=(--steps 40 --compression powersgd --log-every 20)
"$cluster" run --prefix "$prefix" --per-host 2 -- "$dp" "${args[@]}" --final "$work/multi.json"
"$mpiexec" --oversubscribe --bind-to none -np 4 "$dp" "${args[@]}" --final "$work/single.json"
h_multi=$(hash_of "$work/multi.json") h_single=$(hash_of "$work/single.json")
echo "parameters: 2 hosts $h_multi, 1 host $h_single"
[[ $h_multi == "$h_single" ]] || { echo "FAIL: multi-host training differs from single-host"; exit 1; }

echo "== 2. kill host 1's ranks mid-run: tutti-run restarts, the job resumes"
steps=150
args=(--steps $steps --compression powersgd --ckpt-every 10 --step-sleep-ms 30 --log-every 50)
"$mpiexec" --oversubscribe --bind-to none -np 4 "$dp" "${args[@]}" \
  --final "$work/reference.json" > "$work/reference.log"
mapfile -t mpiopts < <("$cluster" mpiargs --prefix "$prefix" --per-host 2)
"$src/scripts/tutti-run" --max-restarts 2 --backoff 1 --mpirun "$mpiexec" -- \
  "${mpiopts[@]}" -np 4 "$dp" "${args[@]}" --ckpt-dir "$work/ckpt" \
  --log "$work/train.jsonl" --final "$work/killed.json" > "$work/killed.log" 2>&1 &
runner=$!
# Wait until step 40, then SIGKILL every dp_train in host 1's namespace.
killed=0
for _ in $(seq 600); do
  if [[ -f $work/train.jsonl ]] &&
     python3 - "$work/train.jsonl" <<'PY'
import json, sys
steps = [json.loads(l).get("step", 0) for l in open(sys.argv[1]) if l.strip().startswith("{")]
sys.exit(0 if steps and max(steps) >= 40 else 1)
PY
  then
    for pid in $(ip netns pids "${prefix}1"); do
      [[ $(cat /proc/$pid/comm 2>/dev/null) == dp_train ]] && kill -9 "$pid" && killed=$((killed + 1))
    done
    break
  fi
  kill -0 $runner 2>/dev/null || break
  sleep 0.1
done
rc=0
wait $runner || rc=$?
tail -5 "$work/killed.log"
echo "killed $killed ranks on host 1; tutti-run exit $rc"
[[ $killed -ge 1 ]] || { echo "FAIL: found no rank to kill"; cat "$work/killed.log"; exit 1; }
[[ $rc -eq 0 ]] || { echo "FAIL: the restarted job did not finish"; cat "$work/killed.log"; exit 1; }
grep -q "restart" "$work/killed.log" || { echo "FAIL: tutti-run did not restart"; exit 1; }
h_killed=$(hash_of "$work/killed.json") h_ref=$(hash_of "$work/reference.json")
echo "parameters: killed and resumed $h_killed, uninterrupted $h_ref"
[[ $h_killed == "$h_ref" ]] || { echo "FAIL: resumed run differs from the uninterrupted one"; exit 1; }
echo "PASS"
