"""tutti-run: run a tutti job under mpirun, survive preemption notices and
failures, and (elastic mode) follow the hosts that come and go.

usage: tutti-run [tutti-run options] [--] MPIRUN-ARGS... PROGRAM [ARGS...]
       tutti-run --min-np N --max-np M (--host-discovery-script PATH |
                 --hostfile PATH) [options] [--] [MPIRUN-ARGS...] PROGRAM [ARGS...]

Everything after tutti-run's own options goes to mpirun unchanged
(--map-by, --mca, ..., then the program and its arguments).  Without
--min-np/--max-np, -np, --hostfile and -H are mpirun's, as before.

  --max-restarts N   restarts after failures without progress (default:
                     TUTTI_MAX_RESTARTS, else 3); a run that advanced the
                     committed checkpoint step, or that ended with 75
                     (preempted or resized), resets the count
  --backoff S        delay before the first restart after a failure,
                     doubled for each further failure without progress,
                     capped at 60 s (default: TUTTI_RESTART_BACKOFF_S, else 1)
  --mpirun PATH      the launcher (default: TUTTI_MPIRUN, else mpirun)
  --stop-timeout S   after forwarding a stop notice, wait at most S seconds
                     for the job to checkpoint and exit, then terminate it
                     (default 0: wait; the platform's SIGKILL is the bound)
  --ckpt-dir DIR     the job's checkpoint directory, read for progress
                     (<DIR>/latest) (default: TUTTI_CKPT_DIR)
  --ulfm MODE        in-process recovery from killed ranks (docs/elastic.md):
                     auto (default: TUTTI_RUN_ULFM, else auto) passes
                     `--with-ft ulfm` to an Open MPI 5 mpirun when tutti-run
                     has a directory every rank can reach for its completion
                     check (the elastic directory, <ckpt-dir>/.tutti-run, or
                     a private one when every rank runs on this host); on:
                     always; off: never.  With it, a rank that dies while
                     the program recovers in-process (the elastic loops) is
                     survived by the others without a restart; elsewhere the
                     job restarts as before.  Open MPI 5 then exits 0 even
                     when every rank was killed: a job whose rank 0 started
                     tutti but never shut it down counts as failed (76)

Elastic mode (docs/elastic.md):
  --min-np N, --max-np M        run between N and M ranks; tutti-run passes
                                -np K -H h1:s1,... to mpirun itself
                                (K = min(M, usable slots)); -np, -H, --host
                                and --hostfile in MPIRUN-ARGS are refused
  --host-discovery-script PATH  prints 'host:slots' (or 'host') per line,
                                exit 0; run before every start and every
                                --discovery-interval while the job runs
  --hostfile PATH               instead of a script: re-read before every
                                start ('host slots=N' or 'host:N' lines)
  --elastic-dir DIR             launcher directory every rank can reach
                                (default $TUTTI_CKPT_DIR/.elastic; required
                                without TUTTI_CKPT_DIR)
  --discovery-interval S        (default 5); while a job runs, a host that
                                failed a probe is probed again (in the
                                background) at every discovery, so one that
                                comes back is used at the next boundary
  --np-multiple-of K            run only at sizes that are multiples of K
                                (the largest <= min(max-np, usable slots)
                                and >= min-np), e.g. so that the size
                                divides the job's global batch (default 1)
  --exit-grace S                when a rank ended on a communication failure
                                (it leaves a record in the elastic
                                directory), give mpirun S seconds to end,
                                then terminate it and restart without the
                                hosts that do not answer (OpenMPI can wait
                                forever for a host that vanished)
                                (default 30)
  --grow-interval S             at most one grow per S seconds (default 60)
  --wait-timeout S              how long to wait for --min-np usable slots
                                before giving up (default 600)
  --leaving-ttl S               how long a host recorded as leaving stays
                                excluded while it is still discovered
                                (default 600)
  --probe-timeout S             bound on the reachability probe of each host
                                (default 10)
  --probe-concurrency N         at most N probes at once (default 64: each is an
                                agent process with its pipes, and a
                                thousand at once would exhaust file
                                descriptors); N unanswered hosts cost about
                                --probe-timeout each round
  --probe-command CMD           run as 'CMD HOST true' to probe a host
                                (default: the rsh agent mpirun will use:
                                --mca plm_rsh_agent, OMPI_MCA_plm_rsh_agent,
                                else ssh in batch mode; inside a Slurm
                                allocation without an agent: none, as
                                mpirun launches through srun); none: no probe

Signals:
  SIGTERM, SIGHUP,   sent to tutti-run (a spot interruption, `docker stop`,
  SIGUSR1, SIGUSR2   a Kubernetes pod deletion, `scancel`, Slurm
                     --signal=B:USR1)
                     become SIGUSR1 to mpirun, which forwards it to every
                     rank.  OpenMPI answers a SIGTERM by killing the ranks
                     within seconds; SIGUSR1 lets them reach the next step
                     boundary, commit a checkpoint and exit with 75.
                     tutti-run then exits with the job's status and does not
                     restart: the machine is going away.  A signal that
                     arrives while mpirun is being started is held and
                     forwarded once it runs.  The SIGUSR1 is repeated every
                     2 s until the job ends; mpirun starts with SIGUSR1
                     ignored, and Open MPI's mpirun puts that back when it
                     exits, so a repeat that reaches it then is ignored.
  SIGINT             the first one as SIGTERM; a second one terminates the
                     job at once.
mpirun runs in its own session, so a signal sent to tutti-run's process group
does not reach it directly.  If tutti-run dies (even by SIGKILL) the kernel
sends mpirun SIGTERM, which ends the ranks; if mpirun dies by SIGKILL,
tutti-run kills the processes it leaves in its session.

Restarts: a job exiting with 75 (it stopped on a notice the ranks received
themselves: a metadata endpoint, the trigger file) or with any other failure
is started again, up to --max-restarts failures without progress; it resumes
from its latest checkpoint (the program calls CheckpointManager::load_latest).
The job sees TUTTI_RESTART_COUNT (0 for the first run); with Open MPI every
TUTTI_* variable is exported to remote ranks with -x.  In elastic mode every
restart discovers the hosts again, drops those recorded as leaving and those
that do not answer a probe, and starts at the new size.

Communication failures: tutti-run sets TUTTI_EXIT_ON_COMM_FAILURE=1 for the
job (unless it is set), so a rank whose communicator broke because a peer or
the network failed (a TUTTI_TIMEOUT expiry, an NCCL asynchronous error) ends
with 76 at once, even if no application thread would see the error; the job
is restarted like any other failure.  In elastic mode such a rank first
writes <elastic dir>/exited/<host>-<pid>, and an mpirun still running
--exit-grace seconds after the first record (waiting for a host that
vanished) is terminated, and the job restarted without that host.

Exit status: the last job's (0 done, 75 preempted, 76 a peer or the network
failed, 128+N killed by signal N, else the failure's code); 1 when elastic
mode found too few slots within --wait-timeout before any job ran.  After a
75 tutti-run says that mpirun's "job has been aborted" banners are expected.
An mpirun killed by a SIGUSR1 that tutti-run forwarded (a launcher that
resets SIGUSR1 to its default action while it exits) counts as 75 when a
checkpoint was committed since the notice (--ckpt-dir), else as 138.
"""
import os
import sys

from . import hosts as H
from .completion import MODES as ULFM_MODES

NUMBER_FLAGS = {
    "--max-restarts": ("max_restarts", int), "--backoff": ("backoff", float),
    "--stop-timeout": ("stop_timeout", float), "--min-np": ("min_np", int),
    "--max-np": ("max_np", int), "--discovery-interval": ("discovery_interval", float),
    "--grow-interval": ("grow_interval", float), "--wait-timeout": ("wait_timeout", float),
    "--leaving-ttl": ("leaving_ttl", float), "--probe-timeout": ("probe_timeout", float),
    "--np-multiple-of": ("np_multiple_of", int), "--exit-grace": ("exit_grace", float),
    "--probe-concurrency": ("probe_concurrency", int),
}
STRING_FLAGS = {
    "--mpirun": "mpirun", "--host-discovery-script": "discovery_script",
    "--hostfile": "hostfile", "--elastic-dir": "elastic_dir", "--ckpt-dir": "ckpt_dir",
    "--probe-command": "probe_command", "--ulfm": "ulfm",
}
# mpirun options that choose hosts or the size: tutti-run's in elastic mode.
HOST_OPTIONS = ("-np", "-n", "-c", "--np", "-H", "-host", "--host", "-hostfile", "--hostfile",
                "--machinefile", "-machinefile", "--default-hostfile")

# mpirun options followed by values (how many), to find where the program starts.
MPIRUN_VALUES = {"--mca": 2, "-mca": 2, "--gmca": 2, "-gmca": 2, "-x": 1, "--map-by": 1,
                 "-map-by": 1, "--bind-to": 1, "-bind-to": 1, "--rank-by": 1, "-rank-by": 1,
                 "--npernode": 1, "-npernode": 1, "--npersocket": 1, "--wdir": 1, "-wdir": 1,
                 "--prefix": 1, "--output-filename": 1, "--cpus-per-proc": 1, "--tune": 1,
                 "--am": 1, "--path": 1, "--preload-files": 1, "--report-bindings": 0,
                 # Open MPI 5 (PRRTE)
                 "--prtemca": 2, "-prtemca": 2, "--pmixmca": 2, "-pmixmca": 2,
                 "--with-ft": 1, "--output": 1, "--runtime-options": 1}


def die(msg):
    sys.exit(f"tutti-run: {msg}")


def env_number(name, default, kind):
    value = os.environ.get(name, "")
    if value == "":
        return default
    try:
        return kind(value)
    except ValueError:
        die(f"{name}={value!r} is not a number")


def parse_args(argv):
    opts = {
        "max_restarts": env_number("TUTTI_MAX_RESTARTS", 3, int),
        "backoff": env_number("TUTTI_RESTART_BACKOFF_S", 1.0, float),
        "mpirun": os.environ.get("TUTTI_MPIRUN", "mpirun"),
        "stop_timeout": 0.0, "min_np": None, "max_np": None, "discovery_script": None,
        "hostfile": None, "elastic_dir": None, "ckpt_dir": os.environ.get("TUTTI_CKPT_DIR") or None,
        "discovery_interval": 5.0, "grow_interval": 60.0, "wait_timeout": 600.0,
        "leaving_ttl": 600.0, "probe_timeout": 10.0, "probe_command": None,
        "np_multiple_of": 1, "exit_grace": 30.0,
        "probe_concurrency": H.DEFAULT_PROBE_CONCURRENCY,
        "ulfm": os.environ.get("TUTTI_RUN_ULFM") or "auto",
    }
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if a in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        key = a.split("=", 1)[0]
        if key not in NUMBER_FLAGS and key not in STRING_FLAGS:
            break
        if "=" in a:
            value = a.split("=", 1)[1]
        elif i + 1 < len(argv):
            i += 1
            value = argv[i]
        else:
            die(f"{a} needs a value")
        if key in STRING_FLAGS:
            opts[STRING_FLAGS[key]] = value
        else:
            name, kind = NUMBER_FLAGS[key]
            try:
                opts[name] = kind(value)
            except ValueError:
                die(f"{key} {value!r} is not a number")
        i += 1
    rest = argv[i:]
    elastic = opts["min_np"] is not None or opts["max_np"] is not None
    opts["elastic"] = elastic
    if not elastic and opts["hostfile"] is not None:
        # Without elastic mode --hostfile is mpirun's, as it always was.
        rest = ["--hostfile", opts["hostfile"]] + rest
        opts["hostfile"] = None
    if not rest:
        die("nothing to run (usage: tutti-run [options] MPIRUN-ARGS... PROGRAM)")
    for k in ("max_restarts", "backoff", "stop_timeout", "discovery_interval", "grow_interval",
              "wait_timeout", "leaving_ttl", "probe_timeout", "exit_grace"):
        if opts[k] < 0:
            die(f"--{k.replace('_', '-')} must be >= 0, got {opts[k]}")
    if opts["ulfm"] not in ULFM_MODES:
        die(f"--ulfm {opts['ulfm']!r}: expected auto, on or off")
    if opts["probe_concurrency"] < 1:
        die(f"--probe-concurrency must be >= 1, got {opts['probe_concurrency']}")
    if elastic:
        check_elastic(opts, rest)
    elif opts["discovery_script"] or opts["elastic_dir"]:
        die("--host-discovery-script and --elastic-dir need --min-np/--max-np")
    return opts, rest


def check_elastic(opts, rest):
    lo, hi = opts["min_np"], opts["max_np"]
    if lo is None or hi is None:
        die("elastic mode needs both --min-np and --max-np")
    if lo < 1 or hi < lo:
        die(f"--min-np {lo} and --max-np {hi}: need 1 <= min-np <= max-np")
    k = opts["np_multiple_of"]
    if k < 1:
        die(f"--np-multiple-of must be >= 1, got {k}")
    if hi - hi % k < lo:
        die(f"--np-multiple-of {k}: no multiple of {k} between --min-np {lo} and --max-np {hi}")
    if bool(opts["discovery_script"]) == bool(opts["hostfile"]):
        die("elastic mode needs exactly one of --host-discovery-script and --hostfile")
    i = 0
    while i < len(rest):  # mpirun's options, up to the program
        a = rest[i]
        key = a.split("=", 1)[0]
        if key in HOST_OPTIONS:
            die(f"elastic mode: '{a}' among the mpirun arguments; tutti-run passes -np and -H "
                f"itself from --min-np/--max-np and the discovered hosts")
        if not a.startswith("-"):
            break  # the program: its own arguments may be anything
        i += 1 + (0 if "=" in a else MPIRUN_VALUES.get(key, 0))
    if opts["discovery_script"]:
        s = opts["discovery_script"]
        if not (os.path.isfile(s) and os.access(s, os.X_OK)):
            die(f"--host-discovery-script {s}: not an executable file")
        opts["discovery_script"] = os.path.abspath(s)
    if not opts["elastic_dir"]:
        if not opts["ckpt_dir"]:
            die("elastic mode needs --elastic-dir DIR (or TUTTI_CKPT_DIR, whose .elastic "
                "subdirectory is the default): a directory every rank can reach")
        opts["elastic_dir"] = os.path.join(opts["ckpt_dir"], ".elastic")
    opts["elastic_dir"] = os.path.abspath(opts["elastic_dir"])
    try:
        os.makedirs(os.path.join(opts["elastic_dir"], "leaving"), exist_ok=True)
    except OSError as e:
        die(f"cannot create the elastic directory {opts['elastic_dir']}: {e.strerror}")
