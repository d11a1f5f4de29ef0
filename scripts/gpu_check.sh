#!/usr/bin/env bash
# Validates tutti on a GPU machine in one command, from the kit that
# scripts/gpu_kit.sh packed (docs/gpu.md):
#
#   bash scripts/gpu_check.sh [--out DIR] [--kit ARCHIVE|DIR] [--budget SECONDS]
#                             [--test-timeout SECONDS] [--jobs N]
#   bash scripts/gpu_check.sh --dry-run [--build-dir DIR | --kit DIR] [--gpus N]
#
# A GPU machine is lent for 15 minutes in all (starts, runs, idle and
# transfers counted), so the run is one prepared call of about 330 s
# (--budget, default 330; give the device call ~60 s more), ordered by
# value so that a run cut short still leaves the most important results:
#
#   probe      nvidia-smi, versions and resolved paths of the driver, libcudart,
#              cuBLAS, NCCL, cuDNN, glibc and the MPI
#   kit        unpack, relocate (env.sh; RUNPATH finds the kit's libraries),
#              find the image's CUDA libraries; the Python extension starts
#              building in the background
#   smoke      the device, a one-rank NCCL all-reduce, the reducer on a CUDA
#              bucket (test_device_gpu, test_nccl, test_dp_gpu at np 1)
#   ctest      every other gpu-labelled C++ ctest that one GPU (or the GPUs
#              found) can run, -j N, each capped at --test-timeout (default
#              90 s: ctest's --timeout does not override a test's own
#              TIMEOUT, so the kit's ctest files are rewritten)
#   repeat     tests that once failed on a GPU without an established cause,
#              many times over (REPEAT_TESTS)
#   sanitizer  racecheck + synccheck on the compression and AMP kernel tests
#              first, then memcheck (leak check) on those and the TP test: in
#              the background while the Python phase runs
#   python     the gpu-labelled Python ctests (tutti._C built here for this
#              python3; a missing pytest/torch/numpy is a failure, not a skip;
#              pytest comes from the kit's wheels where the image lacks it)
#   bench      kernels vs a D2D copy, what a recovery costs on a GPU (context,
#              NCCL init/abort/shrink, loads from /dev/shm and disk), snapshot
#              vs pinned D2H, TP layers vs
#              torch.nn.Linear, unscale vs torch, gpu_cnn; whatever time is left
#
# Which ctests: `ctest -N -L gpu`, less those labelled multi_gpu (NCCL at
# two or more ranks, one GPU per rank) when fewer than two GPUs are found.
# `--dry-run` prints that plan on any machine, each phase with its time
# budget and each ctest as a line `ctest: NAME`, without running anything
# (tests/kit/gpu_check_plan_test.sh compares it with ctest's own list).
# With TUTTI_GPU_CHECK_FAKE_CLOCK=1 the clock advances only by what each phase
# is said to spend (TUTTI_GPU_CHECK_FAKE_SPENT="phase=seconds,..."; default:
# its whole budget), to test the budget logic.
#
# Writes at most eight files under DIR (default $OUT, else ./gpu-out), the
# report rewritten after every phase, so a run cut at its limit still
# returns what it found:
#   gpu_report.md    read this first: phases, machine, versions, tests, bench
#   gpu_check.log    everything, in order
#   ctest_gpu.log    the gpu-labelled ctests, verbose
#   sanitizer.log    compute-sanitizer's output
#   bench.md         the benchmark tables alone (for bench/RESULTS.md)
# Exit: 0 nothing failed (skips allowed), 1 something failed, 2 bad usage.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUTDIR=${OUT:-$ROOT/gpu-out}
KITSRC=$ROOT/.gpukit/tutti-gpukit.tar.xz
BUDGET=330
TEST_TIMEOUT=90
JOBS=""
DRY_RUN=0
BUILD_DIR=""
PLAN_GPUS=1
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUTDIR=$2; shift 2 ;;
    --kit) KITSRC=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --test-timeout) TEST_TIMEOUT=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    --gpus) PLAN_GPUS=$2; shift 2 ;;
    *) echo "gpu_check.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
SRC=$ROOT   # the sources the tests come from: the kit's snapshot once loaded
WORK=${TUTTI_GPU_CHECK_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/tutti-gpu-check.XXXXXX")}
mkdir -p "$WORK"
REPORT=$OUTDIR/gpu_report.md
LOG=$OUTDIR/gpu_check.log
CTEST_LOG=$OUTDIR/ctest_gpu.log
SAN_LOG=$OUTDIR/sanitizer.log
BENCH=$OUTDIR/bench.md
: > "$LOG"; : > "$CTEST_LOG"; : > "$SAN_LOG"; : > "$BENCH"
START=$SECONDS
FAILED=0
SUMMARY=()   # "| phase | status | detail |" rows
PHASE=start

export TUTTI_CHECK_DEVICE=1   # the device-discipline switch (docs/architecture.md)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 PRTE_MCA_rmaps_default_mapping_policy=slot:oversubscribe
export PYTHONUNBUFFERED=1

# ---- the clock and the budget ------------------------------------------------
FAKE_CLOCK=${TUTTI_GPU_CHECK_FAKE_CLOCK:-0}
FAKE_T=0
elapsed() { if [ "$FAKE_CLOCK" = 1 ]; then echo "$FAKE_T"; else echo $((SECONDS - START)); fi; }
left() { echo $((BUDGET - $(elapsed))); }
# budget_for WANT: what a phase may take: its wish, or what is left less a
# 10 s reserve for the report; 0 when less than MIN (default 10) is left.
budget_for() {
  local want=$1 min=${2:-10} l; l=$(($(left) - 10))
  [ "$l" -lt "$want" ] && want=$l
  [ "$want" -lt "$min" ] && want=0
  echo "$want"
}
# fake_spend PHASE BUDGET: with the fake clock, advance it by what PHASE is
# said to spend (TUTTI_GPU_CHECK_FAKE_SPENT), at most its budget.
fake_spent_of() {  # PHASE BUDGET -> seconds it is said to spend (<= BUDGET)
  local spent=$2 kv
  local spec=${TUTTI_GPU_CHECK_FAKE_SPENT:-}
  for kv in ${spec//,/ }; do
    [ "${kv%%=*}" = "$1" ] && spent=${kv#*=}
  done
  [ "$spent" -gt "$2" ] && spent=$2
  echo "$spent"
}
fake_spend() {
  [ "$FAKE_CLOCK" = 1 ] || return 0
  FAKE_T=$((FAKE_T + $(fake_spent_of "$1" "$2")))
}

log() { echo "[gpu_check +$(elapsed)s] $*" | tee -a "$LOG"; }
note() { SUMMARY+=("| $1 | $2 | $3 |"); log "$1: $2 — $3"; }
fail() { FAILED=1; note "$1" "**FAILED**" "$2"; }

# ---- the report, rewritten after every phase ----------------------------------
write_report() {
  {
    echo "# tutti GPU check"
    echo
    echo "$(date -u +%Y-%m-%d\ %H:%M\ UTC), device: ${DEVICE:-?} (${GPUS:-?} GPU(s)), $(elapsed) s of a ${BUDGET} s budget$([ "$DRY_RUN" = 1 ] && echo ' (dry run: nothing ran)')."
    if [ "$PHASE" = done ]; then
      echo "Result: $([ $FAILED = 0 ] && echo 'nothing failed' || echo '**something FAILED**')."
    else
      echo "Result so far (the run is in phase '$PHASE'; a report that ends here was cut short): $([ $FAILED = 0 ] && echo 'nothing failed yet' || echo '**something FAILED**')."
    fi
    echo "Device-discipline switch: TUTTI_CHECK_DEVICE=$TUTTI_CHECK_DEVICE; per-test limit ${TEST_TIMEOUT} s."
    echo
    echo "## Summary"
    echo
    echo "| phase | status | detail |"; echo "|---|---|---|"
    printf '%s\n' "${SUMMARY[@]}"
    if [ -s "$WORK/probe.md" ]; then echo; echo "## Machine and versions"; echo; cat "$WORK/probe.md"; fi
    if [ -n "${KIT:-}" ] && [ -f "$KIT/KIT_INFO" ]; then echo; echo '```'; cat "$KIT/KIT_INFO"; echo '```'; fi
    if [ -s "$WORK/plan.txt" ]; then echo; echo "## Plan"; echo; echo '```'; cat "$WORK/plan.txt"; echo '```'; fi
    if ls "$WORK"/ctest_*.txt >/dev/null 2>&1; then
      echo; echo "## Tests"; echo; echo '```'
      cat "$WORK"/ctest_*.txt 2>/dev/null
      grep -hE '^[0-9]+: .*(skipping|SKIPPED \[)' "$CTEST_LOG" | sort -u | head -20
      echo '```'
    fi
    if [ -s "$WORK/failures.txt" ]; then
      echo; echo "## Failure excerpts"; echo; echo '```'; tail -c 6000 "$WORK/failures.txt"; echo '```'
    fi
    if [ -s "$BENCH" ]; then echo; echo "## Benchmarks"; cat "$BENCH"; fi
  } > "$REPORT.tmp" && mv "$REPORT.tmp" "$REPORT"
}
# phase NAME WANT [MIN]: starts a phase; prints its budget to the plan and
# sets PHASE_T (0: no time left, skip it).
phase() {
  PHASE=$1
  PHASE_T=$(budget_for "$2" "${3:-10}")
  echo "phase $1: $([ "$PHASE_T" -gt 0 ] && echo "budget ${PHASE_T} s" || echo "skipped (time budget spent)") (starts at +$(elapsed) s)" >> "$WORK/plan.txt"
  log "phase $1 (budget ${PHASE_T} s)"
}
phase_end() { fake_spend "$PHASE" "$PHASE_T"; write_report; }

# ---- which ctests ---------------------------------------------------------------
# ctest_names DIR ARGS...: the names ctest -N lists.
ctest_names() {
  local d=$1; shift
  ctest --test-dir "$d" -N "$@" 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: //p'
}
SMOKE_TESTS="test_device_gpu_np1 test_nccl_np1 test_dp_gpu_np1"
# select_tests DIR GPUS: sets CPP_TESTS, PY_TESTS, SMOKE (names, in order).
select_tests() {
  local d=$1 gpus=$2 all n
  if [ "$gpus" -ge 2 ]; then all=$(ctest_names "$d" -L gpu)
  else all=$(ctest_names "$d" -L gpu -LE multi_gpu); fi
  SMOKE="" CPP_TESTS="" PY_TESTS=""
  for n in $all; do
    if [[ " $SMOKE_TESTS " == *" $n "* ]]; then SMOKE="$SMOKE $n"
    elif [[ $n == python_* ]]; then PY_TESTS="$PY_TESTS $n"
    else CPP_TESTS="$CPP_TESTS $n"; fi
  done
}
names_regex() { local r; r=$(echo "$*" | xargs -n1 | paste -sd'|'); echo "^($r)\$"; }
ctest_summary() {  # FILE -> "N passed, M skipped, K failed"
  local p s f
  p=$(grep -cE 'Test +#[0-9]+: .* Passed' "$1"); s=$(grep -cE '\*\*\*Skipped|Not Run' "$1")
  f=$(grep -cE 'Test +#[0-9]+: .*(\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception|Child aborted)' "$1")
  echo "$p passed, $s skipped, $f failed"
}
# run_ctests LABEL KEY SECONDS JOBS NAMES...: runs the named ctests from the
# kit, logs them, notes the outcome.
run_ctests() {
  local label=$1 key=$2 t=$3 j=$4; shift 4
  local names="$*" rc sum
  [ -n "$names" ] || { note "$label" skipped "no test selected"; return; }
  for n in $names; do echo "ctest: $n" >> "$WORK/plan.txt"; done
  if [ "$DRY_RUN" = 1 ]; then note "$label" planned "$(echo $names | wc -w) tests, -j$j"; return; fi
  if [ "$t" -le 0 ]; then note "$label" skipped "time budget spent"; return; fi
  echo "\$ ctest -R '$(names_regex $names)' -j$j" >> "$CTEST_LOG"
  timeout --kill-after=10 "$t" ctest --test-dir "$CTEST_DIR" -R "$(names_regex $names)" \
    -j"$j" --output-on-failure -V > "$WORK/ctest_$key.log" 2>&1
  rc=$?
  cat "$WORK/ctest_$key.log" >> "$CTEST_LOG"
  grep -E 'Test +#[0-9]+: ' "$WORK/ctest_$key.log" > "$WORK/ctest_$key.txt"
  sum=$(ctest_summary "$WORK/ctest_$key.txt")
  if [ $rc -ne 0 ]; then
    fail "$label" "$sum (rc $rc$([ $rc = 124 ] && echo ": cut at ${t}s"); ctest_gpu.log)"
    { echo "== $label"; grep -E '^[0-9]+: .*(FAIL|Failure|Error|error|PROBE-FAIL|Expected|Which is|Value of)' "$WORK/ctest_$key.log" | head -40; } >> "$WORK/failures.txt"
  else
    note "$label" ok "$sum$( [ "$GPUS" = 0 ] && echo ' — no GPU: skips expected')"
  fi
}

# ---- 0. probe --------------------------------------------------------------------
phase probe 10 1
GPUS=0 DEVICE=none
if [ "$DRY_RUN" = 1 ]; then
  GPUS=$PLAN_GPUS DEVICE="(planned for $PLAN_GPUS GPU(s))"
elif command -v nvidia-smi >/dev/null; then
  nvidia-smi -L >> "$LOG" 2>&1 && GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  DEVICE=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
  DEVICE=${DEVICE:-none}
fi
[ -n "$JOBS" ] || JOBS=$(( $(nproc) / 2 > 8 ? 8 : ($(nproc) / 2 < 2 ? 2 : $(nproc) / 2) ))
have() { command -v "$1" >/dev/null && command -v "$1" || echo "absent"; }
NVCC=$(have nvcc); SAN=$(have compute-sanitizer); NCU=$(have ncu)
[ "$SAN" = absent ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && SAN=/usr/local/cuda/bin/compute-sanitizer
if [ "$DRY_RUN" = 0 ]; then
  PYINFO=$(timeout 60 python3 - 2>&1 <<'EOF'
import sys
try:
    import torch
    t = f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuda available {torch.cuda.is_available()}, devices {torch.cuda.device_count()}"
except Exception as e:
    t = f"no torch ({type(e).__name__})"
print(f"Python {sys.version.split()[0]}; {t}")
EOF
)
  {
    echo "| what | found |"; echo "|---|---|"
    echo "| GPUs (nvidia-smi -L) | $GPUS: $DEVICE |"
    echo "| driver | $(sed -n 1p /proc/driver/nvidia/version 2>/dev/null | tr -s ' ' | cut -c1-120) |"
    echo "| nvcc | $NVCC $( [ "$NVCC" != absent ] && nvcc --version | tail -1) |"
    echo "| compute-sanitizer | $SAN |"
    echo "| ncu | $NCU |"
    echo "| python3 | $(have python3): $PYINFO |"
    echo "| glibc | $(ldd --version 2>&1 | head -1) |"
    echo "| mpirun before the kit | $(have mpirun) |"
    echo "| cores | $(nproc); ctest -j$JOBS |"
  } > "$WORK/probe.md"
  cat "$WORK/probe.md" >> "$LOG"
fi
phase_end

# ---- 1. the kit --------------------------------------------------------------------
phase kit 30 5
KIT=""
if [ "$DRY_RUN" = 1 ]; then
  if [ -n "$BUILD_DIR" ]; then CTEST_DIR=$BUILD_DIR
  elif [ -d "$KITSRC" ]; then CTEST_DIR=$KITSRC/build
  else echo "gpu_check.sh: --dry-run needs --build-dir DIR or --kit DIR (an unpacked kit)" >&2; exit 2; fi
  note kit planned "tests listed from $CTEST_DIR"
else
  # shellcheck source=scripts/gpu_kit_load.sh
  . "$ROOT/scripts/gpu_kit_load.sh"
  # The kit's own source snapshot (KIT_REPO) serves the ctest files, the
  # extension and the bench scripts: it matches the binaries, whatever this
  # working tree holds.
  if kit_load "$KITSRC" "$WORK" "$LOG" ""; then
    CTEST_DIR=$KIT/build
    SRC=$KIT_REPO
    # Every test's own TIMEOUT capped at --test-timeout: one hang must not
    # eat the phase.
    find "$CTEST_DIR" -name CTestTestfile.cmake -exec python3 - "$TEST_TIMEOUT" {} + <<'EOF'
import re, sys
cap = int(sys.argv[1])
for path in sys.argv[2:]:
    text = open(path).read()
    new = re.sub(r'TIMEOUT "(\d+)"', lambda m: 'TIMEOUT "%d"' % min(cap, int(m.group(1))), text)
    if new != text:
        open(path, "w").write(new)
EOF
    note kit ok "$(grep '^commit:' "$KIT/KIT_INFO" | tr -s ' '), mpirun: $(command -v mpirun)"
    # Versions and resolved paths of what the kit's binaries load.
    {
      for lib in libcudart libcublas libnccl libcudnn libmpi libopenblas; do
        p=$(for e in "$KIT/build/examples/gpu_cnn/gpu_cnn" "$KIT/build/libtutti.so.0"; do ldd "$e" 2>/dev/null; done |
            awk -v l="$lib" '$1 ~ "^"l"\\." {print $3; exit}')
        echo "| $lib | ${p:-not linked} $( [ -n "$p" ] && echo "-> $(basename "$(realpath "$p")")") |"
      done
      echo "| MPI (kit) | $(ompi_info --version 2>/dev/null | head -1) |"
      echo "| LD_LIBRARY_PATH (the image's, and any CUDA folder the kit added) | ${LD_LIBRARY_PATH:-none} |"
    } >> "$WORK/probe.md"
  else
    fail kit "$KIT_ERROR"
  fi
fi
phase_end

# ---- 2. the Python extension (background) --------------------------------------------
PYPKG=$WORK/python_pkg
build_extension() {
  local inc ext cuda_inc objs=() pids=() f o
  mkdir -p "$PYPKG/obj" && cp -r "$SRC/python/tutti" "$PYPKG/" || return 1
  inc=$(python3 -m pybind11 --includes 2>/dev/null) ||
    inc="-I$KIT/include $(python3 -c 'import sysconfig; print("-I" + sysconfig.get_paths()["include"])')"
  ext=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))') || return 1
  cuda_inc=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/include
  for f in "$SRC"/python/src/*.cc; do
    o=$PYPKG/obj/$(basename "$f" .cc).o
    objs+=("$o")
    g++ -O2 -std=c++17 -fPIC -fvisibility=hidden $inc -I"$SRC/include" -I"$SRC/src" \
      -I"$SRC/python/src" -I"$cuda_inc" -DTUTTI_WITH_CUDA=1 -DTUTTI_WITH_NCCL=1 \
      -c "$f" -o "$o" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || return 1; done
  # RUNPATH to the kit (absolute here): the extension finds libtutti, and
  # libtutti its libraries, without LD_LIBRARY_PATH.
  g++ -shared -o "$PYPKG/tutti/_C$ext" "${objs[@]}" -L"$KIT/build" -l:libtutti.so.0 \
    -L"$cuda_inc/../lib64" -L"$cuda_inc/../lib" -lcudart \
    -Wl,-rpath,"$KIT/build:$KIT/lib" || return 1
  PYTHONPATH=$PYPKG python3 -c "import tutti; print('tutti._C loads:', tutti.__file__)"
}
EXT_PID=""
if [ -n "$KIT" ]; then
  ( build_extension ) > "$WORK/extension.log" 2>&1 &
  EXT_PID=$!
fi

# ---- 3. smoke and 4. ctest -------------------------------------------------------------
if [ -n "${CTEST_DIR:-}" ]; then
  select_tests "$CTEST_DIR" "$GPUS"
  phase smoke 40
  run_ctests "smoke (device, NCCL np 1, reducer)" smoke "$PHASE_T" 3 $SMOKE
  phase_end
  phase ctest 100
  run_ctests "ctest gpu (C++)" cc "$PHASE_T" "$JOBS" $CPP_TESTS
  phase_end
fi

# ---- 4b. repeat: tests that failed once on a GPU and passed after ---------------------------
# Each line: executable (under build/), gtest filter, repetitions.  A test
# whose one failure was never explained is run many times over, so that a
# flaky silent-wrong-number shows (docs/gpu.md, "Open questions").
REPEAT_TESTS="tests/data_parallel/test_zero_gpu ZeroGpu.BuiltOnAThreadThatSetNoDevice:ZeroGpu.GradReadyBackToBackMatchesHostTraining 20"
phase repeat 30
if [ -n "${CTEST_DIR:-}" ]; then
  while read -r exe filter reps; do
    [ -n "$exe" ] || continue
    echo "repeat: $(basename "$exe") --gtest_filter=$filter x$reps" >> "$WORK/plan.txt"
    if [ "$DRY_RUN" = 1 ]; then note "repeat $(basename "$exe")" planned "$filter x$reps"; continue; fi
    if [ "$PHASE_T" -le 0 ] || [ "$GPUS" = 0 ]; then
      note "repeat $(basename "$exe")" skipped "$([ "$GPUS" = 0 ] && echo 'no GPU' || echo 'time budget spent')"; continue
    fi
    timeout --kill-after=5 "$PHASE_T" mpirun -np 1 -x TUTTI_TEST_GPU=1 -x TUTTI_CHECK_DEVICE \
      "$CTEST_DIR/$exe" --gtest_filter="$filter" --gtest_repeat="$reps" > "$WORK/repeat.log" 2>&1
    rc=$?
    { echo "\$ $exe --gtest_filter=$filter --gtest_repeat=$reps (rc $rc)"; cat "$WORK/repeat.log"; } >> "$CTEST_LOG"
    runs=$(grep -c '^\[       OK \]\|OK \]' "$WORK/repeat.log"); bad=$(grep -c 'FAILED  \]' "$WORK/repeat.log")
    if [ $rc -eq 0 ]; then note "repeat $(basename "$exe")" ok "$filter: $runs passes in $reps repetitions"
    else
      fail "repeat $(basename "$exe")" "$filter: rc $rc$([ $rc = 124 ] && echo ' (cut)'), $runs passes, $bad failure lines (ctest_gpu.log)"
      { echo "== repeat $exe"; grep -E 'Failure|Which is|Expected|FAILED' "$WORK/repeat.log" | head -20; } >> "$WORK/failures.txt"
    fi
  done <<< "$REPEAT_TESTS"
fi
phase_end

# ---- 5. sanitizer (background) and 6. python ---------------------------------------------
SAN_RACE="tests/compression/test_compression_kernels_gpu tests/amp/test_amp_gpu"
SAN_MEM="tests/compression/test_compression_kernels_gpu tests/amp/test_amp_gpu tests/tensor_parallel/test_tp_gpu"
SAN_PIDS=()
SAN_RUNS=()
phase sanitizer 90
SAN_T=$PHASE_T
SAN_START_T=$(elapsed)
if [ -z "${CTEST_DIR:-}" ]; then :
elif [ "$DRY_RUN" = 1 ]; then
  echo "sanitizer: racecheck, synccheck on $SAN_RACE; memcheck --leak-check full on $SAN_MEM (beside the python phase)" >> "$WORK/plan.txt"
  note sanitizer planned "racecheck/synccheck then memcheck"
elif [ "$GPUS" = 0 ]; then note sanitizer skipped "no GPU"
elif [ "$SAN" = absent ]; then note sanitizer skipped "compute-sanitizer not found"
elif [ "$SAN_T" -le 0 ]; then note sanitizer skipped "time budget spent"
else
  san_start() {  # TOOL EXE
    local tool=$1 exe=$2 name extra=()
    name=$(basename "$exe")
    [ "$tool" = memcheck ] && extra=(--leak-check full)
    ( timeout --kill-after=10 "$SAN_T" mpirun -np 1 -x TUTTI_TEST_GPU=1 -x TUTTI_CHECK_DEVICE \
        "$SAN" --tool "$tool" --error-exitcode 99 "${extra[@]}" "$KIT/build/$exe" \
        > "$WORK/san_${tool}_$name.log" 2>&1
      echo $? > "$WORK/san_${tool}_$name.rc" ) &
    SAN_PIDS+=($!); SAN_RUNS+=("$tool $exe")
  }
  for exe in $SAN_RACE; do san_start racecheck "$exe"; san_start synccheck "$exe"; done
  for exe in $SAN_MEM; do san_start memcheck "$exe"; done
  log "sanitizer: ${#SAN_PIDS[@]} runs in the background, limit ${SAN_T}s"
fi
SAN_DEADLINE=$(( SECONDS + SAN_T ))

phase python 80
if [ -n "${CTEST_DIR:-}" ] && [ "$DRY_RUN" = 1 ]; then
  run_ctests "ctest gpu (Python)" py 0 "$JOBS" $PY_TESTS
elif [ -n "$KIT" ] && [ -n "$PY_TESTS" ]; then
  py_deadline=$(( SECONDS + PHASE_T ))
  while kill -0 "$EXT_PID" 2>/dev/null && [ $SECONDS -lt $py_deadline ]; do sleep 1; done
  if kill -0 "$EXT_PID" 2>/dev/null; then
    pkill -P "$EXT_PID" 2>/dev/null; kill "$EXT_PID" 2>/dev/null
    echo "gave up: building the extension took longer than the time budget" >> "$WORK/extension.log"
  fi
  wait "$EXT_PID"; ext_rc=$?
  cat "$WORK/extension.log" >> "$LOG"
  # pytest from the kit's wheels where this python3 lacks it.
  if ! python3 -c 'import pytest' 2>/dev/null && ls "$KIT"/wheels/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$WORK/pysite" \
      "$KIT"/wheels/*.whl >> "$LOG" 2>&1 && export PYTHONPATH=$WORK/pysite${PYTHONPATH:+:$PYTHONPATH}
  fi
  pymissing=$(python3 -c "
import importlib.util as u
print(' '.join(m for m in ('pytest', 'torch', 'numpy') if u.find_spec(m) is None))" 2>&1)
  if [ $ext_rc -ne 0 ]; then
    fail "ctest gpu (Python)" "could not build tutti._C for $(python3 --version 2>&1) (gpu_check.log): Python GPU tests not run"
    tail -30 "$WORK/extension.log" >> "$WORK/failures.txt"
  elif [ -n "$pymissing" ]; then
    fail "ctest gpu (Python)" "$(command -v python3) lacks: $pymissing"
  else
    note "python extension" ok "$(tail -1 "$WORK/extension.log")"
    TUTTI_PYTHONPATH=$PYPKG run_ctests "ctest gpu (Python)" py $(( py_deadline - SECONDS )) "$JOBS" $PY_TESTS
  fi
fi
phase_end
# The sanitizer ran beside the python phase: the clock stands at whichever
# ended last.
if [ "$FAKE_CLOCK" = 1 ]; then
  san_end=$((SAN_START_T + $(fake_spent_of sanitizer "$SAN_T")))
  [ "$san_end" -gt "$FAKE_T" ] && FAKE_T=$san_end
fi

# The sanitizer runs, bounded by their own limit.
if [ ${#SAN_PIDS[@]} -gt 0 ]; then
  for p in "${SAN_PIDS[@]}"; do wait "$p"; done
  for tool in racecheck synccheck memcheck; do
    res=()
    for run in "${SAN_RUNS[@]}"; do
      [ "${run%% *}" = "$tool" ] || continue
      exe=${run#* }; name=$(basename "$exe"); rc=$(cat "$WORK/san_${tool}_$name.rc" 2>/dev/null || echo '?')
      { echo "===== $tool $name (rc $rc)"; cat "$WORK/san_${tool}_$name.log"; } >> "$SAN_LOG"
      case $rc in
        0) res+=("$name ok") ;;
        77) res+=("$name skipped") ;;
        124|137) res+=("$name TIMED OUT (inconclusive)") ;;
        99) res+=("$name ERRORS: $(grep -m1 -E 'ERROR SUMMARY|LEAK SUMMARY' "$WORK/san_${tool}_$name.log")")
            { echo "== $tool $name"; grep -m12 -E '=========' "$WORK/san_${tool}_$name.log"; } >> "$WORK/failures.txt" ;;
        *) res+=("$name rc $rc") ;;
      esac
    done
    [ ${#res[@]} -gt 0 ] || continue
    status=ok
    printf '%s\n' "${res[@]}" | grep -q 'inconclusive' && status=incomplete
    if printf '%s\n' "${res[@]}" | grep -qvE ' (ok|skipped|TIMED OUT \(inconclusive\))$'; then
      status="**FAILED**"; FAILED=1
    fi
    note "sanitizer $tool" "$status" "$(IFS=';'; echo "${res[*]}")"
  done
  PHASE=sanitizer; write_report
fi

# ---- 7. benchmarks -------------------------------------------------------------------------
bench() {  # bench NAME SECONDS CMD...: run, tables into bench.md
  local name=$1 t; t=$(budget_for "$2" 15); shift 2
  echo "bench: $name ($([ "$t" -gt 0 ] && echo "${t} s" || echo "skipped: time budget spent"))" >> "$WORK/plan.txt"
  [ "$DRY_RUN" = 1 ] && { fake_spend "bench_$name" "$t"; return; }
  if [ "$t" -le 0 ]; then note "bench $name" skipped "time budget spent"; return; fi
  echo "\$ $*" >> "$LOG"
  timeout --kill-after=5 "$t" "$@" > "$WORK/bench_$name.out" 2>&1
  local rc=$?
  cat "$WORK/bench_$name.out" >> "$LOG"
  case $rc in
    0) { echo; cat "$WORK/bench_$name.out"; } >> "$BENCH"; note "bench $name" ok "bench.md" ;;
    77) note "bench $name" skipped "$(grep -m1 -i 'skipped' "$WORK/bench_$name.out")" ;;
    124|137) fail "bench $name" "timed out after ${t}s" ;;
    *) fail "bench $name" "rc $rc: $(tail -1 "$WORK/bench_$name.out")" ;;
  esac
  write_report
}
phase bench 200 15
if [ -z "${CTEST_DIR:-}" ]; then :
elif [ "$DRY_RUN" = 0 ] && [ "$GPUS" = 0 ]; then
  # Still start one, to show that it skips cleanly (exit 77).
  bench kernels 60 mpirun -np 1 "$KIT/build/bench/gpu/bench_gpu_kernels" --sizes 1M --reps 1 --iters 1
  note benchmarks skipped "no GPU: the rest not run"
else
  B=$CTEST_DIR
  bench kernels 60 mpirun -np 1 "$B/bench/gpu/bench_gpu_kernels" --sizes 1M,16M,64M --reps 5 \
    --tsv "$WORK/kernels.tsv"
  bench recovery 45 mpirun -np 1 "$B/bench/gpu/bench_gpu_recovery" --mb 256,1024 --reps 5 \
    --dirs "/dev/shm/tutti-bench-recovery,$WORK/recovery"
  rm -rf /dev/shm/tutti-bench-recovery "$WORK/recovery"
  bench snapshot 30 mpirun -np 1 "$B/bench/gpu/bench_gpu_snapshot" --dir "$WORK/snap"
  rm -rf "$WORK/snap"
  bench tp_mlp 25 mpirun -np 1 "$B/bench/tensor_parallel/bench_tp_mlp" --device cuda \
    --rows 16,128,512,2048 --iters 20
  bench torch_peers 30 python3 "$SRC/bench/gpu/torch_peers.py" --tutti-tsv "$WORK/kernels.tsv" \
    --tp-out "$WORK/bench_tp_mlp.out"
  bench gpu_cnn 40 bash "$SRC/bench/gpu/gpu_cnn_rate.sh" "$B/examples/gpu_cnn/gpu_cnn" 400 100
  nccl_check=$(find "$B/bench" -name bench_nccl_check -type f 2>/dev/null | head -1)
  if [ "$GPUS" -ge 2 ] && [ -n "$nccl_check" ]; then
    bench nccl_check 60 mpirun -np "$GPUS" "$nccl_check"
  fi
fi
write_report  # (each bench advanced the fake clock by its own time)

PHASE=done
log "report: $REPORT ($([ $FAILED = 0 ] && echo ok || echo FAILED))"
[ "$DRY_RUN" = 1 ] && cat "$WORK/plan.txt"
write_report
[ -z "${TUTTI_GPU_CHECK_WORK:-}" ] && rm -rf "$WORK"
exit $FAILED
