// tutti::init / shutdown and the world group.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/backoff.h"
#include "comm/device_communicator.h"
#include "comm/mpi/status_service.h"
#include "comm/mpi/ulfm.h"
#include "comm/process_group_impl.h"
#include "comm/rank_list.h"
#include "comm/registry.h"
#include "core/check.h"
#include "core/clock.h"
#include "core/gemm.h"
#include "core/runtime_state.h"
#include "core/stream_cache.h"
#include "core/timeline.h"
#include "preemption/leaving.h"
#include "tutti/config.h"
#include "tutti/log.h"
#include "tutti/process_group.h"
#include "tutti/recovery.h"

namespace tutti {
namespace {

struct WorldState {
  std::recursive_mutex mu;
  bool initialized = false;
  bool atexit_registered = false;
  mpi::InitState mpi_state;
  bool use_mpi = false;
  ProcessGroupPtr world;
  std::shared_ptr<mpi::MpiCommunicator> world_mpi;  // world's host communicator
  int local_rank = 0;
  int local_size = 1;
  std::mutex registry_mu;
  std::vector<std::weak_ptr<mpi::MpiCommunicator>> mpi_comms;
  std::vector<std::weak_ptr<comm::DeviceCommunicator>> device_comms;  // NCCL, staged
  std::atomic<bool> any_poisoned{false};
  std::atomic<int> recovery_scopes{0};  // RecoveryScope objects alive
  bool recovered = false;  // recover() ran: processes of this job died
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

struct Registered {
  std::vector<std::shared_ptr<mpi::MpiCommunicator>> mpis;
  std::vector<std::shared_ptr<comm::DeviceCommunicator>> devices;
};

// The live registered communicators; `forget`: the registry drops them all
// (shutdown(), recover()).
Registered take_registered(WorldState& s, bool forget) {
  Registered out;
  std::lock_guard<std::mutex> lock(s.registry_mu);
  for (auto& w : s.device_comms)
    if (auto c = w.lock()) out.devices.push_back(c);
  for (auto& w : s.mpi_comms)
    if (auto c = w.lock()) out.mpis.push_back(c);
  if (forget) {
    s.device_comms.clear();
    s.mpi_comms.clear();
  }
  return out;
}

// ULFM (mpi/ulfm.h): the first failure seen revokes every communicator
// tutti has, so that a rank blocked in an op that does not involve the dead
// peer directly fails too instead of waiting for TUTTI_TIMEOUT.
void revoke_all() {
  for (auto& c : take_registered(state(), /*forget=*/false).mpis) c->revoke();
}

// The world over `base` (MPI_COMM_WORLD, or the survivors after a
// recovery): the status service, tutti's duplicate, the node group.  Holds
// s.mu.
void build_mpi_world(WorldState& s, MPI_Comm base) {
  int wr = 0, ws = 1;
  TUTTI_MPI_CHECK(MPI_Comm_rank(base, &wr), "init");
  TUTTI_MPI_CHECK(MPI_Comm_size(base, &ws), "init");
  set_runtime_world(wr, ws);
  mpi::StatusService::instance().start(base);
  MPI_Comm dup;
  TUTTI_MPI_CHECK(MPI_Comm_dup(base, &dup), "init");
  s.world_mpi = std::make_shared<mpi::MpiCommunicator>(dup, "world", 1);
  comm::register_communicator(s.world_mpi);
  s.world = std::make_shared<ProcessGroup>(
      std::make_unique<ProcessGroupImpl>("world", s.world_mpi));
  auto node = s.world->node_group();
  s.local_rank = node->rank();
  s.local_size = node->size();
  if (mpi::ulfm::enabled()) mpi::ulfm::set_on_failure(revoke_all);
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
  // A dead peer under ULFM (kRanksLost) ends the process as the others do,
  // unless the program recovers in-process (a RecoveryScope, recovery.h).
  const bool lost = c == ErrorCode::kRanksLost;
  if (peer_failure || lost || c == ErrorCode::kNccl) note_communicator_poisoned();
  if (lost && state().recovery_scopes.load() > 0) return;
  if (!(peer_failure || lost) || !config::get_bool("TUTTI_EXIT_ON_COMM_FAILURE")) return;
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
    build_mpi_world(s, mpi::ulfm::base());
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
  // tutti-run's completion check (preemption/leaving.h).
  if (s.world->rank() == 0) preempt::record_run_event("started", s.world->size());
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
  // Before anything that could wait on a peer: the job got this far.
  if (s.world && s.world->rank() == 0)
    preempt::record_run_event("finished", s.world->size());
  const Registered live = take_registered(s, /*forget=*/true);
  const auto& mpis = live.mpis;
  const auto& devices = live.devices;
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
  s.world_mpi.reset();
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
    } else if (s.recovered) {
      // Open MPI 5.0.11's fault-tolerant MPI_Finalize hung in about one run
      // in five after ranks died (survivors in a retry loop inside it,
      // docs/elastic.md); its launcher takes an exit without it.
      TUTTI_LOG(kInfo) << "not finalising MPI: ranks of this job died (recovered "
                          "in-process), and MPI_Finalize may then hang; exit the process";
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

RecoveryScope::RecoveryScope() { state().recovery_scopes.fetch_add(1); }
RecoveryScope::~RecoveryScope() { state().recovery_scopes.fetch_sub(1); }

bool recovery_available() {
  auto& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  return s.initialized && s.use_mpi && mpi::ulfm::enabled();
}

RecoveryResult recover() {
  auto& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  TUTTI_ARG_CHECK(s.initialized, "tutti is not initialised: call tutti::init() first");
  if (!s.use_mpi || !mpi::ulfm::enabled())
    TUTTI_THROW(kUnsupported, "tutti::recover() needs an MPI with ULFM launched with fault "
                "tolerance on (Open MPI 5: `mpiexec --with-ft ulfm`) and TUTTI_ULFM=1; ",
                !s.use_mpi ? "this world runs without MPI"
                : mpi::ulfm::compiled() ? "this run has it off"
                                        : "this tutti was built against an MPI without it");
  const auto t0 = std::chrono::steady_clock::now();
  RecoveryResult out;
  out.old_size = s.world->size();
  // 1. Every communicator over the old world fails now on every member
  //    (those that saw no error yet too), then the survivors shrink it.
  revoke_all();
  const double revoke_s = seconds_since(t0);
  const mpi::ulfm::Shrunk shrunk = mpi::ulfm::shrink(s.world_mpi->comm());
  const auto t_release = std::chrono::steady_clock::now();
  out.lost = shrunk.lost;
  out.attempts = shrunk.attempts;
  // 2. Release everything derived from the old world: device communicators
  //    first (NCCL aborted), then the MPI ones, without waiting for peers.
  const Registered live = take_registered(s, /*forget=*/true);
  const auto& mpis = live.mpis;
  const auto& devices = live.devices;
  for (auto& c : devices) c->abandon();
  for (auto& c : mpis) c->abandon();
  s.world.reset();
  s.world_mpi.reset();
  mpi::StatusService::instance().stop();
  const double release_s = seconds_since(t_release);
  // 3. The survivors are the world now.
  const auto t_build = std::chrono::steady_clock::now();
  mpi::ulfm::set_base(shrunk.comm);
  build_mpi_world(s, shrunk.comm);
  const double build_s = seconds_since(t_build);
  s.any_poisoned = false;  // what timed out lived on the old world
  s.recovered = true;
  out.new_size = s.world->size();
  out.new_rank = s.world->rank();
  out.seconds = seconds_since(t0);
  if (out.new_rank == 0) {
    TUTTI_LOG(kInfo) << "recovered in-process: lost world rank" << (out.lost.size() > 1 ? "s " : " ")
                     << comm::join_ranks(out.lost, ", ") << "; world size " << out.old_size << " -> " << out.new_size
                     << " in " << out.seconds << " s (" << out.attempts << " shrink"
                     << (out.attempts > 1 ? "s" : "") << ")";
  }
  // Where the time went, on every survivor (docs/elastic.md: recovery
  // across hosts).
  TUTTI_LOG(kDebug) << "recover(): revoke " << revoke_s << " s, shrink " << shrunk.shrink_s
                    << " s, agree " << shrunk.agree_s << " s, release " << release_s
                    << " s, new world " << build_s << " s";
  return out;
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

// ---- Tensor-parallel jobs: a TP group that lost a member leaves whole -------

namespace {

// Which survivors of a TP x DP world stay after `lost` died: the members of
// TP groups (tp consecutive ranks of the old world) that lost nobody.
struct TpDrop {
  std::vector<int> survivors;  // old world ranks, in order (the shrunken world's)
  std::vector<int> left;       // survivors of incomplete TP groups
  int stayers = 0;
};

TpDrop tp_drop(int old_size, const std::vector<int>& lost, int tp) {
  std::vector<bool> dead(static_cast<size_t>(old_size), false);
  std::vector<bool> broken(static_cast<size_t>(old_size / tp), false);
  for (int r : lost) {
    dead[static_cast<size_t>(r)] = true;
    broken[static_cast<size_t>(r / tp)] = true;
  }
  TpDrop d;
  for (int r = 0; r < old_size; ++r) {
    if (dead[static_cast<size_t>(r)]) continue;
    d.survivors.push_back(r);
    if (broken[static_cast<size_t>(r / tp)])
      d.left.push_back(r);
    else
      ++d.stayers;
  }
  return d;
}

// Every communicator over tutti's current world (the survivors', healthy,
// built by recover() moments ago) closed as shutdown() closes them, on every
// survivor alike.  Not abandon(): its revoke could reach a member that freed
// the communicator already, which Open MPI 5.0.11 does not survive
// (ompi_comm_revoke_local on a freed communicator: a segfault).  Holds s.mu.
void close_world(WorldState& s) {
  const Registered live = take_registered(s, /*forget=*/true);
  for (auto& c : live.devices) c->close();
  for (auto& c : live.mpis) c->close();
  mpi::StatusService::instance().stop();
}

}  // namespace

RecoveryResult recover(const RecoveryOptions& options) {
  const int tp = options.tp_size;
  {
    auto& s = state();
    std::lock_guard<std::recursive_mutex> lock(s.mu);
    TUTTI_ARG_CHECK(s.initialized, "tutti is not initialised: call tutti::init() first");
    // The same verdict on every rank (one world size), before anything changes.
    TUTTI_ARG_CHECK(tp >= 1 && s.world->size() % tp == 0, "tutti::recover: tp_size ", tp,
                    " must be positive and divide the world size ", s.world->size(),
                    " (the TP x DP mesh the job ran on)");
  }
  RecoveryResult out = recover();
  if (tp == 1) return out;
  auto& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  const auto t0 = std::chrono::steady_clock::now();
  const TpDrop drop = tp_drop(out.old_size, out.lost, tp);
  const int me = drop.survivors.at(static_cast<size_t>(out.new_rank));  // old world rank
  out.left = drop.left;
  out.leaving = std::find(drop.left.begin(), drop.left.end(), me) != drop.left.end();
  if (drop.left.empty()) return out;  // the dead were whole TP groups: nothing more leaves
  if (drop.stayers == 0)
    TUTTI_THROW(kRanksLost, "after losing world rank(s) ",
                comm::join_ranks(out.lost, ","), " every tensor-parallel group of ", tp,
                " lost a member: no complete model replica survives in-process (the job "
                "must restart from its last commit)");
  // The survivors' world is closed on every one of them, then the
  // shrunken base is split: the leavers get no communicator, the stayers one
  // in their old order (key: their rank among the survivors).
  close_world(s);
  MPI_Comm stay = MPI_COMM_NULL;
  TUTTI_MPI_CHECK(MPI_Comm_split(mpi::ulfm::base(), out.leaving ? MPI_UNDEFINED : 0,
                                 out.new_rank, &stay),
                  "recovery: dropping the incomplete tensor-parallel groups");
  const int survivors = out.new_size;
  if (out.leaving) {
    // world() stays the closed survivors' world: every op on it fails with
    // kAborted, nothing is computed alone by mistake.
    out.new_rank = -1;
    out.new_size = drop.stayers;
  } else {
    TUTTI_MPI_CHECK(MPI_Comm_set_errhandler(stay, MPI_ERRORS_RETURN), "recovery");
    s.world.reset();
    s.world_mpi.reset();
    mpi::ulfm::set_base(stay);
    build_mpi_world(s, stay);
    out.new_size = s.world->size();
    out.new_rank = s.world->rank();
  }
  out.seconds += seconds_since(t0);
  if (out.new_rank == 0 || (out.leaving && me == drop.left.front()))
    TUTTI_LOG(kInfo) << "recovered a TP x DP mesh: tensor-parallel group(s) that lost world "
                     << "rank(s) " << comm::join_ranks(out.lost, ",") << " leave whole (their "
                     << "survivors " << comm::join_ranks(drop.left, ",") << "); " << survivors
                     << " -> " << drop.stayers << " ranks, TP " << tp << " x DP "
                     << drop.stayers / tp;
  return out;
}

}  // namespace tutti
