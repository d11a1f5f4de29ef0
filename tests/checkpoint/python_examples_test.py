"""The Python checkpoint examples, checked where their own exit status
cannot tell (examples/python/torch_horovod.py, numpy_train.py).

replicas: both examples end by checking that every rank holds the same
    parameters.  With ``--perturb-rank R`` (rank R nudges one weight by 1e-3
    just before the check) rank 0 must print "replicas DIFFER (max difference
    ~1e-3)" and the job must fail.  The broadcast-and-compare check they
    replaced printed "identical" on rank 0 whatever the other ranks held.

usage: python_examples_test.py replicas MPIEXEC PYTHON EXAMPLES_DIR NP WORKDIR
"""
import os
import re
import subprocess
import sys


def env_without_checkpoints():
    return {k: v for k, v in os.environ.items() if k != "TUTTI_CKPT_DIR"}


def run(cmd, env, timeout=240):
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=env)
    print(p.stdout, flush=True)
    return p


def replicas(launch, examples, np_, _work):
    perturbed = np_ - 1  # not rank 0, the rank that prints
    failures = []
    for script, args in (("torch_horovod.py", ["--epochs", "1"]),
                         ("numpy_train.py", ["--steps", "60"])):
        p = run(launch + [os.path.join(examples, script), *args,
                          "--perturb-rank", str(perturbed)], env_without_checkpoints())
        m = re.search(r"replicas DIFFER \(max difference ([0-9.e+-]+)\)", p.stdout)
        if p.returncode == 0:
            failures.append(f"{script}: exit status 0 although rank {perturbed}'s parameters "
                            "differ; expected a failure")
        if m is None:
            failures.append(f"{script}: rank 0 did not print 'replicas DIFFER (max difference "
                            f"...)' although rank {perturbed}'s parameters differ")
        elif not 5e-4 < float(m.group(1)) < 2e-3:
            failures.append(f"{script}: max difference {m.group(1)}, expected about 1e-3 "
                            "(the nudge)")
    return failures


def main():
    mode, mpiexec, python, examples, np_, work = sys.argv[1:7]
    np_ = int(np_)
    launch = [mpiexec, "--oversubscribe", "--bind-to", "none", "-np", str(np_), python]
    failures = {"replicas": replicas}[mode](launch, examples, np_, work)
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print(f"OK: {mode}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
