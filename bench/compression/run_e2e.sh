#!/usr/bin/env bash
# Time-to-target-loss of every compressor on a rate-limited link between
# network-namespace hosts (scripts/netns_cluster.sh), one rank per host.
#
#   bench/compression/run_e2e.sh RATE [HOSTS] [OUT] [-- extra benchmark args]
#   bench/compression/run_e2e.sh 1gbit 2 /tmp/e2e-1gbit.txt
#
# Brings a cluster up with the given tc rate, runs
# build/bench/compression/bench_compression_train once per compressor with
# the settings below, appends every RESULT line to OUT, and removes the
# cluster (also on failure).
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:?rate, e.g. 1gbit}
HOSTS=${2:-2}
OUT=${3:-/tmp/tutti-e2e-$RATE.txt}
shift $(( $# < 3 ? $# : 3 ))
[[ ${1:-} == -- ]] && shift
PREFIX=${E2E_PREFIX:-tze}
COMPRESSORS=${E2E_COMPRESSORS:-"none fp16 bf16 topk powersgd onebit auto"}
ARGS=(--sizes 256,4096,4096,10 --batch 32 --lr 0.003 --momentum 0.9
      --target 1.5 --ema 0.9 --max-steps 150 --print-every 10 "$@")
BIN=build/bench/compression/bench_compression_train
[[ -x $BIN ]] || { echo "build $BIN first" >&2; exit 1; }

scripts/netns_cluster.sh up --prefix "$PREFIX" "$HOSTS" --rate "$RATE"
trap 'scripts/netns_cluster.sh down --prefix "$PREFIX"' EXIT
echo "# $(date -u +%FT%TZ) rate $RATE hosts $HOSTS args ${ARGS[*]}" >>"$OUT"
for c in $COMPRESSORS; do
  scripts/netns_cluster.sh run --prefix "$PREFIX" -- -x OPENBLAS_NUM_THREADS=1 -x TUTTI_LOG_LEVEL=info \
    "$BIN" --compressor "$c" "${ARGS[@]}" | tee /dev/stderr | grep '^RESULT' >>"$OUT"
done
