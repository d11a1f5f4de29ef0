#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what is missing, builds
# tutti once (C++, CUDA paths compiled when nvcc exists, the Python
# extension into the build tree), and runs every test (ctest drives the C++
# tests, the multi-rank mpiexec tests, the script-driven fault tests and
# pytest).
#
#   scripts/test.sh                 # everything
#   scripts/test.sh -L comm         # extra arguments go to ctest
#
# Environment: TUTTI_BUILD_DIR (default build), TUTTI_CUDA_ARCHITECTURES
# (default 90 to keep CI fast; the library's own default is "80;90"),
# TUTTI_TEST_JOBS (default: number of cores), TUTTI_MPI (which MPI
# install_deps.sh provides: openmpi5, the default, or system) and
# TUTTI_MPI_HOME (the prefix of the MPI to build against; default: .venv's
# Open MPI 5 when it is there, else the system's; docs/install.md).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD=${TUTTI_BUILD_DIR:-build}
JOBS=${TUTTI_TEST_JOBS:-$(nproc)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

scripts/install_deps.sh
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="${TUTTI_CUDA_ARCHITECTURES:-90}" \
  ${TUTTI_MPI_HOME:+-DTUTTI_MPI_HOME="$TUTTI_MPI_HOME"} \
  -DTUTTI_BUILD_TESTS=ON -DTUTTI_BUILD_BENCH=ON -DTUTTI_BUILD_EXAMPLES=ON \
  -DTUTTI_PYTHON="$ROOT/.venv/bin/python" -DTUTTI_BUILD_PYTHON=ON
# One compile: the extension is built in this tree (python_pkg/) and the
# Python tests and examples import it from there.  `pip install .` (which
# compiles the library again in scikit-build-core's own tree) is checked by
# scripts/check_pip_install.sh instead (docs/contributing.md).
cmake --build "$BUILD" -j "$JOBS"
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" "$@"
