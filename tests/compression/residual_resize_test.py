"""Error-feedback residuals across a change of world size, with real
processes: residual_resize saves at np A, then loads at np B and checks the
closed-form result (see residual_resize.cc).

usage: residual_resize_test.py PROG MPIEXEC A B
"""
import os
import shutil
import subprocess
import sys
import tempfile

PROG, MPIEXEC, A, B = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])


def mpirun(np_, mode, d):
    cmd = [MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", str(np_), PROG, mode, d]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


tmp = tempfile.mkdtemp(prefix="tutti-resize-")
ok = False
try:
    r = mpirun(A, "save", tmp)
    if r.returncode != 0:
        print(f"save at {A} ranks failed ({r.returncode}):\n{r.stdout}\n{r.stderr[-3000:]}")
    else:
        r = mpirun(B, "load", tmp)
        print(r.stdout)
        oks = [l for l in r.stdout.splitlines() if l.startswith("OK ")]
        if r.returncode != 0 or len(oks) != B:
            print(f"load at {B} ranks of a {A}-rank checkpoint failed ({r.returncode}):\n"
                  f"{r.stderr[-3000:]}")
        else:
            ok = True
finally:
    shutil.rmtree(tmp, ignore_errors=True)
print(("PASS" if ok else "FAIL") + f": error-feedback state {A} -> {B} ranks")
sys.exit(0 if ok else 1)
