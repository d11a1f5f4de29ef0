"""In-process recovery under tutti-run: Open MPI 5's fault tolerance
(`--with-ft ulfm`) turned on where it can be, and the completion check it
needs (docs/elastic.md, "tutti-run and in-process recovery").

Under `--with-ft ulfm` a SIGKILLed rank no longer ends the job: the survivors
recover in-process (tutti::recover(), the elastic loops).  But Open MPI
5.0.x's mpirun then exits 0 even when every rank was killed, so tutti-run
cannot take its exit status for a completed job.  World rank 0 writes
started-<attempt> after tutti::init() and finished-<attempt> at
tutti::shutdown() in TUTTI_RUN_DIR (src/preemption/leaving.cc); a job that
exits 0 having started but not finished failed."""
import os
import re
import shutil
import subprocess
import tempfile

COMM_FAILURE = 76  # tutti::kCommFailureExitCode (TUTTI_EXIT_ON_COMM_FAILURE)
MODES = ("auto", "on", "off")  # --ulfm
# Allocations whose mpirun starts ranks on other hosts without -H/--hostfile.
ALLOCATION_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "COBALT_JOBID", "FLUX_JOB_ID",
                   "OMPI_MCA_orte_default_hostfile", "PRTE_MCA_prte_default_hostfile")


def mpirun_version(mpirun):
    """What `mpirun --version` prints ("" when it cannot be run); tutti-run
    asks once per run."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout + out.stderr


def open_mpi_major(version):
    """Open MPI's major version from mpirun_version()'s text, or None
    (another MPI, or no answer)."""
    m = re.search(r"\(Open MPI\)\s+(\d+)\.", version)
    return int(m.group(1)) if m else None


def has_ft_option(mpi_args, values):
    """Whether mpirun's own options (before the program) hold --with-ft."""
    i = 0
    while i < len(mpi_args):
        a = mpi_args[i]
        key = a.split("=", 1)[0]
        if key in ("--with-ft", "-with-ft"):
            return True
        if not a.startswith("-"):
            return False
        i += 1 + (0 if "=" in a else values.get(key, 0))
    return False


def runs_on_this_host_only(mpi_args, host_options, local_names, values):
    """Whether every rank starts on this host: no host option naming another
    host among mpirun's options and no batch allocation around us."""
    if any(os.environ.get(v) for v in ALLOCATION_VARS):
        return False
    i = 0
    while i < len(mpi_args):
        a = mpi_args[i]
        key = a.split("=", 1)[0]
        if not a.startswith("-"):
            return True
        n = 0 if "=" in a else values.get(key, 0)
        if key in host_options and key not in ("-np", "-n", "-c", "--np"):
            if key in ("-H", "-host", "--host"):
                value = a.split("=", 1)[1] if "=" in a else (
                    mpi_args[i + 1] if i + 1 < len(mpi_args) else "")
                hosts = {h.split(":", 1)[0] for h in value.split(",") if h}
                if not hosts <= set(local_names):
                    return False
                n = 0 if "=" in a else 1
            else:
                return False  # a hostfile: may name any host
        i += 1 + n
    return True


class Completion:
    """Decides --ulfm auto|on|off and keeps TUTTI_RUN_DIR for the completion
    check, which runs wherever tutti-run has such a directory, fault
    tolerance on or not."""

    def __init__(self, opts, mpi_args, values, host_options, local_names, version, log):
        self.log = log
        os.environ.pop("TUTTI_RUN_DIR", None)  # set below, for this run only
        self.dir = None
        self.private = False  # a directory of our own, removed at the end
        if opts.get("elastic"):
            self.dir = os.path.join(opts["elastic_dir"], "run")
        elif opts.get("ckpt_dir"):
            self.dir = os.path.join(os.path.abspath(opts["ckpt_dir"]), ".tutti-run")
        elif runs_on_this_host_only(mpi_args, host_options, local_names, values):
            self.dir = tempfile.mkdtemp(prefix="tutti-run-")
            self.private = True
        mode = opts.get("ulfm", "auto")
        self.user_ft = has_ft_option(mpi_args, values)
        self.add_ft = False
        if mode != "off" and not self.user_ft:
            major = open_mpi_major(version)
            if major is not None and major >= 5:
                self.add_ft = self.dir is not None or mode == "on"
                if not self.add_ft:
                    log("in-process recovery off: no directory every rank can reach for the "
                        "completion check (Open MPI 5 exits 0 when every rank was killed under "
                        "--with-ft ulfm): give --ckpt-dir, or --ulfm on to trust mpirun's exit "
                        "status")
            elif mode == "on":
                log(f"--ulfm on: {opts['mpirun']} is not Open MPI 5 or newer; passing "
                    "--with-ft ulfm anyway")
                self.add_ft = True
        self.on = self.add_ft or self.user_ft
        if self.dir is not None:  # the check, with or without fault tolerance
            os.makedirs(self.dir, exist_ok=True)
            os.environ["TUTTI_RUN_DIR"] = self.dir
        if not self.on:
            return
        if self.dir is None:
            log("in-process recovery on without a completion check: a job whose ranks were "
                "all killed reads as completed (give --ckpt-dir)")
        log("in-process recovery on (Open MPI 5 `--with-ft ulfm`" +
            (", passed by the user" if self.user_ft else "") +
            "): the other ranks survive a killed one where the program recovers "
            "in-process (the elastic loops do)")

    def mpi_args(self):
        return ["--with-ft", "ulfm"] if self.add_ft else []

    def prepare(self, attempt):
        """Before a start: no record of this attempt is left from before."""
        if not self.dir:
            return
        for event in ("started", "finished"):
            try:
                os.unlink(os.path.join(self.dir, f"{event}-{attempt}"))
            except OSError:
                pass

    def judge(self, attempt, status):
        """The job's status, 76 for one that exited 0 without finishing."""
        if status != 0 or not self.dir:
            return status
        started = os.path.exists(os.path.join(self.dir, f"started-{attempt}"))
        finished = os.path.exists(os.path.join(self.dir, f"finished-{attempt}"))
        if started and not finished:
            self.log("mpirun exited 0, but rank 0 never shut tutti down (every rank killed, "
                     "or a host's daemon? Open MPI 5 exits 0 then): counted as a failure "
                     f"(status {COMM_FAILURE})")
            return COMM_FAILURE
        return status

    def close(self):
        if self.private and self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
