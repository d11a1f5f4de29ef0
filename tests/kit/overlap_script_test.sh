#!/usr/bin/env bash
# scripts/gpu_overlap.sh (the overlap measurement a GPU session runs on its
# host, docs/gpu.md) end to end at its smallest: the rig, the calibration,
# one round of one iteration per phase of tutti's bench_dp and DDP's peer,
# the report.  The figures are not checked (one iteration on two busy cores
# is noise); that the script produces every part of its report is.  Exits
# 77 (skipped) without root, network namespaces or a Python with torch.
#
#   overlap_script_test.sh BUILD_DIR SOURCE_DIR PYTHON
set -euo pipefail
build=$1 src=$2 python=${3:-}
skip() { echo "SKIPPED: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root for network namespaces"
for t in ip tc unshare; do command -v $t >/dev/null || skip "no '$t'"; done
[[ -n $python ]] && "$python" -c "import torch.distributed as d; assert d.is_gloo_available()" 2>/dev/null ||
  skip "no Python with torch (gloo) at '$python' for the DDP side"
bench=$build/bench/data_parallel/bench_dp
[[ -x $bench ]] || skip "bench_dp not built"
probe=op$$; probe=${probe:0:8}
subnet=10.$((200 + RANDOM % 50)).$((RANDOM % 250))
"$src/scripts/netns_cluster.sh" up --prefix "$probe" 2 --subnet "$subnet" >/dev/null 2>&1 ||
  { "$src/scripts/netns_cluster.sh" down --prefix "$probe" >/dev/null 2>&1 || true
    skip "cannot create network namespaces, bridges or veths here"; }
"$src/scripts/netns_cluster.sh" down --prefix "$probe" >/dev/null
out=$(mktemp -d "$build/overlap_script.XXXXXX")
trap 'rm -rf "$out"' EXIT
prefix=ov$$; prefix=${prefix:0:8}
rc=0
# A 3-layer model and a one-iteration calibration: the parts, not the figures.
OVERLAP_PREFIX=$prefix ROUNDS=1 STEPS=1 NPS=2 PYTHON=$python WIDTHS=64,512,512,16 \
  CAL_STEPS=1 CAL_WARMUP=1 \
  bash "$src/scripts/gpu_overlap.sh" --bench "$bench" --out "$out" --budget 240 || rc=$?
cat "$out/overlap.md"
fail() { echo "FAILED: $*"; exit 1; }
[[ $rc == 0 ]] || fail "gpu_overlap.sh exited $rc (overlap.log below)$(echo; tail -30 "$out/overlap.log")"
grep -q '^Calibration (tutti, batch 128, 1 iterations per phase' "$out/overlap.md" || fail "no calibration line"
grep -Eq '^\| tutti `Reducer` \| 2 \| [0-9]+ \|' "$out/overlap.md" || fail "no tutti row"
grep -q '^| PyTorch DDP, gloo | 2 |' "$out/overlap.md" || fail "no DDP row"
grep -q '^RESULT .*side=tutti np=2 rounds=1 ' "$out/overlap.md" || fail "no tutti RESULT line"
grep -q '^\*\*Verdict (np 2):\*\* overlap ratio median: tutti [0-9.-]*, DDP [0-9.-]*; target 0.8 ' \
  "$out/overlap.md" || fail "no verdict line"
ip netns list | grep -q "^$prefix" && fail "the rig was not taken down"
echo "passed: gpu_overlap.sh produced its whole report"
