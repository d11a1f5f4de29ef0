#!/usr/bin/env bash
# tests/common/launch.sh MPIEXEC ARGS...: the tests' mpiexec, retried once
# when the launcher itself failed to start and no rank ran.  Open MPI 5's
# launcher (PRRTE with PMIx) failed once in ~330 launches of a full suite
# with "The PMIx server's listener thread failed to start" (0.02 s, before
# any rank existed).  Its cause, found later: a session directory left by a
# SIGKILLed launcher with the same pid.  The tests' mpiexec now removes those
# first (tests/common/mpiexec.sh.in); this retry stays for any other start
# failure of the launcher.  Such a failure says nothing about tutti, so it is
# retried once and said so; every other outcome, exit code (77: skipped) and
# output is the command's own.
log=$(mktemp "${TMPDIR:-/tmp}/tutti-launch.XXXXXX") || exec "$@"
trap 'rm -f "$log"' EXIT
"$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ] && grep -q "PMIx server's listener thread failed to start" "$log"; then
  echo "launch.sh: the MPI launcher failed to start before any rank ran (PMIx listener); retrying once" >&2
  "$@"
  rc=$?
fi
exit "$rc"
