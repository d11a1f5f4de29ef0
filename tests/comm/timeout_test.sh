#!/usr/bin/env bash
# Runs timeout_probe under mpiexec and checks that every rank but 1 reported
# the expected timeout error, and that the whole job ended in bounded time
# (mpiexec reports the deliberate exit without MPI_Finalize as a failure; the
# exit code is therefore not the verdict, the probe's own lines are).
set -u
probe=$1 mpiexec=$2 np=$3 mode=$4
start=$(date +%s)
out=$(TUTTI_TIMEOUT=2 TUTTI_STATUS_GRACE_MS=1500 timeout 60 \
      "$mpiexec" --oversubscribe --bind-to none -np "$np" "$probe" "$mode" 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "$out" | grep -E "PROBE" || true
if [ $rc -eq 124 ]; then echo "FAIL: the job hung (killed after 60 s)"; exit 1; fi
if echo "$out" | grep -q PROBE-FAIL; then echo "FAIL: a rank saw the wrong outcome"; exit 1; fi
ok=$(echo "$out" | grep -c "PROBE-OK")
aborted=$(echo "$out" | grep -c "PROBE-ABORTED-OK")
if [ "$ok" -ne $((np - 1)) ] || [ "$aborted" -ne $((np - 1)) ]; then
  echo "FAIL: expected $((np - 1)) ranks to report the timeout, got $ok ($aborted aborted-checks)"
  echo "$out" | tail -30
  exit 1
fi
echo "PASS: $ok ranks reported the timeout in ${elapsed}s (mode $mode)"
