#!/bin/sh
# A fake rsh agent for the elastic tests: every "host" is a UTS namespace on
# this machine named after it, so OpenMPI sees distinct nodes and a rank's
# gethostname() is its host's name.  Hosts named bad* never answer a probe
# (exit 255, like ssh), slow* hang, and a host whose name is a file in
# $ELASTIC_TEST_DOWN is down.  Ranks on host H poll the trigger file
# $ELASTIC_TEST_TRIGGERS/H.
host=$1
shift
case $host in
  bad*) echo "fake_agent: ssh: connect to host $host port 22: No route to host" >&2; exit 255 ;;
  slow*) sleep 60; exit 255 ;;
esac
if [ -n "$ELASTIC_TEST_DOWN" ] && [ -e "$ELASTIC_TEST_DOWN/$host" ]; then
  echo "fake_agent: $host is down" >&2
  exit 255
fi
export TUTTI_PREEMPT_FILE="${ELASTIC_TEST_TRIGGERS:-/tmp}/$host"
# OpenMPI passes the remote command as words for a shell (like ssh).
exec unshare --uts /bin/sh -c "hostname $host; $*"
