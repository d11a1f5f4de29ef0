// The "leaving host" record of elastic mode (docs/elastic.md): a rank whose
// own node received a stop notice writes $TUTTI_ELASTIC_DIR/leaving/<host>,
// and tutti-run leaves that host out of the next start.
#pragma once

#include <string>

namespace tutti {
namespace preempt {

// Whether a notice from `source` (a PreemptionMonitor source name: "file",
// "aws", "gcp", "azure", or a signal's name) says this node is going away.
// Metadata and the trigger file are node-local.  A signal is node-local
// unless it came from this process's parent (mpirun or its daemon, which
// forward tutti-run's notice to every rank of every node): `signal_sender`
// is the sender's pid (0 when the kernel or another pid namespace sent it).
bool notice_is_node_local(const std::string& source, int signal_sender);

// Writes the record for this host when TUTTI_ELASTIC_DIR
// is set: {"host", "names", "addresses", "source", "reason", "time", "job",
// "pid"}; host = TUTTI_ELASTIC_HOST, else gethostname().  Never throws: a
// failure is logged (the job still stops; tutti-run then finds the host by
// probing or not at all).
void record_leaving(const std::string& source, const std::string& reason);

// Writes $TUTTI_ELASTIC_DIR/exited/<host>-<pid> when TUTTI_ELASTIC_DIR is
// set: {"host", "pid", "status", "attempt", "reason", "time"} (attempt =
// TUTTI_RESTART_COUNT), for a rank about to end with `status` on a
// communication failure.  tutti-run ends an mpirun that
// outlives such a record by its --exit-grace (OpenMPI can wait forever for
// the daemon of a host that vanished).  Never throws; a failure is printed.
void record_exit(int status, const std::string& reason);

// The job's own account of how far it got, for tutti-run's completion check
// (docs/elastic.md, "Completion under --with-ft ulfm"): writes
// $TUTTI_RUN_DIR/<event>-<attempt> when TUTTI_RUN_DIR is set, with
// {"event", "attempt", "host", "pid", "rank" (0), "size", "time"} (attempt =
// TUTTI_RESTART_COUNT).  World rank 0 calls it, with the world's size, with
// "started" once tutti is initialised and with "finished" when it shuts
// down.  Under Open MPI 5's
// `--with-ft ulfm`, mpirun exits 0 even when every rank was SIGKILLed; a job
// that started without finishing is then a failure to tutti-run.  Never
// throws; a failure is printed.
void record_run_event(const char* event, int size);

}  // namespace preempt
}  // namespace tutti
