// tutti::init / shutdown and the world group.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/backoff.h"
#include "comm/device_communicator.h"
#include "comm/mpi/status_service.h"
#include "comm/process_group_impl.h"
#include "comm/registry.h"
#include "core/check.h"
#include "core/gemm.h"
#include "core/runtime_state.h"
#include "core/stream_cache.h"
#include "core/timeline.h"
#include "preemption/leaving.h"
#include "tutti/config.h"
#include "tutti/log.h"
#include "tutti/process_group.h"

namespace tutti {
namespace {

struct WorldState {
  std::recursive_mutex mu;
  bool initialized = false;
  bool atexit_registered = false;
  mpi::InitState mpi_state;
  bool use_mpi = false;
  ProcessGroupPtr world;
  int local_rank = 0;
  int local_size = 1;
  std::mutex registry_mu;
  std::vector<std::weak_ptr<mpi::MpiCommunicator>> mpi_comms;
  std::vector<std::weak_ptr<comm::DeviceCommunicator>> device_comms;  // NCCL, staged
  std::atomic<bool> any_poisoned{false};
  bool at_exit = false;  // shutdown() called by the atexit handler
};

WorldState& state() {
  static WorldState* s = new WorldState();  // outlives static destructors
  return *s;
}

void shutdown_at_exit() {
  try {
    state().at_exit = true;
    shutdown();
  } catch (const std::exception& e) {
    TUTTI_LOG(kError) << "shutdown at exit failed: " << e.what();
  }
}

void set_blas_threads(int local_size, int cores) {
  if (std::getenv("OPENBLAS_NUM_THREADS") || std::getenv("OMP_NUM_THREADS"))
    return;  // the user decided
  blas::set_num_threads(std::max(1, cores / std::max(1, local_size)));
}

// TUTTI_TIMELINE: a trace that cannot be created is logged, not raised: a
// diagnostic must not stop the job it would describe.
void start_timeline_from_env() {
  try {
    timeline::start_from_env();
  } catch (const std::exception& e) {
    TUTTI_LOG(kError) << "no timeline recorded: " << e.what();
  }
}

}  // namespace

namespace comm {
void register_communicator(const std::shared_ptr<mpi::MpiCommunicator>& c) {
  if (!c) return;
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.registry_mu);
  s.mpi_comms.push_back(c);
}
void note_communicator_poisoned() { state().any_poisoned = true; }
void communicator_broke(const Error& error) {
  // A peer or network failure may leave requests that never complete (a
  // check all-reduce a dead peer never joins): MPI_Finalize could hang.  A
  // mismatch or a rejected argument completed its exchanges.
  const ErrorCode c = error.code();
  const bool peer_failure = c == ErrorCode::kTimeout || c == ErrorCode::kCommFailure;
  if (peer_failure || c == ErrorCode::kNccl) note_communicator_poisoned();
  if (!peer_failure || !config::get_bool("TUTTI_EXIT_ON_COMM_FAILURE")) return;
  // The job is beyond repair in this process (an NCCL kernel or MPI request
  // may never complete): end it with the code tutti-run restarts on, without
  // atexit handlers (shutdown() could wait on the dead peer).
  std::fprintf(stderr,
               "[tutti] %s\n[tutti] exiting with code %d "
               "(TUTTI_EXIT_ON_COMM_FAILURE=1): a peer or the network failed\n",
               error.message().c_str(), kCommFailureExitCode);
  // Elastic mode: tell tutti-run, which ends an mpirun that outlives this
  // record (OpenMPI 4.1 waits forever for the daemon of a vanished host).
  preempt::record_exit(kCommFailureExitCode, error.message());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(kCommFailureExitCode);
}
void register_communicator(const std::shared_ptr<DeviceCommunicator>& c) {
  if (!c) return;
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.registry_mu);
  s.device_comms.push_back(c);
}
}  // namespace comm

void init(const InitOptions& options) {
  auto& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  if (s.initialized) return;
  const std::string mode =
      options.world.empty() ? config::get_string("TUTTI_WORLD") : options.world;
  TUTTI_ARG_CHECK(mode == "auto" || mode == "mpi" || mode == "local",
                  "TUTTI_WORLD / InitOptions::world = '", mode,
                  "' (expected auto, mpi or local)");
  s.use_mpi = mode == "mpi" ||
              (mode == "auto" && (mpi::launched_by_launcher() || mpi::is_initialized()));
  if (s.use_mpi) {
    // Throws unless MPI grants MPI_THREAD_MULTIPLE (mpi_runtime.h): the
    // progress engines, watchdogs and the status responder are threads.
    s.mpi_state = mpi::initialize();
    int wr = 0, ws = 1;
    TUTTI_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &wr), "init");
    TUTTI_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &ws), "init");
    set_runtime_world(wr, ws);
    mpi::StatusService::instance().start(MPI_COMM_WORLD);
    MPI_Comm dup;
    TUTTI_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "init");
    auto world_comm = std::make_shared<mpi::MpiCommunicator>(dup, "world", 1);
    comm::register_communicator(world_comm);
    s.world = std::make_shared<ProcessGroup>(
        std::make_unique<ProcessGroupImpl>("world", world_comm));
    auto node = s.world->node_group();
    s.local_rank = node->rank();
    s.local_size = node->size();
  } else {
    set_runtime_world(0, 1);
    s.world = std::make_shared<ProcessGroup>(std::make_unique<ProcessGroupImpl>(
        "world", std::make_shared<comm::LocalCommunicator>("world")));
    s.local_rank = 0;
    s.local_size = 1;
  }
  // The machine's cores split among this node's ranks: BLAS threads, and
  // with more ranks than cores, waits that yield longer before they sleep
  // (comm/backoff.h).
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  set_blas_threads(s.local_size, cores);
  comm::set_oversubscribed(cores > 0 && s.local_size > cores);
  s.initialized = true;
  if (!s.atexit_registered) {
    std::atexit(shutdown_at_exit);
    s.atexit_registered = true;
  }
  start_timeline_from_env();
  TUTTI_LOG(kInfo) << "tutti initialised: rank " << s.world->rank() << " of "
                   << s.world->size() << " ("
                   << (s.use_mpi ? "MPI" : "local world of one")
                   << "), local rank " << s.local_rank << " of "
                   << s.local_size;
}

void shutdown() {
  auto& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  if (!s.initialized) return;
  std::vector<std::shared_ptr<mpi::MpiCommunicator>> mpis;
  std::vector<std::shared_ptr<comm::DeviceCommunicator>> devices;
  {
    std::lock_guard<std::mutex> rl(s.registry_mu);
    for (auto& w : s.device_comms)
      if (auto c = w.lock()) devices.push_back(c);
    for (auto& w : s.mpi_comms)
      if (auto c = w.lock()) mpis.push_back(c);
    s.device_comms.clear();
    s.mpi_comms.clear();
  }
  bool poisoned = s.any_poisoned.load();
  // Each close() runs what was submitted before it, then tells the other
  // members this rank left: a peer waiting for an op this rank never
  // entered fails at once, naming it as shut down (status_service.h).
  if (s.use_mpi) mpi::StatusService::instance().begin_shutdown();
  // Device communicators first: they run their ops through MPI (the NCCL
  // bootstrap and agreement check, the staged transport's exchanges).
  for (auto& c : devices) c->close();
  for (auto& c : mpis) {
    poisoned = poisoned || c->poisoned();
    c->close();
  }
  s.world.reset();
  // The per-stream cuBLAS handles and workspaces and other device scratch
  // (core/stream_cache.h), now that no collective uses them.  Not from the
  // atexit handler: the CUDA runtime may have been torn down before it.
  if (!s.at_exit) release_stream_caches();
  timeline::stop();  // after the last collective ended, before MPI goes
  if (s.use_mpi) {
    mpi::StatusService::instance().stop();
    if (poisoned) {
      // An abandoned request may never complete; MPI_Finalize could hang.
      TUTTI_LOG(kWarn) << "not finalising MPI: a communicator timed out "
                          "earlier; exit the process";
    } else {
      mpi::finalize(s.mpi_state);
    }
  }
  s.initialized = false;
  set_runtime_world(-1, -1);
}

bool initialized() {
  auto& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  return s.initialized;
}

ProcessGroupPtr world() {
  auto& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  TUTTI_ARG_CHECK(s.initialized, "tutti is not initialised: call tutti::init() first");
  return s.world;
}

std::string mpi_thread_level() {
  auto& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  TUTTI_ARG_CHECK(s.initialized, "tutti is not initialised: call tutti::init() first");
  return s.use_mpi ? mpi::thread_level_name(s.mpi_state.thread_level) : std::string();
}

int rank() { return world()->rank(); }
int size() { return world()->size(); }
int local_rank() {
  world();
  return state().local_rank;
}
int local_size() {
  world();
  return state().local_size;
}

}  // namespace tutti
