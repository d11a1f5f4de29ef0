#!/usr/bin/env bash
# The stall inspector end to end: runs stall_probe under mpiexec and checks
#  * every rank's all-reduce gives the closed-form sum (PROBE-OK on each);
#  * with LATE > 0 and TUTTI_STALL_WARN_S > 0, every waiting rank logged at
#    least one WARN "stall:" line naming the op (kind, name, seq, bytes),
#    the arrived ranks and exactly the missing ones, and the late ranks
#    logged none;
#  * with LATE = 0 or TUTTI_STALL_WARN_S = 0, no rank logged a stall line.
# CHECK (default 1) is TUTTI_CHECK_COLLECTIVES: with 0 the ranks wait in the
# data exchange instead of the agreement check.
# MODE (default op) is the probe's mode: op (a named all-reduce), bucket
# (the data-parallel reducer's bucket all-reduce) or split (a split_group).
#   stall_test.sh PROBE MPIEXEC NP LATE WARN_S [CHECK [MODE]]
set -u
probe=$1 mpiexec=$2 np=$3 late=$4 warn=$5 check=${6:-1} mode=${7:-op}
phase="agreeing on the operation"
[ "$check" = 0 ] && phase="exchanging data"
delay=2.6
start=$(date +%s)
out=$(TUTTI_STALL_WARN_S=$warn TUTTI_CHECK_COLLECTIVES=$check TUTTI_TIMEOUT=30 TUTTI_LOG_LEVEL=warn timeout 60 \
      "$mpiexec" --oversubscribe --bind-to none -np "$np" "$probe" "$late" "$delay" "$mode" 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
fail() { echo "FAIL: $*"; echo "$out" | tail -40; exit 1; }
[ $rc -eq 124 ] && fail "the job hung (killed after 60 s)"
[ $rc -ne 0 ] && fail "mpiexec exited with $rc"
ok=$(echo "$out" | grep -c "^PROBE-OK")
[ "$ok" -eq "$np" ] || fail "expected $np PROBE-OK lines, got $ok"
echo "$out" | grep -q PROBE-FAIL && fail "a rank saw a wrong result"

waiting=$((np - late))
arrived=$(seq -s ', ' 0 $((waiting - 1)))
[ "$waiting" -gt 1 ] && arrived="ranks $arrived" || arrived="rank $arrived"
missing=""
last=barrier name="'stall\\.probe'" red=sum
# The reducer's build() runs collectives of its own before the bucket.
[ "$mode" = bucket ] && last="[a-z_]+" name="'[^']*bucket[^']*'" red="[a-z]+"
for ((r = waiting; r < np; ++r)); do
  missing+="${missing:+; }rank $r \\(last entered #[0-9]+ $last, finished it\\)"
done
op="stall: allreduce #[0-9]+ $name float32\\[1000\\] $red on group 'world' \\(4000 bytes\\) has waited [0-9.]+ s"
[ "$mode" = split ] &&
  op="stall: split #[0-9]+ \\(color 0, key [0-9]+\\) of group 'world' \\(0 bytes\\) has waited [0-9.]+ s"
total=$(echo "$out" | grep -c "stall:")
if [ "$late" -eq 0 ] || [ "$warn" = 0 ]; then
  [ "$total" -eq 0 ] || fail "expected no stall warning, got $total"
  echo "PASS: no stall warning (np $np, late $late, TUTTI_STALL_WARN_S=$warn) in ${elapsed}s"
  exit 0
fi
for ((r = 0; r < np; ++r)); do
  mine=$(echo "$out" | grep -E "^\[tutti $r/$np W [0-9:.]+\] stall:")
  n=$(echo -n "$mine" | grep -c "stall:")
  if [ "$r" -ge "$waiting" ]; then
    [ "$n" -eq 0 ] || fail "late rank $r logged $n stall warnings"
    continue
  fi
  [ "$n" -ge 1 ] || fail "waiting rank $r logged no stall warning"
  want="$op while $phase; arrived: $arrived; missing: $missing \\(TUTTI_STALL_WARN_S=$warn; fails at TUTTI_TIMEOUT=30 s\\)\$"
  good=$(echo "$mine" | grep -cE "$want")
  [ "$good" -eq "$n" ] || fail "rank $r: $((n - good)) of $n warnings differ from /$want/"
done
[ "$total" -le $(( waiting * 4 )) ] || fail "too many warnings: $total"
echo "PASS: $total stall warnings on $waiting waiting ranks, missing: $missing (${elapsed}s)"
