#!/usr/bin/env bash
# The main job (README command one): installs what is missing, builds, and
# runs a data-parallel training job under tutti-run/mpirun on the CPU that
# goes through a spot interruption: compressed all-reduce, float16 loss
# scaling, asynchronous checkpoints, a mock AWS spot notice mid-run, the
# coordinated save-and-exit, the automatic restart, and training finishing
# from the checkpoint with the same parameters an uninterrupted run ends
# with.  Writes demo-out/ (logs, checkpoints, loss.png).
#
#   scripts/demo.sh                       # 4 ranks, 300 steps
#   scripts/demo.sh --np 2 --steps 200 --compression onebit
#   scripts/demo.sh --timeline             # also a Chrome/Perfetto trace of every rank
#                                          # (demo-out/timeline.json, timeline.png; the summary
#                                          # shows the overlap; docs/timeline.md)
#   scripts/demo.sh --elastic              # 4 -> 2 -> 4 ranks under tutti-run --min-np/--max-np,
#                                          # goodput summary; then two killed ranks, restart
#                                          # path against in-process recovery (docs/examples.md)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD=${TUTTI_BUILD_DIR:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One host, no fabric: skip Open MPI's libfabric probe (~1 s per MPI_Init;
# docs/install.md).  A value set by the caller wins.
export OMPI_MCA_btl=${OMPI_MCA_btl:-^ofi} OMPI_MCA_mtl=${OMPI_MCA_mtl:-^ofi}
scripts/install_deps.sh
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  ${TUTTI_MPI_HOME:+-DTUTTI_MPI_HOME="$TUTTI_MPI_HOME"} \
  -DCMAKE_CUDA_ARCHITECTURES="${TUTTI_CUDA_ARCHITECTURES:-90}" > /dev/null
cmake --build "$BUILD" -j "$(nproc)" --target dp_train
# tutti-run starts the mpirun of the MPI dp_train was built against (Open
# MPI 5 in .venv by default, docs/install.md), not whichever is on PATH.
if [ -z "${TUTTI_MPIRUN:-}" ]; then
  TUTTI_MPIRUN=$(sed -n 's/^MPIEXEC_EXECUTABLE:FILEPATH=//p' "$BUILD/CMakeCache.txt")
  export TUTTI_MPIRUN=${TUTTI_MPIRUN:-mpirun}
fi
exec .venv/bin/python scripts/demo.py --build "$BUILD" "$@"
