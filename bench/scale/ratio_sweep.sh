#!/usr/bin/env bash
# tutti vs raw MPI_Allreduce at 1 KiB and 64 KiB for several rank counts,
# side by side in each run (bench/comm/allreduce_bench.cc: both on the same
# buffers in the same processes, agreement check on).  Issue 29's figure:
# the ratio must not grow with W.
#
#   bench/scale/ratio_sweep.sh [BUILD_DIR] [NP...]     # default: build 2 4 8 16
#
# On a 2-core machine the ranks above 2 are oversubscribed (--bind-to none):
# absolute times are inflated; compare ratios within one row.  A run that
# does not finish in TUTTI_SWEEP_TIMEOUT seconds (default 150) is reported
# as such with the lower bound on its time per op.
set -uo pipefail
BUILD=${1:-build}; shift || true
NPS=${*:-2 4 8 16}
LIMIT=${TUTTI_SWEEP_TIMEOUT:-150}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
BIN="$BUILD/bench/comm/bench_allreduce"
[ -x "$BIN" ] || { echo "ratio_sweep: $BIN not built" >&2; exit 2; }
echo "| np | size | MPI_Allreduce us | tutti us | ratio (busbw) | added us |"
echo "|---:|---:|---:|---:|---:|---:|"
for np in $NPS; do
  for size in 1K 64K; do
    out=$(timeout "$LIMIT" mpirun --oversubscribe --bind-to none -np "$np" \
            "$BIN" --min "$size" --max "$size" --check 1 2>&1)
    rc=$?
    row=$(printf '%s\n' "$out" | awk '$1 == "'"$size"'" && $4 == "check=1" {print}')
    if [ $rc -ne 0 ] || [ -z "$row" ]; then
      echo "| $np | $size | - | did not finish in ${LIMIT} s (rc $rc) | - | - |"
    else
      printf '%s\n' "$row" | awk -v np="$np" '{printf "| %s | %s | %.2f | %.2f | %.3f | %.2f |\n", np, $1, $2, $5, $8, $9}'
    fi
  done
done
