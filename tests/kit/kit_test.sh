#!/usr/bin/env bash
# Proves the GPU kit on a machine without a GPU: packs BUILD like
# scripts/gpu_kit.sh (--no-build --no-archive), checks with ldd that
# libmpi, libopenblas, libcurl and libtutti resolve inside the kit, then,
# in a mount namespace where the system's copies of every packed library
# and OpenMPI's plugin, help and config folders are bind-mounted over with
# empty ones, runs CPU tests at np 2 (and GPU tests, which skip) from the
# packed tree's ctest files under `env -i` with PATH=kit/bin:/usr/bin:/bin
# and no LD_LIBRARY_PATH at all: the kit's files find its libraries through
# their RUNPATH ($ORIGIN), which is what keeps them away from other
# processes on the target (scripts/gpu_kit.sh).
# Exit: 0 passed; 1 failed; 77 the packing and ldd checks passed but the
# system's copies could not be hidden (unshare not permitted), so the run
# from the kit proves less: reported as skipped.
#
# usage: kit_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$(realpath "$1")
SRC=$(realpath "$2")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tutti-kit-test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
KIT=$WORK/tutti-gpukit
say() { echo "[kit_test] $*"; }

if ! bash "$SRC/scripts/gpu_kit.sh" --no-build --no-archive --build-dir "$BUILD" \
     --out "$WORK" > "$WORK/pack.log" 2>&1; then
  cat "$WORK/pack.log"; say "FAILED: packing"; exit 1
fi
tail -1 "$WORK/pack.log"

# 1. ldd, with no library path: RUNPATH alone must find the kit's copies.
KENV=(env -i PATH="$KIT/bin:/usr/bin:/bin")
fail=0
resolve() {  # resolve EXE LIB: LIB must resolve to a file inside the kit
  local where
  where=$("${KENV[@]}" ldd "$1" | awk -v l="$2" '$1 ~ "^"l {print $3}')
  if [[ $where == "$KIT"/* ]]; then
    say "ok: $(basename "$1") -> $2 from the kit"
  else
    say "FAILED: $(basename "$1") resolves $2 to '${where:-nothing}', not inside $KIT"
    fail=1
  fi
}
for lib in libmpi.so libopenblas.so libcurl.so libtutti.so; do
  resolve "$KIT/build/examples/quickstart/quickstart" "$lib"
done
resolve "$KIT/build/tests/preemption/test_preemption" libcurl.so
# The launcher and the MPI runtime of the MPI the build used: Open MPI 5
# (PRRTE's prterun and prted; components built into its libraries) or 4.1
# (orterun; plugins dlopened from lib/openmpi3).
if [ -e "$KIT/bin/prterun" ]; then
  resolve "$KIT/bin/prterun" libprrte.so
  resolve "$KIT/bin/prted" libpmix.so
  resolve "$KIT/lib/libmpi.so.40" libopen-pal.so
else
  resolve "$KIT/bin/orterun" libopen-rte.so
  resolve "$KIT/lib/openmpi3/mca_btl_vader.so" libopen-pal.so  # a plugin, dlopened
fi
[ $fail = 0 ] || exit 1

# 2. The tests from the kit's ctest files, with the system's copies hidden.
TESTS='^(test_amp_multirank_np2|test_dp_reduce_np2|test_tp_linear_np2|test_preemption_np1|example_gpu_cnn_cpu_np2|example_quickstart_np1|test_dp_gpu_np2|test_nccl_np2)$'
# ctest itself is the system's and links the system's libcurl, hidden below:
# it runs through the loader with the kit's libraries on a path that only
# that process sees (an environment variable would reach the tests too).
LOADER=$(ldd /bin/sh | awk '/ld-linux/ {print $1}')
# The build's own MPI prefix (Open MPI 5 in the project venv): its libraries,
# launcher and help files are hidden too.
MPI_PREFIX=$(dirname "$(dirname "$(realpath "$(sed -n 's/^TUTTI_MPIEXEC:FILEPATH=//p' "$BUILD/CMakeCache.txt")")")")
CTEST="$LOADER --library-path $KIT/lib $(command -v ctest)"
cat > "$WORK/run.sh" <<RUN
set -euo pipefail
hide=\${1:-0}
if [ "\$hide" = 1 ]; then
  mkdir -p "$WORK/empty.d"; : > "$WORK/empty.f"
  n=0
  for f in "$KIT"/lib/*.so*; do
    for d in /usr/lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/openblas-pthread /usr/local/lib \
             "$MPI_PREFIX/lib" "$MPI_PREFIX/lib/openmpi"; do
      [ -e "\$d/\$(basename "\$f")" ] || continue
      mount --bind "$WORK/empty.f" "\$(realpath "\$d/\$(basename "\$f")")"; n=\$((n + 1))
    done
  done
  for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /usr/share/openmpi /etc/openmpi \
           "$MPI_PREFIX/share/openmpi" "$MPI_PREFIX/share/prte" "$MPI_PREFIX/share/pmix"; do
    [ -d "\$d" ] && mount --bind "$WORK/empty.d" "\$d" && n=\$((n + 1))
  done
  for b in /usr/bin/orterun /usr/bin/orted "$MPI_PREFIX/bin/prterun" "$MPI_PREFIX/bin/prted"; do
    [ -e "\$b" ] && mount --bind "$WORK/empty.f" "\$(realpath "\$b")" && n=\$((n + 1))
  done
  echo "[kit_test] hid \$n system files and folders (libmpi, libopenblas, libcurl, OpenMPI's plugins ...)"
fi
exec env -i PATH="$KIT/bin:/usr/bin:/bin" \
  HOME="$WORK" TMPDIR="$WORK" bash -c '
    . "$KIT/env.sh" "$SRC"
    [ "\$(command -v mpiexec)" = "$KIT/bin/mpiexec" ] || { echo "mpiexec is not the kit'"'"'s"; exit 1; }
    $CTEST --test-dir "$KIT/build" -R "$TESTS" --output-on-failure -j1'
RUN
if unshare --mount --propagation private true 2>/dev/null; then
  unshare --mount --propagation private bash "$WORK/run.sh" 1 || { say "FAILED: tests from the kit"; exit 1; }
  say "passed: CPU tests from the kit with the system's copies hidden"
else
  bash "$WORK/run.sh" 0 || { say "FAILED: tests from the kit"; exit 1; }
  say "unshare --mount is not permitted here: the system's copies were not hidden; skipped"
  exit 77
fi
