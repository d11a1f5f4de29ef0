"""Compiles every library source that reaches <mpi.h> against a second MPI
(the system's, Debian's Open MPI 4.1, which has no ULFM) with the flags this
build used, -fsyntax-only: tutti must keep building on an MPI without the
fault-tolerance extension (docs/install.md, "Choosing the MPI").  Cheap enough
for every CI run (no objects, no link).

usage: system_mpi_compile.py BUILD_DIR SOURCE_DIR MPICC [--jobs N]
Exit: 0 every source compiled; 1 one did not (its errors are printed);
77 skipped (no such MPI, or this build already uses it)."""
import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys


def mpi_compile_flags(mpicc):
    out = subprocess.run([mpicc, "--showme:compile"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{mpicc} --showme:compile failed: {out.stderr.strip()}")
    return shlex.split(out.stdout)


def cache_value(build, name):
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split("=", 1)[1].strip()
    return ""


def mpi_sources(build, source_dir):
    """Library sources (src/, python/src/) whose dependencies, as ninja
    recorded them in this build, include an mpi.h (an object's first
    dependency is its source file)."""
    out = subprocess.run(["ninja", "-C", build, "-t", "deps"], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    hits, first, uses_mpi = set(), None, False
    for line in out.splitlines() + [""]:
        if line and not line[0].isspace() or not line:
            if first and uses_mpi:
                hits.add(os.path.realpath(os.path.join(build, first)))
            first, uses_mpi = None, False
        elif first is None:
            first = line.strip()
        elif line.strip().endswith("/mpi.h"):
            uses_mpi = True
    roots = (os.path.join(source_dir, "src") + os.sep, os.path.join(source_dir, "python", "src") + os.sep)
    with open(os.path.join(build, "compile_commands.json")) as f:
        commands = json.load(f)
    picked, seen = [], set()
    for c in commands:
        src = os.path.realpath(os.path.join(c["directory"], c["file"]))
        # One command per source (the shared and static library compile it alike).
        if src in hits and src.startswith(roots) and src.endswith(".cc") and src not in seen:
            seen.add(src)
            picked.append(c)
    return picked


def rewrite(command, build_mpi_dirs, system_flags):
    """The build's compile command, with the build MPI's include folders
    swapped for the system MPI's and -fsyntax-only instead of an object."""
    args = shlex.split(command)
    if os.path.basename(args[0]) == "ccache":
        args = args[1:]
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-MD", "-MMD"):
            continue
        if a.startswith(("-I", "-isystem")):
            path = a[2:] if a.startswith("-I") else a[len("-isystem"):]
            if os.path.realpath(path) in build_mpi_dirs:
                continue
        out.append(a)
    # -isystem PATH given as two words.
    cleaned, i = [], 0
    while i < len(out):
        if out[i] == "-isystem" and i + 1 < len(out) and os.path.realpath(out[i + 1]) in build_mpi_dirs:
            i += 2
            continue
        cleaned.append(out[i])
        i += 1
    return cleaned[:1] + system_flags + cleaned[1:] + ["-fsyntax-only"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("source_dir")
    p.add_argument("mpicc")
    p.add_argument("--jobs", type=int, default=2)
    a = p.parse_args()
    build, source_dir = os.path.realpath(a.build), os.path.realpath(a.source_dir)
    if not os.access(a.mpicc, os.X_OK):
        print(f"SKIPPED: no system MPI compiler at {a.mpicc}")
        return 77
    build_mpicc = cache_value(build, "MPI_C_COMPILER")
    if os.path.realpath(build_mpicc) == os.path.realpath(a.mpicc):
        print(f"SKIPPED: this build already uses {a.mpicc}; the suite itself checks it")
        return 77
    if not os.path.exists(os.path.join(build, "compile_commands.json")):
        print("FAIL: no compile_commands.json in the build (CMAKE_EXPORT_COMPILE_COMMANDS)")
        return 1
    build_mpi_dirs = {os.path.realpath(d) for d in
                      cache_value(build, "MPI_C_COMPILER_INCLUDE_DIRS").split(";") if d}
    build_mpi_dirs |= {os.path.realpath(d) for d in
                       cache_value(build, "MPI_C_HEADER_DIR").split(";") if d}
    system_flags = mpi_compile_flags(a.mpicc)
    version = subprocess.run([a.mpicc, "--showme:version"], capture_output=True, text=True).stdout.strip()
    sources = mpi_sources(build, source_dir)
    if not sources:
        print("FAIL: found no library source that includes mpi.h (is the build complete?)")
        return 1
    print(f"compiling {len(sources)} sources that include mpi.h against {version or a.mpicc}")

    def check(c):
        cmd = rewrite(c["command"], build_mpi_dirs, system_flags)
        r = subprocess.run(cmd, cwd=c["directory"], capture_output=True, text=True, timeout=600)
        return c["file"], r.returncode, r.stderr, cmd

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        for name, rc, err, cmd in pool.map(check, sources):
            rel = os.path.relpath(os.path.realpath(name), source_dir)
            if rc != 0:
                failed += 1
                print(f"FAIL: {rel} does not compile against {a.mpicc}:\n{err}\n  command: {shlex.join(cmd)}")
            else:
                print(f"ok: {rel}")
    if failed:
        print(f"FAIL: {failed} of {len(sources)} sources")
        return 1
    print(f"passed: {len(sources)} sources compile against {version or a.mpicc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
