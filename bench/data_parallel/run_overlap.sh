#!/usr/bin/env bash
# Overlap and throughput of tutti's Reducer against PyTorch DDP (gloo), each
# side's phases timed inside the same runs, the sides interleaved
# (bench/data_parallel/compare.py):
#   1. netns rig: two "hosts" (scripts/netns_cluster.sh) joined by a tc
#      RATE link (default 1gbit), one rank per host (np 2), then two (np 4);
#   2. this machine, shared memory: np 2 and np 4.
# Sets the rig up, runs everything, tears it down (also on failure), and
# prints every table and RESULT line (also appended to OUT).
#
#   bench/data_parallel/run_overlap.sh [OUT]
#   ROUNDS=5 STEPS=10 RATE=1gbit PYTHON=.venv/bin/python bench/data_parallel/run_overlap.sh /tmp/overlap.txt
#   PARTS="rig" ... only the netns part; PARTS="local" only the local one
#   RIG_NPS="2": only np 2 on the rig (default "2 4")
#   RIG_WIDTHS, RIG_BATCH, RIG_CAP_MB: the rig's model; BUCKET_VIEW=1:
#   gradients as bucket views on both sides (no copy in or out)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-/tmp/tutti-overlap.txt}
ROUNDS=${ROUNDS:-5}
STEPS=${STEPS:-10}
RATE=${RATE:-1gbit}
PREFIX=${OVERLAP_PREFIX:-tzov}
PARTS=${PARTS:-"rig local"}
PYTHON=${PYTHON:-$(command -v python3)}
BIN=build/bench/data_parallel/bench_dp
# The model: its gradient traffic on the rate-limited link takes about as
# long as its backward pass (64 inputs, so the last gradient to be ready is
# small), spread over 15 layers of 512x512 with 1 MiB buckets so that no
# big gradient is left for after backward (the earlier 64,1024x5,16 model
# with 4 MiB buckets kept a quarter of its traffic for then: its ratio
# cannot pass ~0.77 with any engine; bench/RESULTS.md).
FINE=64$(printf ',512%.0s' $(seq 16)),16
RIG_MODEL=(--widths "${RIG_WIDTHS:-$FINE}" --batch "${RIG_BATCH:-128}" --cap-mb "${RIG_CAP_MB:-1}")
LOCAL_MODEL=(--widths "${LOCAL_WIDTHS:-512,1024,1024,1024,1024,512,16}" --batch "${LOCAL_BATCH:-32}" --cap-mb 4)
[[ -x $BIN ]] || { echo "build $BIN first (cmake --build build --target bench_dp)" >&2; exit 1; }
compare() { python3 bench/data_parallel/compare.py --python "$PYTHON" --rounds "$ROUNDS" \
              --steps "$STEPS" --bucket-view "${BUCKET_VIEW:-0}" "$@" | tee -a "$OUT"; }
echo "# $(date -u +%FT%TZ) rounds $ROUNDS steps $STEPS rate $RATE ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$OUT"
if [[ " $PARTS " == *" rig "* ]]; then
  subnet=10.$((200 + RANDOM % 50)).$((RANDOM % 250))
  scripts/netns_cluster.sh up --prefix "$PREFIX" 2 --rate "$RATE" --subnet "$subnet"
  trap 'scripts/netns_cluster.sh down --prefix "$PREFIX"' EXIT
  for np in ${RIG_NPS:-2 4}; do
    compare --netns "$PREFIX" --per-host $((np / 2)) --np "$np" --label "rig-$RATE" "${RIG_MODEL[@]}"
  done
fi
if [[ " $PARTS " == *" local "* ]]; then
  compare --np 2 --label local "${LOCAL_MODEL[@]}"
  compare --np 4 --label local "${LOCAL_MODEL[@]}"
fi
