#!/usr/bin/env bash
# Installs tutti from BUILD_DIR, moves the installed tree elsewhere (it must
# be relocatable), builds the consumer project against it with
# find_package(tutti), and runs it under mpiexec.
set -euo pipefail
build_dir=$1 src_dir=$2 mpiexec=$3
# Work under the build tree (not /tmp, which may be small or noexec).
work=$(mktemp -d "$build_dir/install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
# On failure, show what the failing step wrote (its output goes to logs).
step=start
trap 'rc=$?; echo "FAIL (exit $rc) at step: $step"; for f in "$work"/*.log; do [ -f "$f" ] && { echo "== $f"; tail -40 "$f"; }; done' ERR
step=install
cmake --install "$build_dir" --prefix "$work/first" > "$work/install.log" 2>&1
step=move
mv "$work/first" "$work/moved"
step=configure-consumer
# C++14 by default: the package itself must raise it to the C++17 its
# headers need (target_compile_features on tutti::tutti).
cmake -S "$src_dir/tests/install/consumer" -B "$work/build" -G Ninja \
      -DCMAKE_CXX_STANDARD=14 -DCMAKE_PREFIX_PATH="$work/moved" > "$work/configure.log" 2>&1
step=build-consumer
cmake --build "$work/build" > "$work/build.log" 2>&1
# The consumer must resolve libtutti from the moved prefix, not the build tree.
if ! ldd "$work/build/consumer" | grep libtutti | grep -q "$work/moved/"; then
  echo "FAIL: consumer does not load libtutti from the moved prefix"; ldd "$work/build/consumer"; exit 1
fi
step=run-consumer
"$mpiexec" --oversubscribe --bind-to none -np 2 "$work/build/consumer"
# Every example builds against the installed package on its own.
step=configure-examples
cmake -S "$src_dir/examples" -B "$work/examples" -G Ninja \
      -DCMAKE_PREFIX_PATH="$work/moved" > "$work/examples-configure.log" 2>&1
step=build-examples
cmake --build "$work/examples" > "$work/examples-build.log" 2>&1
step=run-quickstart
"$mpiexec" --oversubscribe --bind-to none -np 2 "$work/examples/quickstart/quickstart"
echo "PASS: installed package found, relocated and used (consumer and examples)"
