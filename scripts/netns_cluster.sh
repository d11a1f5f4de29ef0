#!/usr/bin/env bash
# netns_cluster.sh -- N "hosts" on this machine as network namespaces joined
# by a bridge, with an optional tc rate limit, and what OpenMPI needs to run
# one rank per host over TCP.  The project's own multi-node test rig: all
# traffic stays on addresses inside namespaces this script creates.
#
#   scripts/netns_cluster.sh up 2 --rate 1gbit      # create hosts tz0, tz1
#   scripts/netns_cluster.sh run -- ./bench args    # mpiexec, one rank per host
#   scripts/netns_cluster.sh rate 10gbit            # change the limit
#   scripts/netns_cluster.sh down                   # remove everything
#
# Commands (each takes --prefix P right after its name, default "tz", to
# run several clusters side by side):
#   up N [--rate R] [--delay D] [--subnet A.B.C]
#        creates namespaces P0..P{N-1} with addresses A.B.C.2.., a bridge
#        "Pbr" with A.B.C.1 in the root namespace (mpiexec's daemon connects
#        back through it), veth pairs, and when --rate is given a tbf limit of
#        R (tc syntax: 1gbit, 500mbit) on both directions of every host link
#        (a full-duplex NIC of that speed); --delay adds netem latency.
#        Default subnet 10.213.0.
#   down                 deletes the namespaces, veths, bridge and state.
#   rate R | none        replaces the limit on every link (none: unlimited).
#   hosts [--per-host S] prints the mpiexec host list "ip:S,ip:S,..." (S=1).
#   run [--np K] [--per-host S] -- CMD
#                        mpiexec -np K (default N*S) with S ranks per host
#                        (the launcher TUTTI_MPIRUN names, else PATH's),
#                        TCP only on the cluster subnet, ranks launched
#                        through the rsh agent below; extra mpiexec options
#                        may precede CMD after "--".
#   mpiargs [--per-host S]
#                        prints the mpiexec options "run" uses (one per
#                        line), for launchers that wrap mpiexec (tutti-run).
#   rsh HOST CMD...      the rsh agent OpenMPI invokes: runs CMD in HOST's
#                        namespace (in its own UTS namespace, hostname P<i>,
#                        so OpenMPI sees distinct nodes), with TUTTI_MEM_DIR
#                        /dev/shm/netns-P<i> (a memory tier per host; `down`
#                        removes them).
#   exec I CMD...        runs CMD in namespace P<I>.
#   status               lists the hosts and their qdiscs.
# Needs root, iproute2 (ip, tc) and util-linux (unshare).
set -euo pipefail

PREFIX=tz
STATE_ROOT=${TUTTI_NETNS_STATE:-/run/tutti-netns}
SELF=$(readlink -f "$0")

die() { echo "netns_cluster: $*" >&2; exit 1; }

state_file() { echo "$STATE_ROOT/$PREFIX.hosts"; }     # "ip ns" per line
agent_file() { echo "$STATE_ROOT/$PREFIX-rsh"; }
# A host's memory tier (TUTTI_MEM_DIR for the processes started on it).
mem_dir() { echo "/dev/shm/netns-$1"; }

# tbf burst: 4 ms of traffic at the rate, at least 64 KiB.
burst_for() {
  local rate=$1 bits
  case $rate in
    *gbit) bits=$(( ${rate%gbit} * 1000000000 )) ;;
    *mbit) bits=$(( ${rate%mbit} * 1000000 )) ;;
    *kbit) bits=$(( ${rate%kbit} * 1000 )) ;;
    *) die "rate '$rate': use an integer with kbit, mbit or gbit" ;;
  esac
  local b=$(( bits / 8 / 250 ))
  (( b < 65536 )) && b=65536
  echo "$b"
}

# limit DEV RATE DELAY [NETNS]
limit() {
  local dev=$1 rate=$2 delay=$3 ns=${4:-}
  local tcc=(tc)
  [[ -n $ns ]] && tcc=(ip netns exec "$ns" tc)
  "${tcc[@]}" qdisc del dev "$dev" root 2>/dev/null || true
  if [[ -n $delay ]]; then
    "${tcc[@]}" qdisc add dev "$dev" root handle 1: netem delay "$delay"
    if [[ $rate != none ]]; then
      "${tcc[@]}" qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$rate" \
        burst "$(burst_for "$rate")" latency 100ms
    fi
  elif [[ $rate != none ]]; then
    "${tcc[@]}" qdisc add dev "$dev" root tbf rate "$rate" \
      burst "$(burst_for "$rate")" latency 100ms
  fi
}

cmd_up() {
  local n=${1:-}; shift || true
  [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 200 ]] || die "up: N must be 1..200"
  local rate=none delay="" subnet=10.213.0
  while [[ $# -gt 0 ]]; do
    case $1 in
      --rate) rate=$2; shift 2 ;;
      --delay) delay=$2; shift 2 ;;
      --subnet) subnet=$2; shift 2 ;;
      *) die "up: unknown option $1" ;;
    esac
  done
  [[ -e $(state_file) ]] && die "cluster '$PREFIX' exists; run 'down --prefix $PREFIX' first"
  [[ $rate == none ]] || burst_for "$rate" >/dev/null
  mkdir -p "$STATE_ROOT"
  local br=${PREFIX}br
  ip link add "$br" type bridge
  ip addr add "$subnet.1/24" dev "$br"
  ip link set "$br" up
  : >"$(state_file)"
  for ((i = 0; i < n; i++)); do
    local ns=$PREFIX$i ip=$subnet.$((i + 2))
    ip netns add "$ns"
    ip link add "${ns}h" type veth peer name "${ns}n"
    ip link set "${ns}n" netns "$ns"
    ip link set "${ns}h" master "$br"
    ip link set "${ns}h" up
    ip netns exec "$ns" ip addr add "$ip/24" dev "${ns}n"
    ip netns exec "$ns" ip link set "${ns}n" up
    ip netns exec "$ns" ip link set lo up
    limit "${ns}h" "$rate" "$delay"          # bridge -> host (receive side)
    limit "${ns}n" "$rate" "$delay" "$ns"    # host -> bridge (send side)
    echo "$ip $ns" >>"$(state_file)"
  done
  echo "$subnet.0/24" >"$STATE_ROOT/$PREFIX.subnet"
  cat >"$(agent_file)" <<EOF
#!/bin/sh
exec "$SELF" rsh --prefix "$PREFIX" "\$@"
EOF
  chmod +x "$(agent_file)"
  echo "cluster '$PREFIX': $n hosts on $subnet.0/24, rate $rate${delay:+, delay $delay}"
}

cmd_down() {
  local f
  f=$(state_file)
  if [[ -e $f ]]; then
    while read -r _ ns; do
      ip netns del "$ns" 2>/dev/null || true
      rm -rf "$(mem_dir "$ns")"
    done <"$f"
  fi
  ip link del "${PREFIX}br" 2>/dev/null || true
  rm -f "$f" "$(agent_file)" "$STATE_ROOT/$PREFIX.subnet"
  echo "cluster '$PREFIX' removed"
}

require_up() { [[ -e $(state_file) ]] || die "no cluster '$PREFIX' (run 'up' first)"; }

cmd_rate() {
  require_up
  local rate=${1:-}; [[ -n $rate ]] || die "rate: give a rate or 'none'"
  while read -r _ ns; do
    limit "${ns}h" "$rate" ""
    limit "${ns}n" "$rate" "" "$ns"
  done <"$(state_file)"
  echo "cluster '$PREFIX': rate $rate"
}

cmd_hosts() {
  require_up
  local slots=1
  if [[ ${1:-} == --per-host ]]; then slots=$2; shift 2; fi
  [[ $slots =~ ^[0-9]+$ && $slots -ge 1 ]] || die "hosts: --per-host needs a positive integer"
  awk -v s="$slots" '{printf "%s%s:%d", (NR > 1 ? "," : ""), $1, s} END {print ""}' "$(state_file)"
}

cmd_rsh() {
  require_up
  local host=${1:-}; shift || true
  local ns
  ns=$(awk -v h="$host" '$1 == h {print $2}' "$(state_file)")
  [[ -n $ns ]] || die "rsh: '$host' is not a host of cluster '$PREFIX'"
  # OpenMPI passes the remote command as words for a shell (like ssh).
  # (Images without the hostname tool: the UTS namespace's name is also
  # /proc/sys/kernel/hostname.)
  # Not exec: like an ssh client, this process stays on the launching host
  # (outside the namespace) and ends with the remote command's status, also
  # when everything in the namespace is killed (a lost host): Open MPI 5's
  # launcher then sees its agent fail (status 137) and fails the job; with
  # the agent itself killed it ended the job with status 0.
  # Each host also gets a memory tier of its own (TUTTI_MEM_DIR): the
  # namespaces share this machine's /dev/shm, where real hosts each have
  # theirs (elastic commits keep their newest copy there, and buddy copies
  # go to the next host's).  Unless the job exports TUTTI_MEM_DIR itself.
  local rc=0 mem
  mem=$(mem_dir "$ns")
  mkdir -p -m 0700 "$mem"
  ip netns exec "$ns" unshare --uts /bin/sh -c \
    "{ hostname $ns || echo $ns > /proc/sys/kernel/hostname; } 2>/dev/null; export TUTTI_MEM_DIR=$mem; $*" || rc=$?
  exit $rc
}

cmd_exec() {
  require_up
  local i=${1:-}; shift || true
  exec ip netns exec "$PREFIX$i" "$@"
}

# The mpiexec options for this cluster, one per line.
# mpi_yield_when_idle: every "host" of the rig sees all of this machine's
# cores, so Open MPI never knows that the hosts' ranks together oversubscribe
# them and its waits busy-poll; the kernel's TCP delivery then waits behind
# the polling ranks (measured on a 2-vCPU VM, 3 hosts x 2 ranks: a 6-rank
# 8-byte MPI_Allreduce took 40 ms, 0.3 ms with this; tutti::recover()'s
# communicator constructions 1-2 s, 0.1 s with it).  Open MPI sets it by
# itself on one oversubscribed host.
mpi_options() {
  local per_host=$1 subnet
  subnet=$(cat "$STATE_ROOT/$PREFIX.subnet")
  printf '%s\n' --host "$(cmd_hosts --per-host "$per_host")" \
    --mca plm_rsh_agent "$(agent_file)" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl tcp,self --mca btl_tcp_if_include "$subnet" \
    --mca oob_tcp_if_include "$subnet" --mca mpi_yield_when_idle 1 \
    -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
}

cmd_mpiargs() {
  require_up
  local per_host=1
  if [[ ${1:-} == --per-host ]]; then per_host=$2; shift 2; fi
  mpi_options "$per_host"
}

cmd_run() {
  require_up
  local np="" per_host=1
  while [[ ${1:-} == --np || ${1:-} == --per-host ]]; do
    if [[ $1 == --np ]]; then np=$2; else per_host=$2; fi
    shift 2
  done
  [[ -n $np ]] || np=$(( $(wc -l <"$(state_file)") * per_host ))
  [[ ${1:-} == -- ]] && shift
  local opts=()
  mapfile -t opts < <(mpi_options "$per_host")
  exec env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    "${TUTTI_MPIRUN:-mpiexec}" -np "$np" "${opts[@]}" "$@"
}

cmd_status() {
  require_up
  while read -r ip ns; do
    echo "$ns $ip: $(ip netns exec "$ns" tc qdisc show dev "${ns}n" | tr '\n' ' ')"
  done <"$(state_file)"
}

main() {
  local cmd=${1:-}; shift || true
  if [[ ${1:-} == --prefix ]]; then PREFIX=${2:-}; shift 2; fi
  [[ $PREFIX =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "prefix '$PREFIX': 1-8 lower-case letters/digits"
  case $cmd in
    up|down|rate|hosts|mpiargs|run|rsh|exec|status)
      [[ $(id -u) -eq 0 ]] || die "needs root (network namespaces)" ;;
  esac
  case $cmd in
    up) cmd_up "$@" ;;
    down) cmd_down ;;
    rate) cmd_rate "$@" ;;
    hosts) cmd_hosts "$@" ;;
    mpiargs) cmd_mpiargs "$@" ;;
    run) cmd_run "$@" ;;
    rsh) cmd_rsh "$@" ;;
    exec) cmd_exec "$@" ;;
    status) cmd_status ;;
    *) sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
  esac
}

main "$@"
