#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the demo under
# mpirun on the CPU.  (Until the end-to-end demo lands this runs the
# quickstart example: an all-reduce round on every rank.)
#
#   scripts/demo.sh            # 2 ranks
#   TUTTI_DEMO_NP=4 scripts/demo.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD=${TUTTI_BUILD_DIR:-build}
NP=${TUTTI_DEMO_NP:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
scripts/install_deps.sh
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="${TUTTI_CUDA_ARCHITECTURES:-90}" > /dev/null
cmake --build "$BUILD" -j "$(nproc)" --target quickstart
mpirun --oversubscribe --bind-to none -np "$NP" "$BUILD/examples/quickstart/quickstart"
