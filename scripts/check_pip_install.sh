#!/usr/bin/env bash
# `pip install <checkout>` works from a read-only checkout and writes
# nothing into it.  Not part of scripts/test.sh, which compiles the library
# once, in its own CMake tree: this compiles it a second time through
# scikit-build-core (a few CPU-minutes).  Run it after changing
# pyproject.toml, python/CMakeLists.txt or the install rules.
#
#   scripts/check_pip_install.sh            # uses .venv/bin/python
#
# It copies the tracked files (git ls-files) to a scratch checkout, makes it
# read-only (a read-only bind mount when this runs as root and unshare is
# available, else file modes), installs it into a scratch directory with
# the project venv's build tools, checks that the checkout is byte-for-byte unchanged
# (no new, changed or removed file), and imports the installed package.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${TUTTI_PYTHON:-$ROOT/.venv/bin/python}
work=$(mktemp -d "${TMPDIR:-/tmp}/tutti-pipcheck.XXXXXX")
trap 'rm -rf "$work"' EXIT
src=$work/src
mkdir -p "$src"
(cd "$ROOT" && git ls-files -z | xargs -0 cp --parents -t "$src")
snapshot() { (cd "$src" && find . -printf '%p %s %T@\n' | sort && find . -type f -print0 | sort -z | xargs -0 sha256sum); }
snapshot > "$work/before"
chmod -R a-w "$src"
# Into a scratch target directory, with the project venv's build tools
# (scikit-build-core, pybind11: --no-build-isolation).
pip_cmd=("$PY" -m pip install -q --disable-pip-version-check
         --no-build-isolation --no-deps --target "$work/site"
         --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES="${TUTTI_CUDA_ARCHITECTURES:-90}")
# The copy has no .venv: build against the project venv's MPI (Open MPI 5,
# docs/install.md) when it has one, as the build tree does.
if [ -x "$ROOT/.venv/bin/mpicc" ] && [ -z "${TUTTI_MPI_HOME:-}" ]; then
  pip_cmd+=(--config-settings=cmake.define.TUTTI_MPI_HOME="$ROOT/.venv")
elif [ -n "${TUTTI_MPI_HOME:-}" ]; then
  pip_cmd+=(--config-settings=cmake.define.TUTTI_MPI_HOME="$TUTTI_MPI_HOME")
fi
if [ "$(id -u)" = 0 ] && command -v unshare > /dev/null &&
   unshare -m true 2> /dev/null; then
  echo "check_pip_install: installing from a read-only bind mount of $src"
  unshare -m bash -c 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && cd / && "$@"' \
    _ "$src" "${pip_cmd[@]}" "$src"
else
  echo "check_pip_install: installing from $src (read-only file modes)"
  (cd / && "${pip_cmd[@]}" "$src")
fi
chmod -R u+w "$src"
# chmod changes ctimes only; the listing compares names, sizes, mtimes and
# contents.
snapshot > "$work/after"
if ! diff -u "$work/before" "$work/after" > "$work/diff"; then
  echo "FAIL: pip install changed the checkout:"; head -40 "$work/diff"; exit 1
fi
(cd / && PYTHONPATH="$work/site" "$PY" -c '
import os, sys, tutti
print("installed:", os.path.dirname(tutti.__file__))
assert tutti.__file__.startswith(sys.argv[1]), tutti.__file__
import tutti._C' "$work/site/")
echo "PASS: pip install from a read-only checkout wrote nothing into it"
