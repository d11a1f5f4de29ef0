#!/usr/bin/env bash
# TUTTI_EXIT_ON_COMM_FAILURE=1: a rank whose collective times out because
# rank 1 never arrives ends the job with exit code 76 (kCommFailureExitCode),
# which mpiexec passes on and tutti-run restarts on.
#   exit_code_test.sh PROBE MPIEXEC NP [PROBE-MODE]
set -u
probe=$1 mpiexec=$2 np=$3 mode=${4:-straggler}
out=$(TUTTI_EXIT_ON_COMM_FAILURE=1 TUTTI_TIMEOUT=2 TUTTI_STATUS_GRACE_MS=1000 timeout 90 \
      "$mpiexec" --oversubscribe --bind-to none -np "$np" "$probe" "$mode" 2>&1)
rc=$?
if [ $rc -eq 77 ]; then echo "$out" | tail -3; exit 77; fi
if [ $rc -eq 124 ]; then echo "FAIL: the job hung (killed after 90 s)"; exit 1; fi
if [ $rc -ne 76 ]; then
  echo "FAIL: expected exit status 76, got $rc"; echo "$out" | tail -30; exit 1
fi
if ! echo "$out" | grep -q "exiting with code 76 (TUTTI_EXIT_ON_COMM_FAILURE=1)"; then
  echo "FAIL: no exit notice"; echo "$out" | tail -30; exit 1
fi
if ! echo "$out" | grep -qE "#[0-9]+ .*did not complete within"; then
  echo "FAIL: the error naming the op was not printed"; echo "$out" | tail -30; exit 1
fi
echo "PASS: exit status 76 ($mode, np $np)"
