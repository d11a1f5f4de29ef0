#!/usr/bin/env bash
# Builds tutti, its tests and benchmarks for sm_90 on this (GPU-less) machine
# and packs everything a bare H100/H200 node lacks into one archive:
#
#   .gpukit/tutti-gpukit.tar.xz     carry this path to the GPU machine
#   .gpukit/tutti-gpukit/           the same tree, unpacked (for the proof)
#
# The tree:
#   build/    the build tree's executables (tests, benchmarks, examples),
#             libtutti and ctest's CTestTestfile.cmake files, whose absolute
#             paths are placeholders that env.sh fills in on the target
#   bin/      the launcher of the MPI the build used: Open MPI 5 (the
#             project venv's wheel): mpiexec/mpirun, prterun, prted,
#             ompi_info; Open MPI 4.1 (Debian's): orterun as mpirun/mpiexec,
#             orted, ompi_info
#   sbin/     iproute2's ip and tc with their own libraries (sbin/lib), for
#             scripts/gpu_overlap.sh's rig; not on env.sh's PATH
#   lib/      every shared library ldd names that a CUDA/Ubuntu base image
#             does not have (OpenMPI, PMIx, hwloc, libevent, OpenBLAS,
#             libgfortran, libcurl and its TLS/compression/LDAP/... chain,
#             xxHash, Google Benchmark); for Open MPI 4.1 its plugins
#             (lib/openmpi3) and PMIx's (pmix/lib/pmix; Open MPI 5 has its
#             components built in)
#   share/    Open MPI's, PRRTE's and PMIx's help files; etc/ the default
#             MCA params
#   include/  pybind11's headers, in case the target's pip lacks them
#   repo/     the sources it was built from (no docs): test scripts, Python
#             tests, headers for the extension built on the target
#   wheels/   pytest and its pure-Python dependencies, for a target whose
#             python3 lacks them
#   env.sh    `. env.sh REPO`: PATH and OPAL_*/PRTE_*/PMIX_* so the
#             relocated Open MPI finds its plugins and help files, and the ctest files
#             pointed at this tree and the repository copy REPO; every ELF
#             file finds the kit's libraries through its RUNPATH ($ORIGIN),
#             so no LD_LIBRARY_PATH shadows the target's libraries
#   KIT_INFO  commit, date, compiler, what was left out and why
# Not packed (the target image has them): glibc, libstdc++/libgcc_s (the
# target's are newer; ours would shadow them in torch's process), CUDA's
# runtime, cuBLAS, NCCL, cuDNN, the driver.  The Python extension is built
# on the target by scripts/gpu_check.sh from the repository copy (its Python
# is 3.12, ours 3.11).
#
# usage: scripts/gpu_kit.sh [--build-dir DIR] [--out DIR] [--no-build]
#                           [--no-archive] [--jobs N]
#   --no-build    pack an existing build tree (the kit ctest packs its own)
#   --no-archive  stop after the tree (no .tar.xz, no 64 MiB check)
# Exit status: 0 packed (and within 64 MiB), 1 build or packing failed,
# 2 the archive exceeds 64 MiB.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build-gpu
OUT=$ROOT/.gpukit
DO_BUILD=1
DO_ARCHIVE=1
JOBS=${JOBS:-2}
LIMIT=$((64 * 1024 * 1024))
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) BUILD=$(realpath -m "$2"); shift 2 ;;
    --out) OUT=$(realpath -m "$2"); shift 2 ;;
    --no-build) DO_BUILD=0; shift ;;
    --no-archive) DO_ARCHIVE=0; shift ;;
    --jobs) JOBS=$2; shift 2 ;;
    *) echo "gpu_kit.sh: unknown argument '$1'" >&2; exit 1 ;;
  esac
done
log() { echo "[gpu_kit] $*"; }

# ---- 1. build ----------------------------------------------------------------
if [ $DO_BUILD = 1 ]; then
  launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache
              -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  # TUTTI_GPU_PYTHON=python3: the gpu-labelled Python tests run whatever
  # python3 the target's PATH names (its CUDA PyTorch).
  log "configuring $BUILD (Release, sm_90)"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DTUTTI_WITH_CUDA=ON -DTUTTI_WITH_NCCL=ON \
    -DTUTTI_BUILD_TESTS=ON -DTUTTI_BUILD_BENCH=ON -DTUTTI_BUILD_EXAMPLES=ON \
    -DTUTTI_BUILD_PYTHON=OFF -DTUTTI_GPU_PYTHON=python3 "${launcher[@]}" >/dev/null
  log "building with -j$JOBS"
  cmake --build "$BUILD" -j"$JOBS"
fi
[ -f "$BUILD/CMakeCache.txt" ] || { echo "gpu_kit.sh: no build tree at $BUILD" >&2; exit 1; }
grep -q '^TUTTI_WITH_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt" ||
  log "warning: $BUILD is not a CUDA build (the GPU tests will skip on the target)"

# ---- 2. the tree -------------------------------------------------------------
KIT=$OUT/tutti-gpukit
rm -rf "$KIT"
mkdir -p "$KIT"/{bin,sbin,lib,build,share,etc,include}
SOURCE_DIR=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt")
MPIEXEC=$(sed -n 's/^TUTTI_MPIEXEC:FILEPATH=//p' "$BUILD/CMakeCache.txt")
is_elf() { [ "$(head -c4 "$1" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ]; }

# Executables and ctest files, at their build-tree paths.
(cd "$BUILD" && find tests bench examples -path '*/CMakeFiles' -prune -o -type f -print) |
while read -r rel; do
  src=$BUILD/$rel
  case $rel in
    */CTestTestfile.cmake) ;;
    *) [ -x "$src" ] && is_elf "$src" || continue ;;
  esac
  mkdir -p "$KIT/build/$(dirname "$rel")"
  cp -p "$src" "$KIT/build/$rel"
done
cp -p "$BUILD/CTestTestfile.cmake" "$KIT/build/"
cp -P "$BUILD"/libtutti.so* "$KIT/build/"
find "$KIT/build" -type f ! -name '*.cmake' -exec strip --strip-unneeded {} + 2>/dev/null || true
# Absolute paths become placeholders (the launcher first: Open MPI 5's lies
# in the project venv, inside the source tree; then the build tree, which
# may lie inside the source tree too).  The launcher's path also stands in
# the tests' environment (TUTTI_MPIRUN).  The tests launch through
# build/tests/mpiexec, a script that clears killed launchers' leftovers on
# this machine (tests/common/mpiexec.sh.in); a fresh target has none, so the
# kit's tests call its mpiexec directly.
find "$KIT/build" -name CTestTestfile.cmake | while read -r f; do
  sed -i -e "s|$BUILD/tests/mpiexec|@KIT_BIN@/mpiexec|g" -e "s|$MPIEXEC|@KIT_BIN@/mpiexec|g" \
         -e "s|$BUILD|@KIT_BUILD@|g" -e "s|$SOURCE_DIR|@REPO@|g" "$f"
done

# Open MPI: launcher, daemon, plugins, help files, default parameters, from
# the MPI the build used (its mpiexec's prefix).  Open MPI 5 (PRRTE's
# prterun beside mpiexec) keeps its components inside its libraries, which
# the library closure below packs; 4.1 has orterun and plugin folders.
# Plugins that pull in fabric stacks (UCX, libfabric, PSM, verbs) stay out:
# the kit runs on one node over shared memory, and their libraries would
# cost megabytes.  Open MPI skips components it does not find.
MPI_PREFIX=$(dirname "$(dirname "$(realpath "$MPIEXEC")")")
HEAVY='libucp|libucs|libuct|libfabric|libpsm|libibverbs|librdmacm|libjvm|libmlx|libefa|libosm'
left_out=()
if [ -x "$MPI_PREFIX/bin/prterun" ]; then
  KIT_MPI=openmpi5
  OMPI_INFO=$MPI_PREFIX/bin/ompi_info
  # mpiexec/mpirun are a small wrapper that sets OPAL_PREFIX from its own
  # location and starts ompirun_wrapper, which starts prterun.
  for b in mpiexec mpirun ompirun_wrapper prterun prted prte ompi_info; do
    [ -e "$MPI_PREFIX/bin/$b" ] && cp -p "$MPI_PREFIX/bin/$b" "$KIT/bin/"
  done
  for d in openmpi prte pmix; do
    [ -d "$MPI_PREFIX/share/$d" ] && cp -rp "$MPI_PREFIX/share/$d" "$KIT/share/$d"
  done
  for f in "$MPI_PREFIX"/etc/*; do [ -f "$f" ] && cp -p "$f" "$KIT/etc/"; done
  # Its libraries, flat in lib/ (the launcher's own RUNPATH, $ORIGIN/../lib,
  # then finds them before the RUNPATHs are rewritten below).  The fabric
  # providers libfabric and UCX would dlopen stay out (libmpi needs
  # libfabric and UCX themselves).
  for f in "$MPI_PREFIX"/lib/libmpi.so.* "$MPI_PREFIX"/lib/libopen-pal.so.* "$MPI_PREFIX"/lib/openmpi/*.so*; do
    [ -f "$f" ] && cp -pL "$f" "$KIT/lib/"
  done
  for d in "$MPI_PREFIX"/lib/openmpi/libfabric "$MPI_PREFIX"/lib/openmpi/ucx; do
    [ -d "$d" ] && left_out+=("$(basename "$d")/")
  done
else
  KIT_MPI=openmpi4
  ompi_path() { ompi_info --path "$1" --parsable | sed -n "s/^path:$1://p"; }
  OMPI_INFO=ompi_info
  OMPI_PKGLIB=$(ompi_path pkglibdir)
  OMPI_PKGDATA=$(ompi_path pkgdatadir)
  OMPI_SYSCONF=$(ompi_path sysconfdir)
  OMPI_BIN=$(ompi_path bindir)
  for b in orterun orted ompi_info; do cp -p "$OMPI_BIN/$b" "$KIT/bin/"; done
  ln -s orterun "$KIT/bin/mpirun"
  ln -s orterun "$KIT/bin/mpiexec"
  cp -rp "$OMPI_PKGDATA" "$KIT/share/openmpi"
  mkdir -p "$KIT/etc/openmpi"
  cp -p "$OMPI_SYSCONF"/openmpi-mca-params.conf "$KIT/etc/openmpi/"
  mkdir -p "$KIT/lib/openmpi3"
  for p in "$OMPI_PKGLIB"/*.so; do
    deps=$(ldd "$p" 2>/dev/null || true)
    if grep -Eq "$HEAVY|not found" <<<"$deps"; then
      left_out+=("$(basename "$p")")
      continue
    fi
    cp -p "$p" "$KIT/lib/openmpi3/"
  done
  # PMIx (OpenMPI's external runtime interface): plugins and help files in
  # its own prefix, relocated with PMIX_INSTALL_PREFIX.
  PMIX_LIB=$(ldd "$KIT/lib/openmpi3/mca_pmix_ext3x.so" 2>/dev/null | awk '/libpmix/ {print $3}')
  if [ -n "$PMIX_LIB" ]; then
    PMIX_PREFIX=$(dirname "$(dirname "$(realpath "$PMIX_LIB")")")
    mkdir -p "$KIT/pmix/lib" "$KIT/pmix/share"
    [ -d "$PMIX_PREFIX/lib/pmix" ] && cp -rp "$PMIX_PREFIX/lib/pmix" "$KIT/pmix/lib/"
    [ -d "$PMIX_PREFIX/share/pmix" ] && cp -rp "$PMIX_PREFIX/share/pmix" "$KIT/pmix/share/"
  fi
fi
log "MPI: $KIT_MPI from $MPI_PREFIX"
# pybind11's headers (Debian's pybind11-dev), should the target's pip lack them.
for d in /usr/include/pybind11; do [ -d "$d" ] && cp -rp "$d" "$KIT/include/"; done

# iproute2's ip and tc, for the two-host network-namespace rig of
# scripts/gpu_overlap.sh (CUDA images lack iproute2): the programs in
# sbin/libexec, the libraries only they need in sbin/lib (not lib/, whose
# copies would shadow the machine's in every process), and sbin/ip, sbin/tc
# starting them through the loader with that library path, so that the
# commands `ip netns exec` starts inherit no library path of theirs.
# env.sh leaves sbin/ off PATH: gpu_overlap.sh uses it only where the
# machine has no iproute2.
mkdir -p "$KIT/sbin/libexec" "$KIT/sbin/lib"
LOADER=$(ldd /bin/sh | awk '/ld-linux/ {print $1}')
for b in ip tc; do
  p=$(command -v "$b" || true)
  [ -n "$p" ] || continue
  cp -pL "$p" "$KIT/sbin/libexec/"
  ldd "$p" | awk '$2 == "=>" {print $1, $3}' | while read -r name path; do
    [[ $name =~ ^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt)\.so ]] ||
      cp -L "$path" "$KIT/sbin/lib/$name"
  done
  cat > "$KIT/sbin/$b" <<EOF
#!/bin/sh
d=\$(dirname "\$(readlink -f "\$0")")
exec $LOADER --library-path "\$d/lib" "\$d/libexec/$b" "\$@"
EOF
  chmod +x "$KIT/sbin/$b"
done
# Shared libraries: the closure ldd reports for everything packed so far,
# minus what every CUDA/Ubuntu image has.
BASE='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libstdc\+\+|libgcc_s)\.so'
CUDA='^lib(cuda|cudart|cublas|cublasLt|nccl|cudnn[a-z_]*|nvidia-[a-z-]*|nvrtc|nvJitLink|cufft|curand|cusparse|cusolver)\.so'
# (pmix/ exists for Open MPI 4.1 only: find's complaint about it is no failure.)
elfs=$(find "$KIT/build" "$KIT/bin" "$KIT/lib" "$KIT/pmix" -type f 2>/dev/null |
       while read -r f; do is_elf "$f" && echo "$f"; done) || true
missing=()
for f in $elfs; do ldd "$f" 2>/dev/null || true; done |
  awk '$2 == "=>" {print $1, $3}' | sort -u |
while read -r name path; do
  if [[ $name =~ $BASE || $name =~ $CUDA || $path == /usr/local/cuda* ]]; then continue; fi
  case $name in libtutti.so*) continue ;; esac
  if [ "$path" = "not" ]; then echo "MISSING $name"; continue; fi
  [ -e "$KIT/lib/$name" ] || cp -L "$path" "$KIT/lib/$name"
done > "$OUT/.kit_missing"
if grep -q MISSING "$OUT/.kit_missing"; then
  log "unresolved libraries (not packed):"; cat "$OUT/.kit_missing"
fi

# Every packed ELF file finds the kit's libraries through its own RUNPATH,
# relative to where it lies ($ORIGIN), so that nothing else on the target
# does: env.sh puts no kit folder on LD_LIBRARY_PATH, where the kit's
# libcurl, libssl or libgfortran would shadow the image's own in torch's
# process and in the compilers.  The CUDA toolkit's usual folders come last
# (the image's libcudart, cuBLAS; NCCL from the Python wheels is found by
# scripts/gpu_kit_load.sh where needed).
command -v patchelf >/dev/null ||
  { echo "gpu_kit.sh: patchelf is missing (scripts/install_deps.sh installs it)" >&2; exit 1; }
relpath() { python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$1" "$2"; }
declare -A RUNPATH_OF   # folder -> its RUNPATH (one relpath computation per folder)
CUDA_RUNPATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:/usr/local/cuda/targets/x86_64-linux/lib
patched=0
while read -r f; do
  is_elf "$f" || continue
  d=$(dirname "$f")
  [ -n "${RUNPATH_OF[$d]:-}" ] || RUNPATH_OF[$d]="\$ORIGIN/$(relpath "$KIT/lib" "$d"):\$ORIGIN/$(relpath "$KIT/build" "$d"):$CUDA_RUNPATH"
  patchelf --set-rpath "${RUNPATH_OF[$d]}" "$f" 2>>"$OUT/.kit_patchelf" && patched=$((patched + 1))
done < <(find "$KIT/build" "$KIT/bin" "$KIT/lib" "$KIT/pmix" -type f 2>/dev/null)
if [ -s "$OUT/.kit_patchelf" ]; then
  log "patchelf complained:"; sort -u "$OUT/.kit_patchelf" | head -5
fi
rm -f "$OUT/.kit_patchelf"
log "RUNPATH set on $patched ELF files"

# The sources the kit was built from (tracked and untracked, not ignored;
# no docs): the ctest files' scripts and Python tests, and the headers the
# Python extension is compiled against on the target, come from this copy,
# so the kit stays consistent with itself whatever the working tree that
# travels with it holds by then.
mkdir -p "$KIT/repo"
(cd "$SOURCE_DIR" && git ls-files -co --exclude-standard -- CMakeLists.txt include src kernels \
   python tests scripts bench examples cmake pyproject.toml 2>/dev/null |
   while read -r f; do [ -f "$f" ] && echo "$f"; done | tar -cf - -T -) | tar -C "$KIT/repo" -xf -
log "source snapshot: $(find "$KIT/repo" -type f | wc -l) files"

# Pure-Python wheels the Python GPU tests need (pytest and its dependencies),
# installed on the target only where its python3 lacks them.  Downloaded
# once into .gpukit/wheels (the archive needs them; a tree packed with
# --no-archive, as the kit ctest does, takes what is there).
WHEELS=$ROOT/.gpukit/wheels
mkdir -p "$KIT/wheels" "$WHEELS"
if [ $DO_ARCHIVE = 1 ] && ! ls "$WHEELS"/pytest-*.whl >/dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$WHEELS" \
    pytest pluggy iniconfig packaging pygments > "$OUT/.kit_wheels" 2>&1 ||
    { log "warning: could not download pytest's wheels (the target must have pytest):"
      tail -3 "$OUT/.kit_wheels"; }
  rm -f "$OUT/.kit_wheels"
fi
cp "$WHEELS"/*.whl "$KIT/wheels/" 2>/dev/null || true

# ---- 3. env.sh and KIT_INFO --------------------------------------------------
{
cat <<'EOF'
# Source it: `. tutti-gpukit/env.sh [REPO]` (default: the kit's own source
# snapshot, repo/, which matches the binaries).
# Puts the kit's mpirun first on PATH, relocates Open MPI and PMIx, and writes
# the ctest files with this machine's paths.  No LD_LIBRARY_PATH: the kit's
# executables and libraries find each other through their RUNPATH.
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KIT_REPO=$(cd "${1:-$KIT/repo}" && pwd)
export PATH=$KIT/bin:$PATH
# Root in containers; oversubscription for np > cores on small machines
# (Open MPI 4.1's variable and Open MPI 5's PRRTE one; each ignores the other).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 PRTE_MCA_rmaps_default_mapping_policy=slot:oversubscribe
EOF
if [ "$KIT_MPI" = openmpi5 ]; then
cat <<'EOF'
# Open MPI 5 (the wheel's layout: bin/, lib/, share/, etc/): its mpiexec
# sets OPAL_PREFIX from where it lies; PRRTE and PMIx are told too.
export OPAL_PREFIX=$KIT PRTE_PREFIX=$KIT PMIX_PREFIX=$KIT
# Containers often forbid the cross-process reads (CMA) of the shared-memory
# transport's single-copy path; MPI only bootstraps NCCL here, so copy twice.
export OMPI_MCA_smsc=^cma
EOF
else
cat <<'EOF'
# Open MPI 4.1: plugins in lib/openmpi3, PMIx's in pmix/.
export OPAL_PREFIX=$KIT OPAL_EXEC_PREFIX=$KIT OPAL_BINDIR=$KIT/bin OPAL_SBINDIR=$KIT/bin
export OPAL_LIBEXECDIR=$KIT/bin OPAL_LIBDIR=$KIT/lib OPAL_INCLUDEDIR=$KIT/include
export OPAL_DATAROOTDIR=$KIT/share OPAL_DATADIR=$KIT/share OPAL_SYSCONFDIR=$KIT/etc/openmpi
export OPAL_PKGDATADIR=$KIT/share/openmpi OPAL_PKGLIBDIR=$KIT/lib/openmpi3
export OPAL_PKGINCLUDEDIR=$KIT/include
export OMPI_MCA_mca_base_component_path=$KIT/lib/openmpi3
export PMIX_INSTALL_PREFIX=$KIT/pmix PMIX_MCA_mca_base_component_path=$KIT/pmix/lib/pmix
# Containers often forbid the cross-process reads (CMA) of the shared-memory
# transport's single-copy path; MPI only bootstraps NCCL here, so copy twice.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
EOF
fi
cat <<'EOF'
# An image with PMIx of its own at the same path as ours (Ubuntu's pmix2):
# its plugins fail to load into our PMIx (seen on the H100 image), which is
# harmless but printed for every process; so is the compression warning.
export PMIX_MCA_mca_base_component_show_load_errors=0 PMIX_MCA_pcompress_base_silence_warning=1
find "$KIT/build" -name CTestTestfile.cmake | while read -r f; do
  [ -f "$f.in" ] || cp "$f" "$f.in"
  sed -e "s|@KIT_BUILD@|$KIT/build|g" -e "s|@REPO@|$KIT_REPO|g" \
      -e "s|@KIT_BIN@|$KIT/bin|g" "$f.in" > "$f"
done
EOF
} > "$KIT/env.sh"
{
  echo "tutti GPU kit"
  echo "built:    $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "commit:   $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo '+dirty')"
  echo "compiler: $(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt"), $(nvcc --version 2>/dev/null | tail -1)"
  echo "cuda archs: $(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$BUILD/CMakeCache.txt")"
  echo "openmpi:  $("$OMPI_INFO" 2>/dev/null | sed -n 's/^ *Open MPI: //p' | head -1) ($KIT_MPI)"
  echo "left out (OpenMPI plugins needing fabric stacks): ${left_out[*]:-none}"
  echo "unresolved on the build machine: $(grep -c MISSING "$OUT/.kit_missing" || true)"
  echo "wheels:   $(cd "$KIT/wheels" && ls *.whl 2>/dev/null | tr '\n' ' ')"
} > "$KIT/KIT_INFO"
rm -f "$OUT/.kit_missing"
log "tree: $KIT ($(du -sh "$KIT" | cut -f1), $(find "$KIT/build" -type f -perm -u+x | wc -l) executables, $(ls "$KIT/lib" | wc -l) libraries)"

# ---- 4. the archive ----------------------------------------------------------
[ $DO_ARCHIVE = 1 ] || exit 0
ARCHIVE=$OUT/tutti-gpukit.tar.xz
log "packing $ARCHIVE"
tar -C "$OUT" -cf - tutti-gpukit | xz -T"$JOBS" -6 > "$ARCHIVE.tmp"
mv "$ARCHIVE.tmp" "$ARCHIVE"
size=$(stat -c %s "$ARCHIVE")
log "bundle size: $size bytes ($((size / 1024 / 1024)) MiB of 64 MiB)"
if [ "$size" -gt "$LIMIT" ]; then
  echo "gpu_kit.sh: $ARCHIVE is $size bytes, over the 64 MiB a GPU run can carry" >&2
  exit 2
fi
log "carry '.gpukit/tutti-gpukit.tar.xz' and run: bash scripts/gpu_check.sh"
