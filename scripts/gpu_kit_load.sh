# Sourced by scripts/gpu_check.sh and scripts/gpu_overlap.sh: loads the kit
# that scripts/gpu_kit.sh packed (docs/gpu.md).
#
#   . scripts/gpu_kit_load.sh
#   kit_load SOURCE WORK LOG REPO
#
# SOURCE is the archive (.tar.xz) or an unpacked kit folder; an archive is
# unpacked under WORK.  Sources the kit's env.sh with the repository copy
# REPO (empty: the kit's own source snapshot, KIT_REPO) (PATH, OpenMPI's relocation, the ctest files; the kit's own libraries
# are found through RUNPATH), then, for each CUDA library (cudart, cuBLAS,
# NCCL, cuDNN) the loader cannot find for the kit's executables, adds the
# folder that holds it (the Python wheels' nvidia/*/lib first, then the
# toolkit's) to LD_LIBRARY_PATH.  Output goes to LOG.
# Sets KIT (the kit's folder) and returns 0, or sets KIT_ERROR (what is
# wrong, for a report) and returns 1; KIT is empty when nothing was loaded.

kit_load() {
  local src=$1 work=$2 log=$3 repo=$4 probe_exe
  KIT="" KIT_ERROR=""
  if [ -d "$src" ] && [ -f "$src/env.sh" ]; then
    KIT=$(cd "$src" && pwd)
  elif [ -f "$src" ]; then
    echo "unpacking $src" >> "$log"
    if command -v xz >/dev/null; then
      tar -C "$work" -xJf "$src" >> "$log" 2>&1
    else  # Python's tarfile reads xz without the xz tool
      python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
        "$src" "$work" >> "$log" 2>&1
    fi
    [ -f "$work/tutti-gpukit/env.sh" ] && KIT=$work/tutti-gpukit
  fi
  if [ -z "$KIT" ]; then
    KIT_ERROR="no kit at $src (run scripts/gpu_kit.sh here and carry .gpukit/tutti-gpukit.tar.xz)"
    return 1
  fi
  # shellcheck source=/dev/null
  . "$KIT/env.sh" "${repo:-$KIT/repo}"
  cat "$KIT/KIT_INFO" >> "$log"
  # The kit's files find the kit's libraries through their RUNPATH; the
  # CUDA libraries (cudart, cuBLAS, NCCL, cuDNN) are the image's.  For each
  # one the loader cannot find, the folder that holds it is added to
  # LD_LIBRARY_PATH: the Python wheels' first (nvidia/*/lib, the copies the
  # image's torch loads), then the toolkit's, then ld.so's cache.
  local exes=() lib dirs dir
  for probe_exe in "$KIT/build/examples/gpu_cnn/gpu_cnn" "$KIT/build/libtutti.so.0" \
                   "$KIT/build/tests/comm/nccl_watchdog_probe"; do
    [ -e "$probe_exe" ] && exes+=("$probe_exe")
  done
  dirs=$(python3 -c "import nvidia, os; p = nvidia.__path__[0]; print(' '.join(os.path.join(p, d, 'lib') for d in sorted(os.listdir(p))))" 2>/dev/null)
  dirs="$dirs /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu"
  for lib in $(for e in "${exes[@]}"; do ldd "$e" 2>/dev/null; done | awk '/not found/ {print $1}' | sort -u); do
    for dir in $dirs; do
      if [ -e "$dir/$lib" ]; then
        LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$dir
        echo "found $lib in $dir (added to LD_LIBRARY_PATH)" >> "$log"
        break
      fi
    done
  done
  export LD_LIBRARY_PATH
  local still
  still=$(for e in "${exes[@]}"; do ldd "$e" 2>/dev/null; done | awk '/not found/ {print $1}' | sort -u | tr '\n' ' ')
  if [ -n "$still" ]; then
    KIT_ERROR="libraries not found: $still"
    return 1
  fi
  return 0
}
