#!/usr/bin/env bash
# Installs tutti from BUILD_DIR, moves the installed tree elsewhere (it must
# be relocatable), builds the consumer project against it with
# find_package(tutti), and runs it under mpiexec.
set -euo pipefail
build_dir=$1 src_dir=$2 mpiexec=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/first" > "$work/install.log"
mv "$work/first" "$work/moved"
cmake -S "$src_dir/tests/install/consumer" -B "$work/build" -G Ninja \
      -DCMAKE_PREFIX_PATH="$work/moved" > "$work/configure.log"
cmake --build "$work/build" > "$work/build.log"
# The consumer must resolve libtutti from the moved prefix, not the build tree.
if ldd "$work/build/consumer" | grep -q "$build_dir"; then
  echo "FAIL: consumer links libtutti from the build tree"; ldd "$work/build/consumer"; exit 1
fi
"$mpiexec" --oversubscribe --bind-to none -np 2 "$work/build/consumer"
# Every example builds against the installed package on its own.
cmake -S "$src_dir/examples" -B "$work/examples" -G Ninja \
      -DCMAKE_PREFIX_PATH="$work/moved" > "$work/examples-configure.log"
cmake --build "$work/examples" > "$work/examples-build.log" || {
  tail -30 "$work/examples-build.log"; exit 1; }
"$mpiexec" --oversubscribe --bind-to none -np 2 "$work/examples/quickstart/quickstart"
echo "PASS: installed package found, relocated and used (consumer and examples)"
