"""What the fake-host tests share (elastic_test.py, memtier_test.py): the
processes of one fake host."""
import os


def host_processes(host, triggers):
    """Pids that run on fake host `host` (fake_agent.sh and memtier_agent.sh
    export TUTTI_PREEMPT_FILE=<triggers>/<host> to everything they start;
    Open MPI's daemon leaves mpirun's process tree with --daemonize)."""
    want = f"TUTTI_PREEMPT_FILE={os.path.join(triggers, host)}".encode()
    out = []
    for p in [int(d) for d in os.listdir("/proc") if d.isdigit()]:
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    out.append(p)
        except OSError:
            pass
    return out
