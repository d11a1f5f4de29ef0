#!/bin/sh
# fake_agent.sh with one memory tier per fake host: every host of the
# elastic tests shares this machine's /dev/shm, so each gets its own
# TUTTI_MEM_DIR=$MEMTIER_BASE/<host> (tests/elastic/memtier_test.py).
export TUTTI_MEM_DIR="$MEMTIER_BASE/$1"
mkdir -p "$TUTTI_MEM_DIR"
exec "$(dirname "$0")/fake_agent.sh" "$@"
