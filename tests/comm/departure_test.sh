#!/usr/bin/env bash
# Runs departure_probe under mpiexec with TUTTI_TIMEOUT=60 and checks that
# the expected ranks printed PROBE-OK well before that (a rank that left
# must not cost its peers TUTTI_TIMEOUT).  mpiexec may report the waiters'
# exit without MPI_Finalize as a failure: the probe's lines are the verdict.
#   departure_test.sh PROBE MPIEXEC NP MODE
set -u
probe=$1 mpiexec=$2 np=$3 mode=$4
case $mode in
  drain) want=$np ;;            # every rank completes every op
  *) want=$((np - 1)) ;;        # every rank but 1 sees the departure
esac
start=$(date +%s)
out=$(TUTTI_TIMEOUT=60 TUTTI_STALL_WARN_S=0 timeout 100 \
      "$mpiexec" --oversubscribe --bind-to none -np "$np" "$probe" "$mode" 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "$out" | grep -E "PROBE" || true
if [ $rc -eq 124 ]; then echo "FAIL: the job hung (killed after 100 s)"; exit 1; fi
if echo "$out" | grep -q PROBE-FAIL; then echo "FAIL: a rank saw the wrong outcome"; exit 1; fi
ok=$(echo "$out" | grep -c "PROBE-OK")
if [ "$ok" -ne "$want" ]; then
  echo "FAIL: expected $want PROBE-OK lines, got $ok (after ${elapsed}s)"
  echo "$out" | tail -30
  exit 1
fi
if [ "$elapsed" -ge 45 ]; then
  echo "FAIL: the job took ${elapsed}s (TUTTI_TIMEOUT=60: the departure was not noticed)"
  exit 1
fi
echo "PASS: $ok ranks in ${elapsed}s (mode $mode)"
