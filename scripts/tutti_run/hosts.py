"""Where an elastic job may run: host discovery (a Horovod-style script or a
re-read hostfile), hosts recorded as leaving by their own ranks, and a
reachability probe through the rsh agent mpirun will use."""
import json
import os
import shlex
import socket
import subprocess
import threading
import time


class DiscoveryError(Exception):
    pass


def parse_host_line(line, where):
    """'host:slots', 'host slots=N' (OpenMPI hostfile), or 'host' (1 slot).
    Returns (host, slots) or None for a blank/comment line."""
    line = line.split("#", 1)[0].strip()
    if not line:
        return None
    words = line.split()
    host, slots = words[0], 1
    for w in words[1:]:
        key, _, value = w.partition("=")
        if key == "slots":
            slots = value
        elif key not in ("max_slots", "max-slots"):
            raise DiscoveryError(f"{where}: cannot read '{line}' (expected 'host:slots' or "
                                 f"'host slots=N')")
    if ":" in host and host.count(":") == 1:
        host, slots = host.split(":")
    try:
        slots = int(slots)
    except ValueError:
        raise DiscoveryError(f"{where}: '{line}': slots must be an integer") from None
    if slots < 0 or not host:
        raise DiscoveryError(f"{where}: '{line}': expected a host name and slots >= 0")
    return host, slots


def parse_hosts(text, where):
    """Hosts in order of first appearance; a host listed twice keeps the
    larger slot count."""
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        h = parse_host_line(line, f"{where} line {n}")
        if h and h[1] > 0:
            out[h[0]] = max(out.get(h[0], 0), h[1])
    return list(out.items())


def discover(script=None, hostfile=None, timeout=30.0):
    """[(host, slots)] from the discovery script or the hostfile."""
    if hostfile:
        try:
            with open(hostfile) as f:
                return parse_hosts(f.read(), f"hostfile {hostfile}")
        except OSError as e:
            raise DiscoveryError(f"cannot read hostfile {hostfile}: {e.strerror}") from None
    try:
        r = subprocess.run([script], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise DiscoveryError(f"discovery script {script} did not finish within "
                             f"{timeout:g} s") from None
    except OSError as e:
        raise DiscoveryError(f"cannot run discovery script {script}: {e.strerror}") from None
    if r.returncode != 0:
        raise DiscoveryError(f"discovery script {script} exited with {r.returncode}: "
                             f"{r.stderr.strip()[-500:]}")
    return parse_hosts(r.stdout, f"output of {script}")


def format_hosts(hosts):
    return ",".join(f"{h}:{s}" for h, s in hosts)


def take_slots(hosts, np):
    """The first hosts (discovery order) holding np slots; the last one may
    give fewer than it has."""
    out, left = [], np
    for h, s in hosts:
        if left <= 0:
            break
        out.append((h, min(s, left)))
        left -= min(s, left)
    return out


# ---- this machine -----------------------------------------------------------

def local_names():
    names = {"localhost", "127.0.0.1", "::1", socket.gethostname()}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass
    return {n for n in names if n}


def is_local(host, names):
    return host in names or host.split(".")[0] in {n.split(".")[0] for n in names
                                                   if not n[0].isdigit()}


# ---- leaving records (written by the ranks: src/preemption/leaving.cc) -----

def _addresses(host):
    try:
        return {ai[4][0] for ai in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return set()


def read_leaving(elastic_dir):
    """{path: record} for every readable record in <dir>/leaving."""
    d = os.path.join(elastic_dir, "leaving")
    out = {}
    try:
        names = os.listdir(d)
    except OSError:
        return out
    for n in names:
        if n.startswith("."):
            continue
        p = os.path.join(d, n)
        try:
            with open(p) as f:
                rec = json.load(f)
            if not isinstance(rec, dict):
                raise ValueError("not an object")
        except (OSError, ValueError) as e:
            rec = {"host": n, "unreadable": str(e)}
        rec.setdefault("host", n)
        out[p] = rec
    return out


def record_matches(rec, host, local):
    """Whether a leaving record names `host`: by name (full or short), by an
    address of the record's node, or, for this machine's own names, a record
    written on this machine."""
    names = {str(rec.get("host", ""))} | {str(n) for n in rec.get("names", []) or []}
    names.discard("")
    if host in names or host.split(".")[0] in {n.split(".")[0] for n in names
                                               if not n[:1].isdigit()}:
        return True
    if is_local(host, local) and names & local:
        return True
    addrs = {str(a) for a in rec.get("addresses", []) or []}
    return bool(addrs) and bool(_addresses(host) & addrs)


def filter_leaving(hosts, elastic_dir, ttl, log, local, logged=None):
    """Drops hosts named by a leaving record.  A record is removed once its
    host is no longer discovered (a replacement may reuse the name) or it is
    older than ttl seconds.  `logged` (a set) keeps each exclusion to one
    log line."""
    logged = set() if logged is None else logged
    records = read_leaving(elastic_dir)
    now = time.time()
    leaving = set()
    for path, rec in records.items():
        matched = [h for h, _ in hosts if record_matches(rec, h, local)]
        try:
            age = now - os.stat(path).st_mtime
        except OSError:
            continue
        if not matched or age > ttl:
            why = ("no longer discovered" if not matched else f"older than {ttl:g} s")
            log(f"leaving record for {rec.get('host')} removed ({why})")
            try:
                os.unlink(path)
            except OSError:
                pass
            continue
        for h in matched:
            key = (h, path, rec.get("time"))
            if h not in leaving and key not in logged:
                logged.add(key)
                why = ": ".join(str(x) for x in (rec.get("source", "?"), rec.get("reason")) if x)
                log(f"excluding {h}: its ranks received a preemption notice ({why})")
            leaving.add(h)
    return [(h, s) for h, s in hosts if h not in leaving], sorted(leaving)


# ---- reachability -------------------------------------------------------------

def probe_command(given, mpi_args, log):
    """The probe's command words (HOST and 'true' follow), or None (no
    probe): `given` (--probe-command), else the rsh agent mpirun will use."""
    if given is not None:
        return None if given == "none" else shlex.split(given)
    agent = rsh_agent(mpi_args)
    if agent is None:
        log("inside a Slurm allocation mpirun starts its daemons through srun: hosts are not "
            "probed (--probe-command to set a probe)")
    return agent


def rsh_agent(mpi_args):
    """The agent mpirun will use: --mca plm_rsh_agent X in the arguments
    (Open MPI 5's PRRTE: plm_ssh_agent, prte_ssh_agent, or --prtemca),
    else OMPI_MCA_plm_rsh_agent / PRTE_MCA_plm_ssh_agent, else ssh (Open
    MPI's default 'ssh : rsh'); None inside a Slurm allocation when none is
    set."""
    agent = None
    for i, a in enumerate(mpi_args[:-2]):
        if a in ("--mca", "-mca", "--gmca", "-gmca", "--prtemca", "-prtemca") and mpi_args[i + 1] in (
                "plm_rsh_agent", "orte_rsh_agent", "pls_rsh_agent",
                "plm_ssh_agent", "prte_ssh_agent", "pls_ssh_agent"):
            agent = mpi_args[i + 2]
    if agent is None:
        agent = (os.environ.get("OMPI_MCA_plm_rsh_agent") or
                 os.environ.get("OMPI_MCA_orte_rsh_agent") or
                 os.environ.get("PRTE_MCA_plm_ssh_agent") or
                 os.environ.get("PRTE_MCA_prte_ssh_agent"))
    if agent is None and os.environ.get("SLURM_JOB_ID"):
        return None
    agent = agent or "ssh"
    first = agent.split(":")[0].strip() or "ssh"
    words = shlex.split(first)
    if os.path.basename(words[0]) == "ssh":
        # Never wait for a password or a host-key prompt.
        words += ["-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]
    return words


DEFAULT_PROBE_CONCURRENCY = 64


def probe(hosts, agent, timeout, local, concurrency=DEFAULT_PROBE_CONCURRENCY):
    """{host: None (reachable) or 'reason'} for every host; this machine's
    own names are not probed, nor any host when agent is None.  At most
    `concurrency` probes run at once (each an agent process with its pipes:
    a thousand hosts at once would run out of file descriptors and
    processes), each bounded by timeout seconds, so the whole takes at most
    about ceil(len(hosts) / concurrency) * timeout."""
    result = {}
    lock = threading.Lock()

    def one(h):
        if agent is None or is_local(h, local):
            result[h] = None
            return
        try:
            r = subprocess.run(agent + [h, "true"], capture_output=True, text=True,
                               timeout=timeout, stdin=subprocess.DEVNULL,
                               start_new_session=True)
            why = None if r.returncode == 0 else (
                f"'{' '.join(agent)} {h} true' exited with {r.returncode}: "
                f"{r.stderr.strip()[-200:]}")
        except subprocess.TimeoutExpired:
            why = f"no answer within {timeout:g} s"
        except OSError as e:
            why = f"cannot run {agent[0]}: {e.strerror}"
        with lock:
            result[h] = why

    # A fixed set of worker threads takes the hosts in order: never more
    # than `concurrency` agents alive at once.
    todo = list(dict.fromkeys(hosts))
    next_index = [0]

    def worker():
        while True:
            with lock:
                if next_index[0] >= len(todo):
                    return
                h = todo[next_index[0]]
                next_index[0] += 1
            one(h)

    workers = [threading.Thread(target=worker, daemon=True)
               for _ in range(max(1, min(int(concurrency), len(todo))))]
    for t in workers:
        t.start()
    rounds = -(-len(todo) // max(1, len(workers) or 1))
    deadline = time.monotonic() + rounds * (timeout + 5)
    for t in workers:
        t.join(max(0.0, deadline - time.monotonic()))
    with lock:
        for h in hosts:
            result.setdefault(h, f"no answer within {timeout:g} s")
        return dict(result)
