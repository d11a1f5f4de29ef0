#!/usr/bin/env bash
# The data-parallel overlap measurement on a GPU session's host (issue 15,
# docs/gpu.md): tutti's Reducer against PyTorch DDP (gloo) on the two-host
# network-namespace rig (scripts/netns_cluster.sh, a tc RATE link), with
# the host's spare cores, from the kit that scripts/gpu_kit.sh packed.
#
#   bash scripts/gpu_overlap.sh [--out DIR] [--kit ARCHIVE|DIR] [--bench BENCH_DP]
#                               [--budget SECONDS]
#   ROUNDS=5 STEPS=12 RATE=1gbit NPS="2 4" BATCH=auto PYTHON=python3
#   (WIDTHS, CAL_STEPS=4, CAL_WARMUP=2: the model and the calibration run's
#   iterations, for a quick trial; the defaults are the measurement's)
#
# On a 2-core machine the ranks' compute fills every core, so whatever CPU
# the communication needs comes out of the backward pass and bounds the
# overlap ratio; a host with spare cores is where the ratio measures the
# engine.  The CPU model and core count change how long the compute takes,
# not how long the link takes, so the batch is calibrated per rank count
# first (BATCH=auto): one short tutti run at batch 128 on the rig gives its
# compute and comm phases, and the batch becomes 128 x 1.8 x comm / compute
# (rounded to 16), so that backward (about 2/3 of compute) takes about as
# long as the gradient traffic (1.2x), the issue's setup, with a margin: the
# two sides' compute differs (OpenBLAS vs PyTorch's kernels; DDP's was 15 %
# slower on the 2-core machine), and a side whose backward is shorter than
# its traffic cannot hide all of it whatever its engine does.  Then
# bench/data_parallel/compare.py runs ROUNDS rounds of each side at that
# batch, alternated, each run timing its four phases in the same run.
# Rank counts whose estimated time does not fit what is left of the budget
# are reported as not run (run again with NPS=4).
#
# Writes under DIR (default $OUT, else ./gpu-out): overlap.md (the report:
# machine, calibration, commands, tables, RESULT lines, one verdict line per
# rank count) and overlap.log (everything).
# --bench runs that bench_dp instead of the kit's (no kit needed): how it is
# tried on a machine without a GPU.
# Needs root (network namespaces).  Uses the machine's ip and tc, else the
# kit's (sbin/); TUTTI_OVERLAP_KIT_IPROUTE=1 forces the kit's.
# Exit: 0 measured (whatever the ratio), 1 something failed, 2 bad usage.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUTDIR=${OUT:-$ROOT/gpu-out}
KITSRC=$ROOT/.gpukit/tutti-gpukit.tar.xz
BUDGET=540
BIN=""
ROUNDS=${ROUNDS:-5}
STEPS=${STEPS:-12}
RATE=${RATE:-1gbit}
NPS=${NPS:-"2 4"}
BATCH=${BATCH:-auto}
PYTHON=$(command -v "${PYTHON:-python3}" || echo "${PYTHON:-python3}")
PREFIX=${OVERLAP_PREFIX:-tzgo}
SUBNET=10.231.$((100 + RANDOM % 100))
WIDTHS=${WIDTHS:-64$(printf ',512%.0s' $(seq 16)),16}   # run_overlap.sh's rig model
CAL_STEPS=${CAL_STEPS:-4}     # the calibration run's measured iterations per phase
CAL_WARMUP=${CAL_WARMUP:-2}
CAP_MB=1
FACTOR=1.8   # compute / comm the calibrated batch aims at
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUTDIR=$2; shift 2 ;;
    --kit) KITSRC=$2; shift 2 ;;
    --bench) BIN=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    *) echo "gpu_overlap.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ $ROUNDS =~ ^[0-9]+$ && $STEPS =~ ^[0-9]+$ && $ROUNDS -ge 1 && $STEPS -ge 1 ]] ||
  { echo "gpu_overlap.sh: ROUNDS and STEPS must be positive integers" >&2; exit 2; }
[[ $BATCH == auto || $BATCH =~ ^[0-9]+$ ]] ||
  { echo "gpu_overlap.sh: BATCH must be 'auto' or a positive integer" >&2; exit 2; }
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
REPORT=$OUTDIR/overlap.md
LOG=$OUTDIR/overlap.log
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tutti-gpu-overlap.XXXXXX")
: > "$LOG"
START=$SECONDS
FAILED=0
LINES=()   # the report's body, in order
KIT="" IPROUTE="not checked"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
log() { echo "[gpu_overlap +$((SECONDS - START))s] $*" | tee -a "$LOG"; }
left() { echo $((BUDGET - (SECONDS - START))); }
add() { LINES+=("$@"); }
fail() { FAILED=1; add "" "**FAILED**: $*"; log "FAILED: $*"; }

write_report() {
  {
    echo "# tutti data-parallel overlap on this host's cores"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(( SECONDS - START )) s of a $BUDGET s budget."
    echo "Result: $([ $FAILED = 0 ] && echo 'measured' || echo '**something FAILED**')."
    echo
    echo "| machine | |"; echo "|---|---|"
    echo "| CPU | $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1) |"
    echo "| GPU | $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep . || echo none) |"
    echo "| load at start | $LOAD0 |"
    echo "| python (DDP side) | $PYINFO |"
    echo "| ip / tc | $IPROUTE |"
    echo "| bench_dp | $BIN |"
    [ -n "$KIT" ] && echo "| kit | $(grep '^commit:' "$KIT/KIT_INFO" | tr -s ' ') |"
    printf '%s\n' "${LINES[@]}"
  } > "$REPORT"
  log "report: $REPORT"
}
cleanup() {
  [ -n "${RIG_UP:-}" ] && "$ROOT/scripts/netns_cluster.sh" down --prefix "$PREFIX" >> "$LOG" 2>&1
  rm -rf "$WORK"
}
trap cleanup EXIT

# ---- probe -------------------------------------------------------------------
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
PYINFO=$("$PYTHON" -c "import sys, torch; print(f'{sys.executable}: Python {sys.version.split()[0]}, torch {torch.__version__}')" 2>&1 | tail -1)
log "probe: $(nproc) cores, load $LOAD0; $PYINFO"
if [ "$(id -u)" != 0 ]; then
  fail "needs root (network namespaces)"; write_report; exit 1
fi
if ! "$PYTHON" -c "import torch.distributed as d; assert d.is_gloo_available()" >> "$LOG" 2>&1; then
  fail "$PYTHON has no torch with gloo (the DDP side): $PYINFO"; write_report; exit 1
fi

# ---- the kit (unless --bench) --------------------------------------------------
if [ -z "$BIN" ]; then
  # shellcheck source=scripts/gpu_kit_load.sh
  . "$ROOT/scripts/gpu_kit_load.sh"
  if ! kit_load "$KITSRC" "$WORK" "$LOG" "$ROOT"; then
    fail "kit: $KIT_ERROR"; write_report; exit 1
  fi
  BIN=$KIT/build/bench/data_parallel/bench_dp
fi
[ -x "$BIN" ] || { fail "no bench_dp at $BIN"; write_report; exit 1; }
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")

# ---- the rig ---------------------------------------------------------------------
if [ "${TUTTI_OVERLAP_KIT_IPROUTE:-0}" = 1 ] || ! ip -V >/dev/null 2>&1 || ! tc -V >/dev/null 2>&1; then
  if [ -n "$KIT" ] && [ -x "$KIT/sbin/ip" ] && [ -x "$KIT/sbin/tc" ]; then
    export PATH=$KIT/sbin:$PATH
  fi
fi
IPROUTE="$(command -v ip || echo 'no ip'), $(command -v tc || echo 'no tc')"
log "rig: 2 hosts, $RATE, subnet $SUBNET.0/24 ($IPROUTE)"
if ! "$ROOT/scripts/netns_cluster.sh" up --prefix "$PREFIX" 2 --rate "$RATE" --subnet "$SUBNET" >> "$LOG" 2>&1; then
  "$ROOT/scripts/netns_cluster.sh" down --prefix "$PREFIX" >> "$LOG" 2>&1
  fail "could not build the rig (network namespaces, veth, bridge, tc tbf): $(tail -2 "$LOG" | tr '\n' ' ')"
  write_report; exit 1
fi
RIG_UP=1

# ---- per rank count: calibrate, then compare ----------------------------------------
# median of a bench_dp JSON field from a line of JSON on stdin
field() { "$PYTHON" -c "import json, sys; d = json.loads(sys.stdin.read()); print(d['$1'])"; }
for np in $NPS; do
  per_host=$((np / 2))
  if [ $((per_host * 2)) != "$np" ] || [ "$per_host" -lt 1 ]; then
    fail "NPS: $np is not 2 x ranks per host"; continue
  fi
  add "" "## np $np (2 hosts x $per_host ranks), $RATE link"
  batch=$BATCH
  t0=$SECONDS
  cal_cmd=("$ROOT/scripts/netns_cluster.sh" run --prefix "$PREFIX" --np "$np" --per-host "$per_host" --
           --bind-to none -x OPENBLAS_NUM_THREADS=1 "$BIN" --widths "$WIDTHS" --batch 128
           --steps "$CAL_STEPS" --warmup "$CAL_WARMUP" --cap-mb "$CAP_MB" --bucket-view 1)
  echo "\$ ${cal_cmd[*]}" >> "$LOG"
  cal=$(timeout --kill-after=10 $(( $(left) > 150 ? 150 : $(left) )) "${cal_cmd[@]}" 2>> "$LOG" | grep '^{' | tail -1)
  cal_s=$((SECONDS - t0))
  echo "$cal" >> "$LOG"
  if [ -z "$cal" ]; then fail "np $np: the calibration run failed (overlap.log)"; continue; fi
  compute=$(field compute_ms <<<"$cal"); comm=$(field comm_ms <<<"$cal")
  if [ "$batch" = auto ]; then
    batch=$("$PYTHON" -c "b = 128 * $FACTOR * $comm / max($compute, 1e-3); print(max(16, min(16384, int(round(b / 16)) * 16)))")
  fi
  add "" "Calibration (tutti, batch 128, $CAL_STEPS iterations per phase, ${cal_s} s): compute $compute ms, comm $comm ms -> batch **$batch** per rank (128 x $FACTOR x comm / compute: backward ~ 1.2 x comm)."
  # Estimate: each run starts (the calibration's start-up, twice for
  # PyTorch's import) and runs 4 phases x (2 warm-up + STEPS) iterations of
  # about 1.7 x comm each at the calibrated batch.
  est=$("$PYTHON" -c "
start = max($cal_s - 4 * ($CAL_STEPS + $CAL_WARMUP) * ($compute + $comm) / 2 / 1000, 2)
it = 1.7 * $comm / 1000
print(int($ROUNDS * (start * 2.5 + 2 * 4 * (2 + $STEPS) * it) * 1.2))")
  if [ "$est" -gt $(( $(left) - 15 )) ]; then
    add "" "Not run: $ROUNDS rounds at np $np need about $est s, $(left) s are left (run again with NPS=$np)."
    log "np $np: not run (needs ~${est}s, $(left)s left)"
    continue
  fi
  cmp_cmd=(python3 "$ROOT/bench/data_parallel/compare.py" --bench "$BIN" --python "$PYTHON"
           --netns "$PREFIX" --per-host "$per_host" --np "$np" --rounds "$ROUNDS" --steps "$STEPS"
           --widths "$WIDTHS" --batch "$batch" --cap-mb "$CAP_MB" --bucket-view 1
           --label "host$(nproc)-rig-$RATE" --timeout $(( $(left) - 10 )))
  log "np $np: batch $batch, $ROUNDS rounds (estimated ${est}s)"
  echo "\$ ${cmp_cmd[*]}" >> "$LOG"
  if timeout --kill-after=10 $(( $(left) - 5 )) "${cmp_cmd[@]}" > "$WORK/cmp$np.out" 2>> "$LOG"; then
    cat "$WORK/cmp$np.out" >> "$LOG"
    add "" '```' "${cmp_cmd[*]}" '```' ""
    mapfile -t table < <(grep -E '^\|' "$WORK/cmp$np.out")
    add "${table[@]}" "" '```'
    mapfile -t results < <(grep -E "^(RESULT|throughput)" "$WORK/cmp$np.out")
    add "${results[@]}" '```'
    verdict=$(printf '%s\n' "${results[@]}" | "$PYTHON" -c "
import sys
r = {}
for line in sys.stdin:
    kv = dict(w.split('=', 1) for w in line.split()[1:] if '=' in w)
    r[kv.get('side')] = kv
t, d = r.get('tutti', {}), r.get('ddp', {})
def f(x):
    try: return float(x)
    except (TypeError, ValueError): return float('nan')
ot, od = f(t.get('overlap_ratio')), f(d.get('overlap_ratio'))
print(f'overlap ratio median: tutti {ot:.2f}, DDP {od:.2f}; target 0.8 '
      + ('met by tutti' if ot >= 0.8 else 'NOT met by tutti'))")
    add "" "**Verdict (np $np):** $verdict"
    log "np $np: $verdict"
  else
    cat "$WORK/cmp$np.out" >> "$LOG"
    fail "np $np: compare.py failed or ran out of time (overlap.log)"
  fi
done
write_report
exit $FAILED
