#!/usr/bin/env bash
# Runs nccl_watchdog_probe under mpiexec and checks the probe's own verdict
# lines (a rank that timed out skips MPI_Finalize, which mpiexec reports as
# a failure, so the exit status is not the verdict).  Exit 77 (skip) when
# the probe found too few GPUs.
#   nccl_watchdog_test.sh PROBE MPIEXEC NP MODE EXPECTED_OK_LINES
set -u
probe=$1 mpiexec=$2 np=$3 mode=$4 want=$5
# The probes test NCCL's own watchdog: NCCL, whatever the ranks' devices
# (TUTTI_DEVICE_TRANSPORT=auto would stage ranks that share a GPU, and its
# transport vote would be the bootstrap's first collective).
out=$(TUTTI_TIMEOUT=20 TUTTI_DEVICE_TRANSPORT=nccl timeout 150 \
      "$mpiexec" --oversubscribe --bind-to none -np "$np" "$probe" "$mode" 2>&1)
rc=$?
echo "$out" | grep -E "PROBE|skipping" || true
if [ $rc -eq 77 ] || echo "$out" | grep -q "fewer GPUs than ranks on this host: skipping"; then
  exit 77
fi
if [ $rc -eq 124 ]; then echo "FAIL: the job hung (killed after 150 s)"; echo "$out" | tail -30; exit 1; fi
if echo "$out" | grep -q PROBE-FAIL; then echo "FAIL: a rank saw the wrong outcome"; exit 1; fi
got=$(echo "$out" | grep -c "PROBE-OK")
if [ "$got" -ne "$want" ]; then
  echo "FAIL: expected $want PROBE-OK lines, got $got"; echo "$out" | tail -30; exit 1
fi
echo "PASS: $mode at np $np"
