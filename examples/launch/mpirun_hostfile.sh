#!/usr/bin/env bash
# mpirun_hostfile.sh -- dp_train across the nodes of an Open MPI hostfile,
# under tutti-run (docs/launch.md, recipe a).
#
#   HOSTFILE=hosts NET_IF=eth0 CLOUD=aws TUTTI_CKPT_DIR=/shared/ckpt/run1 \
#       examples/launch/mpirun_hostfile.sh [extra dp_train arguments...]
#
# Run it on a node that is not itself a spot instance (it may be one of the
# hostfile's nodes).  It execs tutti-run, which runs mpirun and
#   * on SIGTERM/SIGHUP (systemd stopping it, `kill -TERM`, an OS shutdown)
#     sends SIGUSR1 to mpirun: every rank stops at the same step, commits a
#     checkpoint and exits 75; tutti-run exits 75 and does not restart;
#   * when the job exits 75 on its own (a rank saw the cloud's spot notice
#     or the trigger file) or fails, runs the same mpirun again after a
#     backoff; mpirun re-reads the hostfile, and dp_train resumes from the
#     newest checkpoint in TUTTI_CKPT_DIR.
#
# Settings (environment variables):
#   HOSTFILE        Open MPI hostfile (default ./hostfile; examples/launch/hostfile.example)
#   NP              ranks (default: the sum of the hostfile's slots=)
#   MAP_BY          mpirun --map-by (default slot: consecutive ranks share a node)
#   BIND_TO         mpirun --bind-to (default none)
#   NET_IF          interface or CIDR for Open MPI's TCP traffic (btl_tcp_if_include
#                   and oob_tcp_if_include) and NCCL_SOCKET_IFNAME; unset: Open MPI picks
#   CLOUD           aws | gcp | azure | none (default none): the metadata source the
#                   ranks poll, added to TUTTI_PREEMPT_SOURCES=signals,file
#   TUTTI_CKPT_DIR  checkpoint directory on a file system shared by every node
#                   (required; passed to dp_train as --ckpt-dir)
#   STEPS, CKPT_EVERY, KEEP, COMPRESSION
#                   dp_train --steps (300), --ckpt-every (25), --keep (3),
#                   --compression (unset: TUTTI_COMPRESSION)
#   DP_TRAIN        the program (default <repo>/build/examples/dp_train/dp_train;
#                   the same path must exist on every node)
#   TUTTIRUN        path of tutti-run (default: on PATH, else <repo>/scripts/tutti-run)
#   TUTTI_MAX_RESTARTS (default here 10), TUTTI_RESTART_BACKOFF_S (default here 5)
#                   read by tutti-run (docs/settings.md)
#   STOP_TIMEOUT    tutti-run --stop-timeout: terminate a job that has not stopped
#                   this many seconds after a SIGTERM notice (default 0: wait)
#   TUTTI_MPIRUN    the mpirun tutti-run starts (default mpirun)
#   MPIRUN_EXTRA    more mpirun arguments, split on spaces (e.g. "-x NCCL_DEBUG=INFO")
#   DRY_RUN=1       print the command instead of running it
# Every other TUTTI_* variable set here reaches every rank: tutti-run adds
# -x NAME for each of them when the launcher is Open MPI.
set -euo pipefail

die() { echo "mpirun_hostfile.sh: $*" >&2; exit 2; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

HOSTFILE=${HOSTFILE:-hostfile}
MAP_BY=${MAP_BY:-slot}
BIND_TO=${BIND_TO:-none}
CLOUD=${CLOUD:-none}
STEPS=${STEPS:-300}
CKPT_EVERY=${CKPT_EVERY:-25}
DP_TRAIN=${DP_TRAIN:-$ROOT/build/examples/dp_train/dp_train}
if [[ -z ${TUTTIRUN:-} ]]; then
  TUTTIRUN=$(command -v tutti-run || echo "$ROOT/scripts/tutti-run")
fi

[[ -r $HOSTFILE ]] || die "hostfile '$HOSTFILE' not readable (set HOSTFILE; see examples/launch/hostfile.example)"
[[ -n ${TUTTI_CKPT_DIR:-} ]] || die "set TUTTI_CKPT_DIR to a directory on a file system every node mounts"
[[ -x $DP_TRAIN || -n ${DRY_RUN:-} ]] || die "DP_TRAIN '$DP_TRAIN' is not an executable (build it: cmake --build build --target dp_train)"

# Slots in the hostfile: "host slots=N", comments and blank lines ignored.
slots=$(awk '{sub(/#.*/, "")} NF { n = 1; for (i = 2; i <= NF; ++i) if ($i ~ /^slots=/) { split($i, kv, "="); n = kv[2] } s += n } END { print s + 0 }' "$HOSTFILE")
NP=${NP:-$slots}
(( NP >= 1 )) || die "no hosts in '$HOSTFILE'"
(( NP <= slots )) || die "NP=$NP ranks but '$HOSTFILE' has $slots slots (add --oversubscribe to MPIRUN_EXTRA if you mean it)"

# Notices: signals (SIGTERM/USR1/USR2 from tutti-run via mpirun), the trigger
# file (TUTTI_PREEMPT_FILE on any node), and the cloud's metadata.
case $CLOUD in
  aws|gcp|azure) sources="signals,file,$CLOUD" ;;
  none) sources="signals,file" ;;
  *) die "CLOUD='$CLOUD': use aws, gcp, azure or none" ;;
esac
export TUTTI_PREEMPT_SOURCES=${TUTTI_PREEMPT_SOURCES:-$sources}
export TUTTI_MAX_RESTARTS=${TUTTI_MAX_RESTARTS:-10}
export TUTTI_RESTART_BACKOFF_S=${TUTTI_RESTART_BACKOFF_S:-5}
export TUTTI_CKPT_DIR

# Open MPI refuses to run as root without these (containers).
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

mpi_args=(--hostfile "$HOSTFILE" -np "$NP" --map-by "$MAP_BY" --bind-to "$BIND_TO")
if [[ -n ${NET_IF:-} ]]; then
  mpi_args+=(--mca btl_tcp_if_include "$NET_IF" --mca oob_tcp_if_include "$NET_IF"
             -x "NCCL_SOCKET_IFNAME=$NET_IF")
fi
# Remote ranks get only what is exported; pass the library path along.
[[ -n ${LD_LIBRARY_PATH:-} ]] && mpi_args+=(-x LD_LIBRARY_PATH)
if [[ -n ${MPIRUN_EXTRA:-} ]]; then
  read -r -a extra <<<"$MPIRUN_EXTRA"
  mpi_args+=("${extra[@]}")
fi

train_args=(--steps "$STEPS" --ckpt-dir "$TUTTI_CKPT_DIR" --ckpt-every "$CKPT_EVERY")
[[ -n ${KEEP:-} ]] && train_args+=(--keep "$KEEP")
[[ -n ${COMPRESSION:-} ]] && train_args+=(--compression "$COMPRESSION")

run_args=()
[[ -n ${STOP_TIMEOUT:-} ]] && run_args+=(--stop-timeout "$STOP_TIMEOUT")

# "--" ends tutti-run's options; the rest goes to mpirun unchanged.
cmd=("$TUTTIRUN" "${run_args[@]}" -- "${mpi_args[@]}" "$DP_TRAIN" "${train_args[@]}" "$@")

echo "mpirun_hostfile.sh: $NP ranks on $HOSTFILE, sources $TUTTI_PREEMPT_SOURCES," \
     "checkpoints in $TUTTI_CKPT_DIR, up to $TUTTI_MAX_RESTARTS restarts" >&2
if [[ -n ${DRY_RUN:-} ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
# exec: tutti-run itself receives SIGTERM from systemd / kill / the shell.
exec "${cmd[@]}"
