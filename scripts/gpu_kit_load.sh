# Sourced by scripts/gpu_check.sh and scripts/gpu_overlap.sh: loads the kit
# that scripts/gpu_kit.sh packed (docs/gpu.md).
#
#   . scripts/gpu_kit_load.sh
#   kit_load SOURCE WORK LOG REPO
#
# SOURCE is the archive (.tar.xz) or an unpacked kit folder; an archive is
# unpacked under WORK.  Sources the kit's env.sh with the repository copy
# REPO (PATH, LD_LIBRARY_PATH, OpenMPI's relocation, the ctest files), then,
# where the loader cannot find CUDA, NCCL or cuDNN for the kit's executables,
# adds the toolkit's and the Python wheels' (nvidia/*/lib) folders to
# LD_LIBRARY_PATH.  Output goes to LOG.
# Sets KIT (the kit's folder) and returns 0, or sets KIT_ERROR (what is
# wrong, for a report) and returns 1; KIT is empty when nothing was loaded.

kit_load() {
  local src=$1 work=$2 log=$3 repo=$4 probe_exe d
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
  . "$KIT/env.sh" "$repo"
  cat "$KIT/KIT_INFO" >> "$log"
  probe_exe=$KIT/build/examples/gpu_cnn/gpu_cnn
  [ -x "$probe_exe" ] || probe_exe=$KIT/build/bench/data_parallel/bench_dp
  if ldd "$probe_exe" 2>/dev/null | grep -q 'not found'; then
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib \
             $(python3 -c "import nvidia, os; p = nvidia.__path__[0]; print(' '.join(os.path.join(p, d, 'lib') for d in os.listdir(p)))" 2>/dev/null); do
      [ -d "$d" ] || continue
      LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
      ldd "$probe_exe" | grep -q 'not found' || break
    done
    export LD_LIBRARY_PATH
  fi
  if ldd "$probe_exe" 2>/dev/null | grep -q 'not found'; then
    KIT_ERROR="libraries not found: $(ldd "$probe_exe" | awk '/not found/ {print $1}' | tr '\n' ' ')"
    return 1
  fi
  return 0
}
