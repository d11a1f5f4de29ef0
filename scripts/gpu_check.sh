#!/usr/bin/env bash
# Validates tutti on a GPU machine in one command, from the kit that
# scripts/gpu_kit.sh packed (docs/gpu.md):
#
#   bash scripts/gpu_check.sh [--out DIR] [--kit ARCHIVE|DIR] [--budget SECONDS]
#
# Writes at most eight files under DIR (default $OUT, else ./gpu-out):
#   gpu_report.md    what ran, what passed/failed/skipped and why, the
#                    benchmark tables with their ratios: read this first
#   gpu_check.log    everything, in order (commands, outputs)
#   ctest_gpu.log    the gpu-labelled ctests, verbose
#   sanitizer.log    compute-sanitizer memcheck/racecheck/synccheck output
#   bench.md         the benchmark tables alone (for bench/RESULTS.md)
# Phases (each bounded by `timeout` and by what is left of --budget,
# default 540 s, so the whole run ends inside a 10-minute slot):
#   0 probe      nvidia-smi, nvcc, compute-sanitizer, python3 + torch, the kit
#   1 kit        unpack, relocate (env.sh), find CUDA/NCCL/cuDNN libraries
#   2 python     build tutti._C against the kit's libtutti with this
#                machine's python3 (in the background)
#   3 ctest      every gpu-labelled test whose rank count fits the GPUs,
#                with the device-discipline switch on; then the Python ones
#   4 sanitizer  memcheck, racecheck, synccheck on the kernel tests
#   5 bench      kernels vs D2D copy, torch peers, NCCL, snapshot vs pinned
#                memcpy, TP layers vs torch.nn.Linear, gpu_cnn; NCCL checks
#                at >= 2 GPUs
# Without a GPU it still runs phases 0-3 (every GPU test must report
# "skipped", none "failed") and reports the rest as skipped: that is how it is
# tried on a machine without one.
# Exit: 0 nothing failed (skips allowed), 1 something failed.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUTDIR=${OUT:-$ROOT/gpu-out}
KITSRC=$ROOT/.gpukit/tutti-gpukit.tar.xz
BUDGET=540
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUTDIR=$2; shift 2 ;;
    --kit) KITSRC=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    *) echo "gpu_check.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
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

# The device-discipline switch (issue 12): kernel launchers check that the
# calling thread set its device through tutti.  The lead adjusts the name if
# the merged settings table spells it differently.
export TUTTI_CHECK_DEVICE=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export PYTHONUNBUFFERED=1

log() { echo "[gpu_check +$((SECONDS - START))s] $*" | tee -a "$LOG"; }
left() { echo $((BUDGET - (SECONDS - START))); }
note() { SUMMARY+=("| $1 | $2 | $3 |"); log "$1: $2 — $3"; }
fail() { FAILED=1; note "$1" "**FAILED**" "$2"; }
# run_logged SECONDS CMD...: runs CMD with a time limit, output to the log.
run_logged() {
  local t=$1; shift
  echo "\$ $*" >> "$LOG"
  timeout --kill-after=10 "$t" "$@" >> "$LOG" 2>&1
}
# Largest time a phase may take: its wish, or what is left minus a reserve
# for the report.
budget_for() {
  local want=$1 l; l=$(($(left) - 20))
  [ "$l" -lt "$want" ] && want=$l
  [ "$want" -lt 5 ] && want=5
  echo "$want"
}

# ---- 0. probe --------------------------------------------------------------
log "probe"
GPUS=0
if command -v nvidia-smi >/dev/null; then
  nvidia-smi -L >> "$LOG" 2>&1 && GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  DEVICE=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
fi
DEVICE=${DEVICE:-none}
have() { command -v "$1" >/dev/null && echo "$(command -v "$1")" || echo "absent"; }
NVCC=$(have nvcc); SAN=$(have compute-sanitizer); NCU=$(have ncu)
[ "$SAN" = absent ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && SAN=/usr/local/cuda/bin/compute-sanitizer
PY=$(have python3)
PYINFO=$(python3 - 2>&1 <<'EOF'
import sys
try:
    import torch
    t = f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuda available {torch.cuda.is_available()}, devices {torch.cuda.device_count()}"
except Exception as e:
    t = f"no torch ({type(e).__name__})"
print(f"Python {sys.version.split()[0]}; {t}")
EOF
)
SYS_MPIRUN=$(have mpirun)
{
  echo "| what | found |"; echo "|---|---|"
  echo "| GPUs (nvidia-smi -L) | $GPUS: $DEVICE |"
  echo "| nvcc | $NVCC $( [ "$NVCC" != absent ] && nvcc --version | tail -1) |"
  echo "| compute-sanitizer | $SAN |"
  echo "| ncu | $NCU |"
  echo "| python3 | $PY: $PYINFO |"
  echo "| mpirun before the kit | $SYS_MPIRUN |"
  echo "| cores | $(nproc) |"
} > "$WORK/probe.md"
cat "$WORK/probe.md" >> "$LOG"

# ---- 1. the kit ---------------------------------------------------------------
# shellcheck source=scripts/gpu_kit_load.sh
. "$ROOT/scripts/gpu_kit_load.sh"
if kit_load "$KITSRC" "$WORK" "$LOG" "$ROOT"; then
  note kit ok "$(grep '^commit:' "$KIT/KIT_INFO" | tr -s ' '), mpirun: $(command -v mpirun)"
else
  fail kit "$KIT_ERROR"
fi

# ---- 2. the Python extension (background) -------------------------------------
PYPKG=$WORK/python_pkg
build_extension() {
  local inc ext cuda_inc objs=() pids=() f o
  mkdir -p "$PYPKG/obj" && cp -r "$ROOT/python/tutti" "$PYPKG/" || return 1
  if ls "$PYPKG"/tutti/_C*.so >/dev/null 2>&1; then  # a kept work folder
    PYTHONPATH=$PYPKG python3 -c "import tutti; print('tutti._C loads (kept):', tutti.__file__)"
    return
  fi
  inc=$(python3 -m pybind11 --includes 2>/dev/null) ||
    inc="-I$KIT/include $(python3 -c 'import sysconfig; print("-I" + sysconfig.get_paths()["include"])')"
  ext=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))') || return 1
  cuda_inc=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/include
  for f in "$ROOT"/python/src/*.cc; do
    o=$PYPKG/obj/$(basename "$f" .cc).o
    objs+=("$o")
    g++ -O2 -std=c++17 -fPIC -fvisibility=hidden $inc -I"$ROOT/include" -I"$ROOT/src" \
      -I"$ROOT/python/src" -I"$cuda_inc" -DTUTTI_WITH_CUDA=1 -DTUTTI_WITH_NCCL=1 \
      -c "$f" -o "$o" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || return 1; done
  g++ -shared -o "$PYPKG/tutti/_C$ext" "${objs[@]}" -L"$KIT/build" -l:libtutti.so.0 \
    -L"$cuda_inc/../lib64" -L"$cuda_inc/../lib" -lcudart || return 1
  PYTHONPATH=$PYPKG python3 -c "import tutti; print('tutti._C loads:', tutti.__file__)"
}
if [ -n "$KIT" ]; then
  log "building the Python extension in the background"
  ( build_extension ) > "$WORK/extension.log" 2>&1 &
  EXT_PID=$!
fi

# ---- 3. gpu-labelled ctests -----------------------------------------------------
ctest_summary() {  # FILE -> "N passed, M skipped, K failed"
  local p s f
  p=$(grep -cE 'Test +#[0-9]+: .* Passed' "$1"); s=$(grep -cE '\*\*\*Skipped|Not Run' "$1")
  f=$(grep -cE 'Test +#[0-9]+: .*(\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception|Child aborted)' "$1")
  echo "$p passed, $s skipped, $f failed"
}
if [ -n "$KIT" ]; then
  # Rank counts above the GPU count would skip anyway (one GPU per rank);
  # leaving them out saves their start-up.
  maxnp=$((GPUS > 0 ? GPUS : 4))
  exclude="python_"
  for np in 2 3 4 5 6 7 8; do [ "$np" -gt "$maxnp" ] && exclude="$exclude|_np$np\$"; done
  t=$(budget_for 240)
  log "ctest -L gpu (not python; up to np $maxnp), limit ${t}s"
  echo "\$ ctest -L gpu -E '$exclude'" >> "$CTEST_LOG"
  timeout --kill-after=10 "$t" ctest --test-dir "$KIT/build" -L gpu -E "$exclude" \
    --output-on-failure -V --timeout 240 >> "$CTEST_LOG" 2>&1
  rc=$?
  grep -E 'Test +#[0-9]+: ' "$CTEST_LOG" > "$WORK/ctest_cc.txt"
  sum=$(ctest_summary "$WORK/ctest_cc.txt")
  if [ $rc -ne 0 ]; then fail "ctest gpu (C++)" "$sum (rc $rc; ctest_gpu.log)"
  else note "ctest gpu (C++)" ok "$sum$( [ "$GPUS" = 0 ] && echo ' — no GPU: skips expected')"; fi
  # The Python GPU suites, once the extension is built.
  ext_limit=$(( SECONDS + $(budget_for 240) ))
  while kill -0 "$EXT_PID" 2>/dev/null && [ $SECONDS -lt $ext_limit ]; do sleep 2; done
  if kill -0 "$EXT_PID" 2>/dev/null; then
    pkill -P "$EXT_PID" 2>/dev/null; kill "$EXT_PID" 2>/dev/null
    echo "gave up: building the extension took longer than the time budget" >> "$WORK/extension.log"
  fi
  wait "$EXT_PID"; ext_rc=$?
  cat "$WORK/extension.log" >> "$LOG"
  pymissing=$(python3 -c "
import importlib.util as u
print(' '.join(m for m in ('pytest', 'torch', 'numpy') if u.find_spec(m) is None))" 2>&1)
  if [ $ext_rc -ne 0 ]; then
    note "python extension" skipped "could not build tutti._C for $(python3 --version 2>&1) (see gpu_check.log): Python GPU tests not run"
  elif [ -n "$pymissing" ]; then
    note "ctest gpu (Python)" skipped "$(command -v python3) lacks: $pymissing (the GPU image's python3 has them)"
  else
    note "python extension" ok "$(tail -1 "$WORK/extension.log")"
    pyre="^python_test_gpu_np[1-$((GPUS > 0 ? (GPUS < 3 ? GPUS : 3) : 1))]\$"
    t=$(budget_for 120)
    echo "\$ ctest -R '$pyre' (TUTTI_PYTHONPATH=$PYPKG)" >> "$CTEST_LOG"
    TUTTI_PYTHONPATH=$PYPKG timeout --kill-after=10 "$t" ctest --test-dir "$KIT/build" \
      -R "$pyre" --output-on-failure -V --timeout 120 > "$WORK/ctest_py.log" 2>&1
    rc=$?
    cat "$WORK/ctest_py.log" >> "$CTEST_LOG"
    grep -E 'Test +#[0-9]+: ' "$WORK/ctest_py.log" > "$WORK/ctest_py.txt"
    sum=$(ctest_summary "$WORK/ctest_py.txt")
    if [ $rc -ne 0 ]; then fail "ctest gpu (Python)" "$sum (rc $rc)"
    else note "ctest gpu (Python)" ok "$sum"; fi
  fi
fi

# ---- 4. compute-sanitizer ----------------------------------------------------------
SAN_TESTS="tests/amp/test_amp_gpu tests/compression/test_compression_kernels_gpu tests/tensor_parallel/test_tp_gpu"
if [ -z "$KIT" ]; then :
elif [ "$GPUS" = 0 ]; then note sanitizer skipped "no GPU"
elif [ "$SAN" = absent ]; then note sanitizer skipped "compute-sanitizer not found"
else
  t=$(budget_for 150)
  log "compute-sanitizer (memcheck, racecheck, synccheck) on $SAN_TESTS, limit ${t}s"
  pids=()
  for tool in memcheck racecheck synccheck; do
    for exe in $SAN_TESTS; do
      name=$(basename "$exe")
      extra_flags=()
      [ $tool = memcheck ] && extra_flags=(--leak-check full)
      # Under the kit's mpirun (np 1): the tests' NCCL communicators
      # bootstrap over MPI.
      ( timeout --kill-after=10 "$t" mpirun -np 1 -x TUTTI_TEST_GPU=1 "$SAN" --tool $tool \
          --error-exitcode 99 "${extra_flags[@]}" "$KIT/build/$exe" \
          > "$WORK/san_${tool}_$name.log" 2>&1
        echo $? > "$WORK/san_${tool}_$name.rc" ) &
      pids+=($!)
    done
  done
  for p in "${pids[@]}"; do wait "$p"; done
  for tool in memcheck racecheck synccheck; do
    res=()
    for exe in $SAN_TESTS; do
      name=$(basename "$exe"); rc=$(cat "$WORK/san_${tool}_$name.rc")
      { echo "===== $tool $name (rc $rc)"; cat "$WORK/san_${tool}_$name.log"; } >> "$SAN_LOG"
      case $rc in
        0) res+=("$name ok") ;;
        77) res+=("$name skipped") ;;
        124|137) res+=("$name TIMED OUT (inconclusive)") ;;
        99) res+=("$name ERRORS: $(grep -m1 -E 'ERROR SUMMARY' "$WORK/san_${tool}_$name.log")"); FAILED=1 ;;
        *) res+=("$name rc $rc"); FAILED=1 ;;
      esac
    done
    status=ok
    printf '%s\n' "${res[@]}" | grep -q 'inconclusive' && status=incomplete
    printf '%s\n' "${res[@]}" | grep -qvE ' (ok|skipped|\(inconclusive\))$' && status="**FAILED**"
    note "sanitizer $tool" "$status" "$(IFS=';'; echo "${res[*]}")"
  done
fi

# ---- 5. benchmarks --------------------------------------------------------------------
bench() {  # bench NAME SECONDS CMD...: run, tables into bench.md
  local name=$1 t; t=$(budget_for "$2"); shift 2
  if [ "$t" -lt 15 ]; then note "bench $name" skipped "time budget spent"; return; fi
  echo "\$ $*" >> "$LOG"
  timeout --kill-after=10 "$t" "$@" > "$WORK/bench_$name.out" 2>&1
  local rc=$?
  cat "$WORK/bench_$name.out" >> "$LOG"
  case $rc in
    0) { echo; cat "$WORK/bench_$name.out"; } >> "$BENCH"; note "bench $name" ok "bench.md" ;;
    77) note "bench $name" skipped "$(grep -m1 -i 'skipped' "$WORK/bench_$name.out")" ;;
    124|137) fail "bench $name" "timed out after ${t}s" ;;
    *) fail "bench $name" "rc $rc: $(tail -1 "$WORK/bench_$name.out")" ;;
  esac
}
if [ -z "$KIT" ]; then :
elif [ "$GPUS" = 0 ]; then
  # Still start one, to show that it skips cleanly (exit 77).
  bench kernels 60 mpirun -np 1 "$KIT/build/bench/gpu/bench_gpu_kernels" --sizes 1M --reps 1 --iters 1
  note benchmarks skipped "no GPU: bench_gpu_snapshot, bench_tp_mlp --device cuda, torch peers, gpu_cnn not run"
else
  B=$KIT/build
  bench kernels 150 mpirun -np 1 "$B/bench/gpu/bench_gpu_kernels" --tsv "$WORK/kernels.tsv"
  bench snapshot 60 mpirun -np 1 "$B/bench/gpu/bench_gpu_snapshot" --dir "$WORK/snap"
  rm -rf "$WORK/snap"
  bench tp_mlp 40 mpirun -np 1 "$B/bench/tensor_parallel/bench_tp_mlp" --device cuda \
    --rows 16,128,512,2048 --iters 20
  bench torch_peers 60 python3 "$ROOT/bench/gpu/torch_peers.py" --tutti-tsv "$WORK/kernels.tsv" \
    --tp-out "$WORK/bench_tp_mlp.out"
  # gpu_cnn: training steps per second on the GPU vs its CPU fallback on
  # this machine's cores (the same model and Reducer path).
  cnn() {
    local mode=$1 steps=$2 t0 t1
    t0=$(date +%s.%N)
    timeout --kill-after=10 60 mpirun -np 1 "$B/examples/gpu_cnn/gpu_cnn" "--$mode" \
      --steps "$steps" > "$WORK/cnn_$mode.out" 2>&1 || return 1
    t1=$(date +%s.%N)
    python3 -c "print(f'{$steps / ($t1 - $t0):.1f}')"
  }
  if [ "$(budget_for 130)" -ge 130 ]; then
    g=$(cnn gpu 400); c=$(cnn cpu 100)
    if [ -n "$g" ] && [ -n "$c" ]; then
      { echo; echo "### gpu_cnn example: steps/s including start-up (GPU 400 steps, CPU fallback 100 steps)"
        echo; echo "| GPU steps/s | CPU steps/s ($(nproc) cores) | ratio |"; echo "|---:|---:|---:|"
        python3 -c "print(f'| $g | $c | {$g / $c:.1f} |')"; } >> "$BENCH"
      note "bench gpu_cnn" ok "GPU $g steps/s, CPU $c steps/s"
    else
      fail "bench gpu_cnn" "see gpu_check.log"; cat "$WORK"/cnn_*.out >> "$LOG" 2>/dev/null
    fi
  else
    note "bench gpu_cnn" skipped "time budget spent"
  fi
  nccl_check=$(find "$B/bench" -name bench_nccl_check -type f 2>/dev/null | head -1)
  if [ "$GPUS" -ge 2 ] && [ -n "$nccl_check" ]; then
    bench nccl_check 90 mpirun -np "$GPUS" "$nccl_check"
  else
    note "bench nccl_check" skipped "needs >= 2 GPUs and bench_nccl_check (GPUs: $GPUS, built: ${nccl_check:-no})"
  fi
fi

# ---- report ---------------------------------------------------------------------------
{
  echo "# tutti GPU check"
  echo
  echo "$(date -u +%Y-%m-%d\ %H:%M\ UTC), device: $DEVICE ($GPUS GPU(s)), $(( SECONDS - START )) s of a ${BUDGET} s budget."
  echo "Result: $([ $FAILED = 0 ] && echo 'nothing failed' || echo '**something FAILED**')."
  echo "Device-discipline switch: TUTTI_CHECK_DEVICE=$TUTTI_CHECK_DEVICE."
  echo
  echo "## Summary"
  echo
  echo "| phase | status | detail |"; echo "|---|---|---|"
  printf '%s\n' "${SUMMARY[@]}"
  echo
  echo "## Machine"
  echo
  cat "$WORK/probe.md"
  [ -n "$KIT" ] && { echo; echo '```'; cat "$KIT/KIT_INFO"; echo '```'; }
  echo
  echo "## Tests"
  echo
  echo '```'
  cat "$WORK"/ctest_cc.txt 2>/dev/null
  cat "$WORK/ctest_py.txt" 2>/dev/null
  grep -hE '^[0-9]+: .*(skipping|SKIPPED \[)' "$CTEST_LOG" | sort -u | head -20
  echo '```'
  if [ -s "$BENCH" ]; then echo; echo "## Benchmarks"; cat "$BENCH"; fi
  echo
  echo "Next, within 30 s while the machine is warm: \`bash scripts/gpu_overlap.sh\`"
  echo "(the data-parallel overlap against DDP on this host's cores; docs/gpu.md)."
} > "$REPORT"
log "report: $REPORT ($([ $FAILED = 0 ] && echo ok || echo FAILED))"
[ -z "${TUTTI_GPU_CHECK_WORK:-}" ] && rm -rf "$WORK"
exit $FAILED
