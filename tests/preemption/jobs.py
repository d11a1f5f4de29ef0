"""Process helpers for the script-driven preemption and launcher tests:
start a job, follow its output, wait for lines, and clean up every process
the test started (by pid, children included), whatever happens."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg, flush=True)


def finish(what):
    if failures:
        print(f"{len(failures)} failures in {what}")
        sys.exit(1)
    print(f"PASS: {what}")


def descendants(pid):
    """Pids of all processes below pid (from /proc)."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class Job:
    def __init__(self, cmd, env=None, name="job"):
        e = dict(os.environ)
        e.update(env or {})
        self.name = name
        self.lines = []
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=e)
        self._cv = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    def wait_for(self, pattern, timeout=60):
        """The first match of pattern in the output, waiting up to timeout."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for line in self.lines:
                    m = rx.search(line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    return None
                self._cv.wait(min(left, 0.2))

    def wait(self, timeout=120):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            fail(f"{self.name} did not end within {timeout}s")
            self.kill()
            rc = self.proc.wait()
        self._reader.join(timeout=10)
        return rc

    def output(self):
        with self._cv:
            return "\n".join(self.lines)

    def kill(self):
        """SIGKILL this job and everything it started (mpirun, ranks)."""
        for pid in reversed(descendants(self.proc.pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()


class MockServer:
    """mock_metadata.py in a subprocess, stopped by stop() (and bounded by
    its own --lifetime)."""

    def __init__(self, python, cloud, tmp, rebalance=False):
        here = os.path.dirname(os.path.abspath(__file__))
        self.notice_file = os.path.join(tmp, f"{cloud}.notice")
        self.log = os.path.join(tmp, f"{cloud}.log")
        port_file = os.path.join(tmp, f"{cloud}.port")
        cmd = [python, os.path.join(here, "mock_metadata.py"), cloud, "--port-file", port_file,
               "--notice-file", self.notice_file, "--log", self.log, "--lifetime", "150"]
        if rebalance:
            cmd.append("--rebalance")
        self.proc = subprocess.Popen(cmd)
        deadline = time.monotonic() + 20
        while not os.path.exists(port_file) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.url = "http://127.0.0.1:" + open(port_file).read().strip()

    def notice(self):
        open(self.notice_file, "w").close()

    def requests(self):
        import json
        if not os.path.exists(self.log):
            return []
        return [json.loads(x) for x in open(self.log)]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
