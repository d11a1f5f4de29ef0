"""launches.jsonl (one line per start and per end of an mpirun job; the
demo's goodput summary reads it) and the checkpoint progress that resets
the restart budget."""
import json
import os
import re
import time


def committed_step(ckpt_dir):
    """The step named by <ckpt_dir>/latest ('step-00000500'), or None."""
    if not ckpt_dir:
        return None
    try:
        with open(os.path.join(ckpt_dir, "latest")) as f:
            m = re.search(r"step-(\d+)", f.read())
    except OSError:
        return None
    return int(m.group(1)) if m else None


class Journal:
    def __init__(self, elastic_dir, log):
        self.path = os.path.join(elastic_dir, "launches.jsonl") if elastic_dir else None
        self.log = log
        self.warned = False

    def _write(self, rec):
        if not self.path:
            return
        rec["time"] = round(time.time(), 3)
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(rec, sort_keys=True) + "\n")
        except OSError as e:
            if not self.warned:
                self.log(f"cannot append to {self.path}: {e.strerror} (logged once)")
            self.warned = True

    def start(self, attempt, np, hosts, reason):
        self._write({"event": "start", "attempt": attempt, "np": np,
                     "hosts": hosts, "reason": reason})

    def end(self, attempt, status, step):
        self._write({"event": "end", "attempt": attempt, "status": status, "step": step})

    def note(self, what, **fields):
        """Other launcher events (a wait for capacity, giving up)."""
        fields.update({"event": what})
        self._write(fields)
