#!/usr/bin/env bash
# scripts/gpu_check.sh's plan, without a GPU (label kit):
#  1. its --dry-run lists as `ctest: NAME` exactly the gpu-labelled ctests
#     that one GPU can run (ctest -L gpu -LE multi_gpu), and with --gpus 2
#     every gpu-labelled ctest: a name pattern cannot silently drop a suite;
#  2. its time budget, with the fake clock: when every phase spends all it
#     is given, the run still ends inside --budget; when the C++ ctests
#     overrun, the later phases shrink and the benchmarks are skipped, in
#     that order; the report is written with every phase's row.
# usage: gpu_check_plan_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
BUILD=$(realpath "$1")
SRC=$(realpath "$2")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tutti-gpu-plan.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
fails=0
check() {  # check WHAT CONDITION...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}
names() { ctest --test-dir "$BUILD" -N "$@" | sed -n 's/^ *Test *#[0-9]*: //p' | sort; }
plan() {  # plan OUTFILE ARGS...
  local out=$1; shift
  OUT=$WORK/out TUTTI_GPU_CHECK_FAKE_CLOCK=1 bash "$SRC/scripts/gpu_check.sh" --dry-run \
    --build-dir "$BUILD" "$@" > "$out" 2>&1
}

# 1. the selection
names -L gpu -LE multi_gpu > "$WORK/want1"
names -L gpu > "$WORK/want2"
[ -s "$WORK/want1" ] || { echo "FAIL: ctest lists no gpu-labelled test in $BUILD"; exit 1; }
plan "$WORK/plan1" --gpus 1; rc1=$?
sed -n 's/^ctest: //p' "$WORK/plan1" | sort > "$WORK/got1"
check "dry run exits 0 (rc $rc1)" [ $rc1 = 0 ]
if ! diff "$WORK/want1" "$WORK/got1" > "$WORK/diff1"; then
  echo "one GPU: ctest (<) against the plan (>):"; cat "$WORK/diff1"
fi
check "one GPU: the plan runs every gpu ctest not labelled multi_gpu ($(wc -l < "$WORK/want1"))" \
  cmp -s "$WORK/want1" "$WORK/got1"
check "one GPU: no multi_gpu test planned" \
  bash -c "! names_multi=\$(ctest --test-dir '$BUILD' -N -L multi_gpu | sed -n 's/^ *Test *#[0-9]*: //p'); for n in \$names_multi; do grep -qx \"\$n\" '$WORK/got1' && exit 1; done; exit 0"
plan "$WORK/plan2" --gpus 2
sed -n 's/^ctest: //p' "$WORK/plan2" | sort > "$WORK/got2"
check "two GPUs: the plan runs every gpu ctest ($(wc -l < "$WORK/want2"))" cmp -s "$WORK/want2" "$WORK/got2"
check "the python suites are in the plan" grep -q '^ctest: python_test_gpu_torch_amp_np1$' "$WORK/plan1"

# 2. the budget, with the fake clock
plan "$WORK/full" --budget 330
t=$(grep -o '^\[gpu_check +[0-9]*s\] report' "$WORK/full" | grep -o '[0-9]*' | head -1)
check "every phase spending its whole budget ends inside 330 s (at +${t:-?} s)" [ "${t:-999}" -le 330 ]
check "... and the benchmarks still get time" grep -qE '^bench: kernels \([0-9]+ s\)' "$WORK/full"
for p in probe kit smoke ctest repeat sanitizer python bench; do
  check "phase $p has a budget line" grep -qE "^phase $p: " "$WORK/full"
done
check "the report names every phase" bash -c "for p in kit smoke 'ctest gpu (C++)' sanitizer 'ctest gpu (Python)'; do grep -q \"| \$p\" '$WORK/out/gpu_report.md' || exit 1; done"
TUTTI_GPU_CHECK_FAKE_SPENT="smoke=40,ctest=100,repeat=30,sanitizer=90,python=80" plan "$WORK/slow" --budget 250
check "a long ctest phase leaves the sanitizer less time" grep -qE "^phase sanitizer: budget 30 s" "$WORK/slow"
check "... then the benchmarks are skipped" grep -qE '^phase bench: skipped' "$WORK/slow"
t=$(grep -o '^\[gpu_check +[0-9]*s\] report' "$WORK/slow" | grep -o '[0-9]*' | head -1)
check "... and the run still ends inside 250 s (at +${t:-?} s)" [ "${t:-999}" -le 250 ]
TUTTI_GPU_CHECK_FAKE_SPENT="smoke=5,ctest=20,sanitizer=30,python=20,bench_kernels=10" plan "$WORK/fast" --budget 330
check "fast phases leave every benchmark its wish" \
  bash -c "grep -q '^bench: kernels (60 s)' '$WORK/fast' && grep -q '^bench: gpu_cnn (40 s)' '$WORK/fast'"

if [ $fails -gt 0 ]; then echo "$fails check(s) failed"; cat "$WORK/slow"; exit 1; fi
echo "PASS: gpu_check.sh's plan"
