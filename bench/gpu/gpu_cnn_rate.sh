#!/usr/bin/env bash
# Training steps per second of examples/gpu_cnn on the GPU against its CPU
# fallback on the same machine's cores (the same model and Reducer path),
# start-up included; prints a markdown table for bench.md.  Exit 77 when the
# example finds no GPU.  Called by scripts/gpu_check.sh:
#   gpu_cnn_rate.sh GPU_CNN GPU_STEPS CPU_STEPS
set -uo pipefail
exe=$1 gpu_steps=$2 cpu_steps=$3
rate() {  # MODE STEPS -> steps/s, or exit with the example's status
  local t0 t1 rc
  t0=$(date +%s.%N)
  mpirun -np 1 "$exe" "--$1" --steps "$2" > "/tmp/gpu_cnn_$1.$$" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  if [ $rc -ne 0 ]; then
    echo "gpu_cnn --$1 --steps $2: exit status $rc" >&2
    tail -5 "/tmp/gpu_cnn_$1.$$" >&2; rm -f "/tmp/gpu_cnn_$1.$$"
    exit $rc
  fi
  rm -f "/tmp/gpu_cnn_$1.$$"
  python3 -c "print(f'{$2 / ($t1 - $t0):.1f}')"
}
g=$(rate gpu "$gpu_steps") || exit $?
c=$(rate cpu "$cpu_steps") || exit $?
echo "### gpu_cnn example: steps/s including start-up (GPU $gpu_steps steps, CPU fallback $cpu_steps steps)"
echo
echo "| GPU steps/s | CPU steps/s ($(nproc) cores) | GPU / CPU |"
echo "|---:|---:|---:|"
python3 -c "print(f'| $g | $c | {$g / $c:.1f} |')"
