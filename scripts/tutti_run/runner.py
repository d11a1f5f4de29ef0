"""The restart loop: start mpirun, forward notices, restart after failures
and preemption exits; in elastic mode choose the hosts and size of every
start and ask a running job to save and exit when it can grow."""
import concurrent.futures
import ctypes
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

from . import hosts as H
from . import memory
from .cli import HOST_OPTIONS, MPIRUN_VALUES
from .completion import COMM_FAILURE, Completion, mpirun_version
from .journal import Journal, committed_step

PREEMPTED = 75
MAX_BACKOFF_S = 60.0
PR_SET_PDEATHSIG = 1
USR1_REPEAT_S = 2.0
SESSION_GRACE_S = 3.0  # how long mpirun's leftovers may take to exit on their own
KILL_AFTER_S = 5.0  # after SIGTERM to an mpirun that outlived --exit-grace
NOTICE_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def log(msg):
    sys.stderr.write(f"[tutti-run] {msg}\n")
    sys.stderr.flush()


def is_open_mpi(version):
    """From mpirun_version()'s text."""
    return "Open MPI" in version or "OpenRTE" in version


def status_of(returncode):
    return 128 - returncode if returncode < 0 else returncode


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def catches(pid, sig):
    """Whether process pid has a handler for sig (/proc/PID/status SigCgt);
    True when that cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return True


def session_members(sid):
    """{pid: name} of the live (not zombie) processes of session sid."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
            fields = rest.split()  # state ppid pgrp session
            if int(fields[3]) == sid and fields[0] not in "ZX":
                out[int(d)] = head.split("(", 1)[1]
        except (OSError, IndexError, ValueError):
            pass
    return out


def launcher_tmpdir():
    """Where Open MPI 5's launcher (PRRTE) makes its session directory:
    its prte_tmpdir_base, else TMPDIR, TEMP, TMP, else /tmp."""
    for key in ("PRTE_MCA_prte_tmpdir_base", "TMPDIR", "TEMP", "TMP"):
        if os.environ.get(key):
            return os.environ[key]
    return "/tmp"


def clear_launcher_leftovers(pid):
    """Removes <tmpdir>/ompi.<pid> and prte.<pid> when they are directories
    of this user.  Open MPI 5's launcher keeps its session there, named
    after its pid, and removes it when it exits; one that was SIGKILLed
    leaves it, with PMIx's rendezvous files in it, and the next launcher
    given that pid stops at once ("The PMIx server's listener thread failed
    to start", exit 213) before any rank runs.  Called in the child between
    fork and exec with its own pid, which mpirun is about to take: whatever
    is named after it is a leftover."""
    base = launcher_tmpdir()
    for prefix in ("ompi", "prte"):
        d = os.path.join(base, f"{prefix}.{pid}")
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            shutil.rmtree(d, ignore_errors=True)


def end_session(sid, grace):
    """Waits up to grace seconds for what is left of mpirun's session to
    exit by itself (daemons and rsh agents finish just after mpirun), then
    SIGKILLs the rest (mpirun's ranks outlive a SIGKILLed mpirun: each rank
    has its own process group but keeps mpirun's session).  The session id
    cannot be reused while any member lives.  Returns the names killed."""
    deadline = time.monotonic() + grace
    left = session_members(sid)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = session_members(sid)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return sorted(left.values())


def read_exits(elastic_dir, attempt):
    """Records in <elastic_dir>/exited (src/preemption/leaving.cc
    record_exit) of the job started as `attempt`: [{"host", "pid",
    "status", ...}].  A rank of an earlier job (on a host that vanished
    and came back) may write one late: its "attempt" differs."""
    d = os.path.join(elastic_dir, "exited")
    out = []
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return out
    for n in names:
        if n.startswith("."):
            continue
        try:
            with open(os.path.join(d, n)) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            rec = {}
        if not isinstance(rec, dict):
            rec = {}
        rec.setdefault("host", n.rsplit("-", 1)[0])
        if rec.get("attempt", attempt) == attempt:
            out.append(rec)
    return out


def clear_exits(elastic_dir):
    d = os.path.join(elastic_dir, "exited")
    try:
        names = os.listdir(d)
    except OSError:
        return
    for n in names:
        try:
            os.unlink(os.path.join(d, n))
        except OSError:
            pass


class Runner:
    def __init__(self, opts, mpi_args):
        self.opts = opts
        self.mpi_args = mpi_args
        self.proc = None
        self.notice = None   # the signal that asked us to stop, if any
        self.interrupts = 0
        self.notice_time = None
        self.terminated = False
        self.libc = _libc()
        self.journal = Journal(opts.get("elastic_dir") if opts.get("elastic") else None, log)
        self.local = H.local_names()
        self.agent = (H.probe_command(opts["probe_command"], mpi_args, log)
                      if opts["elastic"] else None)
        self.np = None            # size of the running job (elastic mode)
        self.hosts = []           # its hosts [(host, slots)]
        self.resize_requested = False
        self.last_grow = -1e18
        self.job_started = -1e18
        self.logged_leaving = set()
        self.waited_s = 0.0       # before the current job, for --min-np slots
        self.unreachable = set()  # hosts whose last probe failed (logged once)
        self.lock = threading.Lock()
        self.probing = set()      # hosts probed in the background while a job runs
        self.probe_pool = None    # their workers (--probe-concurrency), made on first use
        self.answered = set()     # hosts that answered such a probe since the start
        self.exit_seen = None     # when a rank's exit record appeared (this job)
        self.exit_status = None   # the status it recorded
        self.forced = None        # when tutti-run began ending an mpirun that outlived it
        self.attempt = 0          # TUTTI_RESTART_COUNT of the running job
        self.discovery_failed = False
        self.usr1_wanted = False  # a stop or resize request to forward to mpirun
        self.usr1_sent = -1e18
        self.usr1_count = 0       # SIGUSR1s sent to the running job's mpirun
        self.step_at_notice = None  # committed step when the first one was sent
        self.open_mpi = False

    # ---- signals -------------------------------------------------------------

    def on_signal(self, signum, _frame):
        name = signal.Signals(signum).name
        if signum == signal.SIGINT:
            self.interrupts += 1
            if self.interrupts > 1 and self.proc and self.proc.poll() is None:
                log("second SIGINT: terminating the job now")
                self.terminate()
                return
        if self.notice is None:
            self.notice = name
            self.notice_time = time.monotonic()
        if self.proc and self.proc.poll() is None:
            log(f"{name}: asking the ranks to checkpoint and stop (SIGUSR1 to mpirun)")
            self.ask_to_stop()
        else:
            log(f"{name}: no job running; not starting another")

    def ask_to_stop(self):
        self.usr1_wanted = True
        self.forward_usr1()

    def forward_usr1(self):
        """Sends SIGUSR1 to mpirun once it handles it, and again every
        USR1_REPEAT_S while the job runs: mpirun forwards a signal only to
        the ranks already running, so a notice that lands while the job
        starts would otherwise be lost.  A rank takes a repeated notice as
        the same notice.  Checking SigCgt first cannot make a send safe (the
        check and the kill are two steps, and mpirun may put its original
        disposition back in between, while it exits): spawn() makes that
        disposition "ignore", and judge_usr1_death() covers a launcher that
        resets it to the default instead."""
        if not self.usr1_wanted or not self.proc or self.proc.poll() is not None:
            return
        now = time.monotonic()
        if now - self.usr1_sent < USR1_REPEAT_S or not catches(self.proc.pid, signal.SIGUSR1):
            return
        if self.usr1_count == 0:
            self.step_at_notice = self.progress_step()
        self.usr1_sent = now
        try:
            self.proc.send_signal(signal.SIGUSR1)
        except ProcessLookupError:
            return
        self.usr1_count += 1

    def judge_usr1_death(self, returncode, step):
        """The status to count for a job whose mpirun ended with
        `returncode`.  mpirun killed by SIGUSR1 after tutti-run forwarded
        one was stopping anyway (it had a handler when the last one was
        sent) and died of a repeat that landed while it exited, after it had
        reset the signal to its default action (Open MPI's mpirun restores
        the disposition it started with, which spawn() makes "ignore", so
        this takes another launcher).  A checkpoint committed since the
        first forward shows the stop did its work: count it as the stop (75)
        it was.  Without one the ranks' own statuses are unknown: counted
        as the signal death it is, and said so."""
        if returncode != -signal.SIGUSR1 or self.usr1_count == 0:
            return status_of(returncode)
        head = (f"mpirun was killed by a SIGUSR1 that tutti-run forwarded ({self.usr1_count} "
                f"sent; one landed while mpirun was exiting)")
        before = self.step_at_notice
        if step is not None and (before is None or step > before):
            log(f"{head}, after the job committed step {step} following the notice: counted as "
                f"the preemption stop (75) it was")
            return PREEMPTED
        where = (f"in {self.opts['ckpt_dir']}" if self.opts["ckpt_dir"] else
                 "(tutti-run cannot check: no --ckpt-dir or TUTTI_CKPT_DIR)")
        log(f"{head}; no checkpoint committed since the notice {where}, so the ranks' own exit "
            f"statuses are unknown: counted as a failure (status {status_of(returncode)})")
        return status_of(returncode)

    def explain_clean_stop(self):
        """One line after a job that ended with 75: Open MPI ends a job one
        of whose ranks exits non-zero with banners ("... the job has been
        aborted", "Exit code: 75") that read like a failure."""
        banners = (": mpirun's \"job has been aborted\" banners above are expected, Open MPI "
                   "reports every non-zero exit that way" if self.open_mpi else "")
        log(f"status 75 is a clean preemption stop (the ranks committed a checkpoint, then "
            f"exited with 75){banners}; the job resumes from that checkpoint when it starts again")

    def terminate(self):
        if self.terminated or not self.proc:
            return
        self.terminated = True
        try:
            self.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass

    def spawn(self, cmd, announce):
        """Logs `announce` and starts mpirun with the notice signals
        blocked, so one arriving after the log line (during the fork/exec)
        stays pending and is forwarded once self.proc is set; False (nothing
        started, nothing logged) when a notice came before.  The child
        unblocks them and asks the kernel for SIGTERM when tutti-run dies
        (even by SIGKILL): mpirun answers it by ending the ranks.

        mpirun starts with SIGUSR1 ignored.  Open MPI's mpirun (4.1, seen
        with strace) installs its forwarding handler over that first thing,
        before it starts any process (so its daemons and ranks start with
        the default action: exec resets a handler), and when it exits puts
        back the disposition it started with: a SIGUSR1 that tutti-run sent
        while the handler was there and that arrives after it is gone is
        then ignored, instead of killing mpirun (status 138) after its ranks
        stopped cleanly with 75."""
        parent = os.getpid()
        libc = self.libc
        delay = float(os.environ.get("TUTTI_RUN_TEST_SPAWN_DELAY_S", "0") or 0)

        def child():
            if libc is not None:
                libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent:  # tutti-run died before the prctl
                os._exit(143)
            clear_launcher_leftovers(os.getpid())
            if delay > 0:  # tests: widen the window in which the parent spawns
                time.sleep(delay)
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, NOTICE_SIGNALS)

        signal.pthread_sigmask(signal.SIG_BLOCK, NOTICE_SIGNALS)
        try:
            if self.notice is not None:  # came after the loop's check: start nothing
                return False
            log(announce)  # a notice from here on is forwarded to this job
            self.proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=child)
            return True
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, NOTICE_SIGNALS)  # pending ones run now

    def wait(self):
        """Waits for the job; enforces --stop-timeout after a notice; in
        elastic mode watches discovery for a chance to grow."""
        killed = False
        next_discovery = time.monotonic() + self.opts["discovery_interval"]
        while True:
            try:
                return self.proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
            self.forward_usr1()
            now = time.monotonic()
            if self.opts["elastic"]:
                self.watch_exits(now)
            if self.opts["elastic"] and self.notice is None and now >= next_discovery:
                self.maybe_grow()
                next_discovery = time.monotonic() + self.opts["discovery_interval"]
            limit = self.opts["stop_timeout"]
            if self.notice_time is None or limit <= 0 or killed:
                continue
            late = now - self.notice_time - limit
            if late >= 10.0:
                log("the job ignored SIGTERM: killing mpirun")
                self.proc.kill()
                killed = True
            elif late >= 0 and not self.terminated:
                log(f"the job did not stop within {limit:g} s of the notice: terminating it")
                self.terminate()

    def watch_exits(self, now):
        """Ends an mpirun that outlives a rank's exit record (a rank that
        left on a communication failure) by --exit-grace: OpenMPI 4.1 waits
        forever for the daemon of a host that vanished without closing its
        connections.  SIGTERM, then SIGKILL KILL_AFTER_S later."""
        if self.forced is not None:
            if now - self.forced >= KILL_AFTER_S and self.proc.poll() is None:
                log(f"mpirun ignored SIGTERM for {KILL_AFTER_S:g} s: killing it")
                self.proc.kill()
                self.forced = float("inf")
            return
        if self.exit_seen is None:
            recs = read_exits(self.opts["elastic_dir"], self.attempt)
            if not recs:
                return
            self.exit_seen = now
            self.exit_status = recs[0].get("status", COMM_FAILURE)
            where = ", ".join(sorted({str(r["host"]) for r in recs}))
            log(f"rank(s) on {where} ended with status {self.exit_status} (a peer or the network "
                f"failed): mpirun gets {self.opts['exit_grace']:g} s (--exit-grace) to end")
            return
        if now - self.exit_seen >= self.opts["exit_grace"]:
            log(f"mpirun still running {now - self.exit_seen:.0f} s after a rank ended on a "
                f"communication failure (waiting for a host that vanished?): terminating it; "
                f"the job counts as failed with {self.exit_status}")
            self.forced = now
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    # ---- elastic -------------------------------------------------------------

    def discover(self):
        try:
            hosts = H.discover(self.opts["discovery_script"], self.opts["hostfile"])
            self.discovery_failed = False
            return hosts
        except H.DiscoveryError as e:
            if not self.discovery_failed:
                log(f"host discovery failed (treated as no hosts until it works): {e}")
            self.discovery_failed = True
            return []

    def note_probe(self, h, why):
        """Records a probe's result; an exclusion is logged once until the
        host answers again.  Call with self.lock held."""
        if why:
            if h not in self.unreachable:
                log(f"excluding {h}: unreachable ({why})")
            self.unreachable.add(h)
        elif h in self.unreachable:
            self.unreachable.discard(h)
            log(f"{h} answers a probe again")

    def probe_in_background(self, h):
        """Queues a probe of h on the background pool (--probe-concurrency
        workers: a thousand unanswered hosts never mean a thousand agents
        and threads at once)."""
        def one():
            why = H.probe([h], self.agent, self.opts["probe_timeout"], self.local)[h]
            with self.lock:
                self.probing.discard(h)
                self.note_probe(h, why)
                if not why:
                    self.answered.add(h)
        with self.lock:
            if h in self.probing:
                return
            self.probing.add(h)
            if self.probe_pool is None:
                self.probe_pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.opts["probe_concurrency"], thread_name_prefix="probe")
        self.probe_pool.submit(one)

    def usable_hosts(self, known=(), running=False):
        """Discovered hosts that are not leaving and answer a probe (hosts in
        `known` are not probed again).  While a job runs (`running`), hosts
        are probed in the background, at most one probe per host at a time,
        so a host that does not answer never holds up the loop: one that
        failed is tried again at every discovery (--discovery-interval) and
        counts once it answers."""
        hosts, _ = H.filter_leaving(self.discover(), self.opts["elastic_dir"],
                                    self.opts["leaving_ttl"], log, self.local,
                                    self.logged_leaving)
        todo = [h for h, _ in hosts if h not in known]
        if running:
            with self.lock:
                ok = set(self.answered)
            for h in todo:
                if h not in ok:
                    self.probe_in_background(h)
            return [(h, s) for h, s in hosts if h in known or h in ok]
        result = H.probe(todo, self.agent, self.opts["probe_timeout"], self.local,
                         self.opts["probe_concurrency"])
        with self.lock:
            for h in todo:
                self.note_probe(h, result[h])
        return [(h, s) for h, s in hosts if not result.get(h)]

    def size_for(self, slots):
        """The size to run on `slots` usable slots: the largest multiple of
        --np-multiple-of that is <= min(--max-np, slots) and >= --min-np;
        None if there is none."""
        k = self.opts["np_multiple_of"]
        n = min(self.opts["max_np"], slots)
        n -= n % k
        return n if n >= self.opts["min_np"] else None

    def wait_for_capacity(self):
        """Usable hosts with at least --min-np slots, or None after
        --wait-timeout (or a notice)."""
        lo, timeout = self.opts["min_np"], self.opts["wait_timeout"]
        t0 = time.monotonic()
        deadline = t0 + timeout
        waited = False
        while self.notice is None:
            hosts = self.usable_hosts()
            slots = sum(s for _, s in hosts)
            if self.size_for(slots) is not None:
                self.waited_s = time.monotonic() - t0 if waited else 0.0
                if waited:
                    log(f"{slots} usable slots after {self.waited_s:.1f} s: starting")
                return hosts
            if not waited:
                need = f"fewer than --min-np {lo}" if slots < lo else \
                    (f"no size in [--min-np {lo}, {min(slots, self.opts['max_np'])}] is a "
                     f"multiple of --np-multiple-of {self.opts['np_multiple_of']}")
                log(f"{slots} usable slot(s) ({H.format_hosts(hosts) or 'no hosts'}), {need}: "
                    f"waiting up to {timeout:g} s for capacity")
                waited = True
            if time.monotonic() >= deadline:
                log(f"gave up: {slots} usable slot(s) after waiting {timeout:g} s for --min-np "
                    f"{lo} (discovery: {self.opts['discovery_script'] or self.opts['hostfile']})")
                return None
            end = min(deadline, time.monotonic() + self.opts["discovery_interval"])
            while self.notice is None and time.monotonic() < end:
                time.sleep(0.1)
        return None

    def maybe_grow(self):
        hi = self.opts["max_np"]
        if self.resize_requested or self.np >= hi:
            return
        if time.monotonic() - max(self.last_grow, self.job_started) < self.opts["grow_interval"]:
            return
        hosts = self.usable_hosts(known={h for h, _ in self.hosts}, running=True)
        new_np = self.size_for(sum(s for _, s in hosts))
        if new_np is None or new_np <= self.np:
            return
        self.last_grow = time.monotonic()
        self.resize_requested = True
        req = {"np": new_np, "from": self.np, "hosts": H.format_hosts(H.take_slots(hosts, new_np)),
               "time": round(time.time(), 3), "reason": "grow"}
        path = os.path.join(self.opts["elastic_dir"], "resize-requested")
        try:
            with open(path + ".tmp", "w") as f:
                json.dump(req, f)
            os.replace(path + ".tmp", path)
        except OSError as e:
            log(f"cannot write {path}: {e.strerror}")
        log(f"{new_np} slots available ({req['hosts']}), running {self.np}: asking the job to "
            f"save and exit (SIGUSR1 to mpirun) to restart larger")
        self.ask_to_stop()

    def elastic_args(self):
        """-np and -H for the next start, or None (too few slots)."""
        hosts = self.wait_for_capacity()
        if hosts is None:
            return None
        self.np = self.size_for(sum(s for _, s in hosts))
        self.hosts = H.take_slots(hosts, self.np)
        self.resize_requested = False
        try:
            os.unlink(os.path.join(self.opts["elastic_dir"], "resize-requested"))
        except OSError:
            pass
        return ["-np", str(self.np), "-H", H.format_hosts(self.hosts)]

    # ---- the loop ------------------------------------------------------------

    def run(self):
        # The memory tier keys the job's commits on its id (scripts/tutti_run/memory.py).
        self.job = memory.job_id()
        os.environ["TUTTI_JOB_ID"] = self.job
        memory.sweep(self.job, log)
        # Held for the whole run (not only while ranks live), so that no sweep
        # removes the job's commits between two attempts.
        held = None if self.opts["ckpt_dir"] else memory.hold(self.job, log)
        self.version = mpirun_version(self.opts["mpirun"])
        self.completion = Completion(self.opts, self.mpi_args, MPIRUN_VALUES, HOST_OPTIONS,
                                     self.local, self.version, log)
        try:
            return self.run_jobs()
        finally:
            self.completion.close()
            if held is not None:
                os.close(held)
            memory.remove_job(self.job, log)

    def progress_step(self):
        """The committed step: the newer of <ckpt-dir>/latest and the memory
        tier's on this host (elastic commits go to both; the directory may
        get every n-th only, TUTTI_COMMIT_DURABLE_EVERY)."""
        steps = [committed_step(memory.commits_dir(self.job))]
        if self.opts["ckpt_dir"]:
            steps.append(committed_step(self.opts["ckpt_dir"]))
        known = [s for s in steps if s is not None]
        return max(known) if known else None

    def run_jobs(self):
        for sig in NOTICE_SIGNALS:
            signal.signal(sig, self.on_signal)
        os.environ.setdefault("TUTTI_EXIT_ON_COMM_FAILURE", "1")
        if self.opts["elastic"]:
            os.environ.update({
                "TUTTI_ELASTIC": "1", "TUTTI_ELASTIC_DIR": self.opts["elastic_dir"],
                "TUTTI_ELASTIC_MIN_NP": str(self.opts["min_np"]),
                "TUTTI_ELASTIC_MAX_NP": str(self.opts["max_np"])})
        export = []
        self.open_mpi = is_open_mpi(self.version)
        if self.open_mpi:
            names = sorted(set([k for k in os.environ if k.startswith("TUTTI_")] +
                               ["TUTTI_RESTART_COUNT"]))
            # Per node, never one value for all: TUTTI_ELASTIC_HOST.
            names = [k for k in names if not k.startswith("TUTTI_RUN_TEST_") and
                     k != "TUTTI_ELASTIC_HOST"]
            for k in names:
                export += ["-x", k]
        attempt = 0
        failures = 0   # consecutive failures without progress
        status = 0
        reason = "start"
        while True:
            if self.notice is not None:
                if attempt == 0:
                    log(f"{self.notice} received before the job started: exiting")
                    return 128 + signal.Signals[self.notice].value
                log(f"{self.notice} received: not restarting")
                return status
            size_args = []
            if self.opts["elastic"]:
                size_args = self.elastic_args()
                if size_args is None:
                    if self.notice is not None:
                        continue
                    return status if attempt > 0 else 1
            os.environ["TUTTI_RESTART_COUNT"] = str(attempt)
            self.attempt = attempt
            cmd = ([self.opts["mpirun"]] + export + size_args + self.completion.mpi_args() +
                   self.mpi_args)
            self.completion.prepare(attempt)
            step_before = self.progress_step()
            self.usr1_wanted = False
            self.usr1_sent = -1e18
            self.usr1_count = 0
            self.step_at_notice = None
            self.job_started = time.monotonic()
            self.exit_seen = self.exit_status = self.forced = None
            with self.lock:
                self.answered.clear()
            if self.opts["elastic"]:
                clear_exits(self.opts["elastic_dir"])
            try:
                if not self.spawn(cmd, ("starting" if attempt == 0 else f"restart {attempt}:") +
                                  " " + " ".join(cmd)):
                    continue
            except OSError as e:
                log(f"cannot start {self.opts['mpirun']}: {e}")
                return 127
            self.journal.start(attempt, self.np, [f"{h}:{s}" for h, s in self.hosts], reason,
                               self.waited_s)
            returncode = self.wait()
            left = end_session(self.proc.pid, SESSION_GRACE_S)
            if left:
                log(f"{len(left)} process(es) started by mpirun still running {SESSION_GRACE_S:g} s "
                    f"after it ended ({', '.join(sorted(set(left)))}): killed them")
            self.proc = None
            step = self.progress_step()
            if self.forced is not None:
                status = self.exit_status if isinstance(self.exit_status, int) else COMM_FAILURE
            else:
                status = self.judge_usr1_death(returncode, step)
            status = self.completion.judge(attempt, status)
            self.journal.end(attempt, status, step)
            progressed = step is not None and (step_before is None or step > step_before)
            what = ("completed" if status == 0 else
                    "stopped to resize (checkpoint committed)" if status == PREEMPTED
                    and self.resize_requested
                    else "stopped on a preemption notice (checkpoint committed)"
                    if status == PREEMPTED
                    else "failed: a peer or the network failed (status 76)" if status == COMM_FAILURE
                    else f"failed with status {status}")
            log(f"job {what}")
            if status == PREEMPTED and returncode == PREEMPTED:
                self.explain_clean_stop()
            if status == 0:
                return 0
            if self.notice is not None:
                return status
            if status == PREEMPTED:
                failures = 0
                reason = "resize" if self.resize_requested else "preempted"
                delay = 0.0 if self.resize_requested else self.opts["backoff"]
            elif progressed:
                failures = 0
                reason = "failure"
                delay = self.opts["backoff"]
                log(f"the committed step advanced to {step}: the restart budget is reset")
            else:
                failures += 1
                reason = "failure"
                if failures > self.opts["max_restarts"]:
                    log(f"giving up after {failures - 1} restart(s) without progress")
                    return status
                delay = self.opts["backoff"] * (2 ** (failures - 1))
            delay = min(delay, MAX_BACKOFF_S)
            log(f"restarting from the latest checkpoint in {delay:g} s "
                f"({failures} of {self.opts['max_restarts']} failures without progress)")
            deadline = time.monotonic() + delay
            while self.notice is None and time.monotonic() < deadline:
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
            attempt += 1
