#include "comm/nccl/nccl_communicator.h"

#include "core/check.h"

#if TUTTI_WITH_NCCL
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "comm/backoff.h"
#include "comm/comm_settings.h"
#include "comm/mpi/window_check.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/status_service.h"
#include "comm/mpi/ulfm.h"
#include "comm/nccl/nccl_utils.h"
#include "comm/op_desc.h"
#include "comm/op_window.h"
#include "comm/progress_engine.h"
#include "comm/registry.h"
#include "comm/staged_work.h"
#include "comm/watchdog.h"
#include "core/cuda_utils.h"
#include "tutti/config.h"
#include "tutti/log.h"
#endif

namespace tutti {
namespace nccl {

#if TUTTI_WITH_NCCL

namespace {

// How a mismatch found by the overlapped check ends: peers may have started
// the NCCL op, so the communicator cannot be kept.
constexpr const char* kOverlapOutcome =
    "the NCCL communicator was aborted (ranks may have started the "
    "mismatched operation)";

// Ops per agreement check (comm/op_window.h): TUTTI_NCCL_CHECK_EVERY, or
// by default every op below 64 ranks (each check costs ceil(log2 W)
// messages) and one check per 64 ops from 64 ranks on.
int check_every(int size) {
  const int64_t k = config::get_int("TUTTI_NCCL_CHECK_EVERY");
  TUTTI_ARG_CHECK(k >= 0 && k <= 4096, "TUTTI_NCCL_CHECK_EVERY must be 0 (auto) or "
                  "1-4096 ops per agreement check, got ", k);
  if (k > 0) return static_cast<int>(k);
  return size < 64 ? 1 : 64;
}

// How often the watchdog polls while NCCL ops are in flight.
constexpr std::chrono::microseconds kWatchInterval(200);

}  // namespace

// Work of one NCCL operation: started (enqueued) by the engine, completed by
// the GPU and, in checked mode, by the agreement check; watched until then.
class CudaWork : public comm::StagedWork, public comm::WatchedOp {
 public:
  CudaWork(std::weak_ptr<NcclCommunicatorImpl> owner, int device,
           cudaStream_t user_stream)
      : comm::StagedWork("nccl", "cuda (posted)"), owner_(std::move(owner)),
        device_(device), user_stream_(user_stream) {}

  void wait() override;
  void synchronize() override;
  bool test() override;

  bool poll() override {
    std::lock_guard<std::mutex> lock(mu_);
    return poll_locked();
  }
  std::string phase() const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (check && !check->settled())
      return "agreeing on the operation with the other ranks";
    if (unchecked_from)
      return detail::cat("waiting for the GPU (the NCCL kernel never finished; ops #",
                         unchecked_from, "-#", seq, " are checked for agreement together "
                         "with the ops up to #", window_end, ", by #", window_end,
                         "'s check (TUTTI_NCCL_CHECK_EVERY): until it is submitted, ranks "
                         "that issued different ops can hang here; TUTTI_NCCL_CHECK_EVERY=1 "
                         "checks every op)");
    return "waiting for the GPU (the NCCL kernel never finished)";
  }
  void fail(std::exception_ptr error) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_ || complete_) return;
      error_ = error;
      stage_ = kDone;
    }
    cv_.notify_all();
  }

  // Both created on the communicator's device (submit() holds a guard).
  cuda::Event ready;  // recorded on the caller's stream at submission
  cuda::Event done;   // recorded on the communication stream
  // Posted by the engine before started() when this op closes a window of
  // checked ops (comm/op_window.h); null inside a window or unchecked.
  std::unique_ptr<mpi::WindowCheck> check;
  // What peers' status queries read: marked finished (seq) on completion.
  std::shared_ptr<mpi::CommProgress> status;
  uint64_t seq = 0;
  // Inside an open window: its first op and the op that closes it (0: none).
  uint64_t unchecked_from = 0;
  uint64_t window_end = 0;

 private:
  // mu_ held.  Throws what the check found.
  bool poll_locked() {
    if (complete_) return true;
    if (stage_ == kQueued || error_) return false;
    if (check && !check->test(comm::OpLabel(desc_))) return false;
    if (!done.query()) return false;
    complete_ = true;
    if (status) {  // ops may complete out of order: keep the largest
      uint64_t c = status->completed.load();
      while (c < seq && !status->completed.compare_exchange_weak(c, seq)) {
      }
    }
    return true;
  }
  // poll_locked() for a waiting user thread: a mismatch it finds breaks the
  // communicator as the watchdog would.  mu_ held on entry and exit.
  bool progress(std::unique_lock<std::mutex>& lock);

  std::weak_ptr<NcclCommunicatorImpl> owner_;
  int device_;
  cudaStream_t user_stream_;
  bool complete_ = false;
};

class NcclCommunicatorImpl {
 public:
  NcclCommunicatorImpl(std::shared_ptr<mpi::MpiCommunicator> host_comm,
                       int dev, std::string comm_name)
      : host(std::move(host_comm)), device(dev), name(std::move(comm_name)),
        watchdog("NCCL", name, hooks()), engine(name + "-nccl") {
    int lo = 0, hi = 0;
    cuda::DeviceGuard g(device);
    TUTTI_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    stream.reset(new cuda::Stream(device, hi));  // highest priority
    TUTTI_CUDA_CHECK(cudaMalloc(&scratch, 16));
    if (host) {
      // Phase 1 of the check is posted by the engine, phase 2 by whichever
      // thread finds a disagreement: separate communicators keep each one's
      // collectives in one order on every rank.  Duplicating is collective
      // on the host communicator, so it runs in order with its other
      // operations, non-blocking (MPI_Comm_idup) and waited for up to
      // TUTTI_TIMEOUT: a rank that is gone (or took another path) must end
      // in an error here, not in MPI_Comm_dup forever while the group's lock
      // is held.
      uint64_t id = 0;
      const double timeout_s = settings.get().timeout_s;
      host->run_ordered([this, &id, timeout_s] {
        const std::string what =
            detail::cat("setting up the agreement check of NCCL communicator '",
                        name, "'");
        const mpi::Deadline deadline(timeout_s);
        for (MPI_Comm* c : {&check, &check_detail}) {
          // On the heap: after a timeout the request stays pending and MPI
          // may still write the handle (leaked on purpose).
          auto out = std::make_unique<MPI_Comm>(MPI_COMM_NULL);
          MPI_Request req = MPI_REQUEST_NULL;
          TUTTI_MPI_CHECK(MPI_Comm_idup(host->comm(), out.get(), &req), what);
          int rc = MPI_SUCCESS;
          if (!mpi::wait_rc(&req, deadline, MPI_STATUS_IGNORE, &rc)) {
            (void)out.release();
            const Error err(
                ErrorCode::kTimeout,
                detail::cat(detail::rank_prefix(), what, " (MPI_Comm_idup of '",
                            host->name(), "', ", host->size(), " ranks) did not complete "
                            "within ", timeout_s, " s (TUTTI_TIMEOUT): a rank did not "
                            "join (it failed, or took another path)"));
            comm::communicator_broke(err);
            throw err;
          }
          if (rc != MPI_SUCCESS) mpi::throw_mpi_error(rc, "MPI_Comm_idup", what, __FILE__, __LINE__);
          *c = *out;
          TUTTI_MPI_CHECK(MPI_Comm_set_errhandler(*c, MPI_ERRORS_RETURN), what);
        }
        id = host->derived_id();
      });
      // Published for peers' status queries under an id every rank derives
      // alike (in the host communicator's order).
      status_id = id;
      mpi::StatusService::instance().add(status_id, progress);
    }
    const int d = device;
    watchdog.start_thread(kWatchInterval, [d] {
      return std::shared_ptr<void>(std::make_shared<cuda::DeviceGuard>(d));
    });
  }
  ~NcclCommunicatorImpl() { close(); }

  comm::Watchdog::Hooks hooks() {
    comm::Watchdog::Hooks h;
    h.async_error = [this] { return async_error(); };
    // ULFM: a dead process of the job ends the ops in flight (kRanksLost)
    // within a pass, instead of at TUTTI_TIMEOUT; recover() then abandons
    // this communicator.
    h.ranks_lost = [] { return mpi::ulfm::failure_note(); };
    h.abort = [this] { abort(); };
    h.on_broken = [](const Error& e) { comm::communicator_broke(e); };
    // Which ranks never arrived, asked over the host communicator's MPI
    // side channel (the status service), as the MPI path's timeouts do.
    h.peers = [this](uint64_t seq, bool stall) -> std::string {
      if (!host) return "";
      return mpi::peer_report(status_id, host->peer_world_ranks(), seq,
                              host->world_rank(host->rank()), stall,
                              host->name() == "world");
    };
    return h;
  }

  // "" while healthy, else NCCL's asynchronous error.
  std::string async_error() {
    std::lock_guard<std::mutex> lock(nccl_mu);
    if (!comm) return "";
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    if (q != ncclSuccess) return result_text(q, comm);
    if (state == ncclSuccess || state == ncclInProgress) return "";
    return result_text(state, comm);
  }

  // ncclCommAbort under the lock every NCCL call takes, so that no thread
  // is inside a call on the handle it frees.
  void abort() {
    std::lock_guard<std::mutex> lock(nccl_mu);
    if (!comm) return;
    cuda::DeviceGuard g(device);
    TUTTI_NCCL_WARN(ncclCommAbort(comm), "NCCL communicator '", name, "'");
    comm = nullptr;
  }

  // Waits (bounded) while an enqueue on the non-blocking communicator is in
  // progress, locking for each poll so an abort can come in between.
  ncclResult_t settle(ncclResult_t rc, const mpi::Deadline& deadline) {
    return await(
        [this](ncclResult_t* state) {
          std::lock_guard<std::mutex> lock(nccl_mu);
          if (!comm) return ncclInvalidUsage;  // aborted meanwhile
          return ncclCommGetAsyncError(comm, state);
        },
        rc, deadline);
  }

  void close();
  void execute(const OpRequest& r, bool checked,
               const std::shared_ptr<CudaWork>& work);
  // Enqueues `r` (nccl_mu held, device set); ncclInProgress is not an error.
  ncclResult_t enqueue(const OpRequest& r);
  // The error that breaks the communicator when an enqueue failed.
  [[noreturn]] void enqueue_failed(const comm::OpLabel& desc, ncclResult_t rc,
                                   double timeout);

  std::shared_ptr<mpi::MpiCommunicator> host;
  const int device;
  const std::string name;
  int rank = 0;
  int size = 1;
  std::mutex nccl_mu;          // guards `comm` and every NCCL call on it
  ncclComm_t comm = nullptr;   // null once aborted or closed
  std::unique_ptr<cuda::Stream> stream;
  void* scratch = nullptr;
  MPI_Comm check = MPI_COMM_NULL;
  MPI_Comm check_detail = MPI_COMM_NULL;
  comm::Watchdog watchdog;     // outlives the engine (declared before it)
  comm::ProgressEngine engine;
  // The newest op the engine took (ops complete in stream order, so its
  // completion means every earlier one completed): ProcessGroup::
  // synchronize() waits for it.
  std::mutex last_mu;
  std::shared_ptr<CudaWork> last_work;
  uint64_t next_seq = 0;       // collectives; engine task only
  std::unique_ptr<comm::OpWindow> window;  // checked collectives; engine task only
  uint64_t next_p2p_seq = 0;   // send/recv, numbered apart (two ranks only)
  std::atomic<bool> closed{false};
  std::mutex close_mu;
  comm::CommSettings settings;  // the hot path must not parse the environment
  // This rank's progress on the NCCL ops (entered when enqueued, finished
  // when the kernel and the check completed), for peers' status queries.
  std::shared_ptr<mpi::CommProgress> progress =
      std::make_shared<mpi::CommProgress>();
  uint64_t status_id = 0;  // 0: not published (no host)
};

void NcclCommunicatorImpl::close() {
  std::lock_guard<std::mutex> lock(close_mu);
  if (closed.exchange(true)) return;
  engine.stop();
  if (status_id) mpi::StatusService::instance().remove(status_id);
  // Ops in flight finish or fail first: the watchdog bounds them (with
  // TUTTI_TIMEOUT=0, as everywhere, a dead peer is waited for forever).
  while (watchdog.in_flight() > 0 && !watchdog.broken())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  watchdog.stop_thread();
  ncclComm_t c = nullptr;
  {
    std::lock_guard<std::mutex> nl(nccl_mu);
    std::swap(c, comm);
  }
  // Also runs from the destructor and at exit: log, never throw.
  try {
    cuda::DeviceGuard g(device);
    if (c) {
      const ncclResult_t rc =
          await(c, ncclCommFinalize(c), mpi::Deadline(settings.get().timeout_s));
      const std::string what = detail::cat("closing NCCL communicator '", name, "'");
      if (rc == ncclSuccess) {
        TUTTI_NCCL_WARN(ncclCommDestroy(c), what);
      } else {
        TUTTI_LOG(kWarn) << "NCCL communicator '" << name << "': ncclCommFinalize "
                         << (rc == ncclInProgress ? "did not finish in time"
                                                  : ncclGetErrorString(rc))
                         << "; aborting it";
        TUTTI_NCCL_WARN(ncclCommAbort(c), what);
      }
    }
    if (scratch) {
      const cudaError_t e = cudaFree(scratch);
      if (e != cudaSuccess)
        TUTTI_LOG(kWarn) << "closing NCCL communicator '" << name
                         << "': cudaFree failed: " << cudaGetErrorString(e);
    }
    stream.reset();
  } catch (const std::exception& e) {
    TUTTI_LOG(kWarn) << "closing NCCL communicator '" << name << "': " << e.what();
  }
  scratch = nullptr;
  if (mpi::is_initialized())
    for (MPI_Comm* m : {&check, &check_detail})
      if (*m != MPI_COMM_NULL)
        TUTTI_MPI_WARN(MPI_Comm_free(m), "closing NCCL communicator '", name, "'");
  check = check_detail = MPI_COMM_NULL;
}

void CudaWork::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  wait_started(lock);
  cuda::DeviceGuard g(device_);
  TUTTI_CUDA_CHECK(cudaStreamWaitEvent(user_stream_, done.get(), 0));
}

bool CudaWork::progress(std::unique_lock<std::mutex>& lock) {
  try {
    return poll_locked();
  } catch (...) {
    const Error err = detail::error_of(std::current_exception());
    lock.unlock();
    if (auto owner = owner_.lock()) owner->watchdog.break_with(err, this);
    fail(std::make_exception_ptr(err));  // if the watchdog did not yet hold it
    lock.lock();
    std::rethrow_exception(error_);
  }
}

bool CudaWork::test() {
  std::unique_lock<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
  if (stage_ == kQueued) return false;
  cuda::DeviceGuard g(device_);
  return progress(lock);
}

void CudaWork::synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  wait_started(lock);
  cuda::DeviceGuard g(device_);
  // The watchdog bounds this loop: at the deadline it fails the work.
  // Backs off like the MPI waits (comm::Backoff); a sleep is a wait on cv_,
  // so a failure (fail()) wakes it at once.
  comm::Backoff backoff = comm::Backoff::from_settings();
  for (;;) {
    if (error_) std::rethrow_exception(error_);
    if (progress(lock)) return;
    const comm::Backoff::Step step = backoff.next(comm::Backoff::Clock::now());
    if (step.kind == comm::Backoff::Kind::kSleep) {
      cv_.wait_for(lock, std::chrono::microseconds(step.sleep_us));
    } else {
      lock.unlock();
      comm::Backoff::pause(step);
      lock.lock();
    }
  }
}

void NcclCommunicatorImpl::execute(const OpRequest& r, bool checked,
                                   const std::shared_ptr<CudaWork>& work) {
  const auto start = comm::Watchdog::Clock::now();
  {
    std::lock_guard<std::mutex> lock(last_mu);
    last_work = work;
  }
  const bool p2p =
      r.kind == CollectiveKind::kSend || r.kind == CollectiveKind::kRecv;
  const uint64_t seq = p2p ? ++next_p2p_seq : ++next_seq;
  const comm::OpLabel desc(r, seq, name);
  const double timeout = r.options.timeout_s;
  const mpi::Deadline deadline(timeout);
  try {
    watchdog.throw_if_broken(desc.str());
    if (!p2p) {  // numbered like the collectives every rank counts
      progress->kind = static_cast<uint8_t>(r.kind);
      progress->entered = seq;
      work->status = progress;
      work->seq = seq;
    }
    std::exception_ptr local_error;
    const bool window_checked = host && size > 1 && checked && !p2p;
    try {
      // A bad TUTTI_NCCL_CHECK_EVERY fails like bad arguments: the
      // communicator breaks (its peers would wait for this op otherwise).
      if (window_checked && !window) window.reset(new comm::OpWindow(check_every(size)));
      comm::validate(r, rank, size, desc);
      check_p2p(r, rank, desc.str());
      if (r.kind != CollectiveKind::kBarrier) {
        TUTTI_ARG_CHECK(r.input.device() == Device::cuda(device) &&
                            r.output.device() == Device::cuda(device),
                        desc, ": this NCCL communicator serves cuda:", device,
                        ", got ", r.input.str(), " -> ", r.output.str());
      }
    } catch (const Error&) {
      local_error = std::current_exception();
    }
    if (window_checked) {
      // Posted, not waited for: the NCCL call below is enqueued at once and
      // the watchdog (or a waiting thread) completes the check.
      // Ops are checked in windows (TUTTI_NCCL_CHECK_EVERY): only the op
      // that closes one carries the window's check.
      // (No window: check_every() failed, local_error says why.)
      comm::OpWindowRecord closed;
      if (window && window->add(seq, comm::make_wire(r, seq), local_error != nullptr, &closed))
        work->check.reset(new mpi::WindowCheck(check, check_detail, std::move(closed),
                                               kOverlapOutcome));
      else if (window && window->every() > 1) {
        work->unchecked_from = window->open_first();
        work->window_end = window->open_end();
      }
      if (local_error && work->check) {
        // The peers enqueued this op already and it can never complete:
        // let them learn that this rank rejected it, then give up the
        // communicator (its own error below is the precise one).
        try {
          work->check->wait(deadline, desc);
        } catch (const Error&) {
        }
      }
      // Inside an open window the peers learn of it at the window's close
      // or by their timeout (docs/scale.md, "NCCL path").
      if (local_error) watchdog.break_with(detail::error_of(local_error), nullptr);
    }
    if (local_error) std::rethrow_exception(local_error);
    ncclResult_t rc;
    {
      std::lock_guard<std::mutex> lock(nccl_mu);
      if (!comm) watchdog.throw_if_broken(desc.str());
      TUTTI_CHECK(comm != nullptr, desc, ": NCCL communicator '", name, "' has no handle");
      cuda::DeviceGuard g(device);
      TUTTI_CUDA_CHECK(cudaStreamWaitEvent(stream->get(), work->ready.get(), 0));
      rc = enqueue(r);
    }
    // Kernels are launched only once the state leaves ncclInProgress.
    rc = settle(rc, deadline);
    if (rc != ncclSuccess) enqueue_failed(desc, rc, timeout);
    {
      cuda::DeviceGuard g(device);
      work->done.record(stream->get());
    }
    work->started(seq, desc.str());
    watchdog.add(work, seq, desc.str(), timeout, start);
  } catch (...) {
    work->failed(std::current_exception(), seq, desc.str());
  }
}

void NcclCommunicatorImpl::enqueue_failed(const comm::OpLabel& desc,
                                          ncclResult_t rc, double timeout) {
  watchdog.throw_if_broken(desc.str());  // aborted while enqueueing
  // Peers may have enqueued their side: the communicator cannot be kept.
  const Error err =
      rc == ncclInProgress
          ? Error(ErrorCode::kTimeout,
                  detail::cat(detail::rank_prefix(), desc,
                              ": NCCL did not finish enqueueing it within ",
                              timeout, " s (TUTTI_TIMEOUT; a peer is missing "
                              "for the connection setup); the NCCL "
                              "communicator '", name, "' was aborted"))
          : Error(ErrorCode::kNccl,
                  detail::cat(detail::rank_prefix(), desc, ": NCCL failed: ",
                              result_text(rc, nullptr), "; the NCCL "
                              "communicator '", name, "' was aborted"));
  watchdog.break_with(err, nullptr);
  throw err;
}

#define TUTTI_NCCL_TRY(expr)                                  \
  do {                                                        \
    const ncclResult_t tutti_try_ = (expr);                   \
    if (tutti_try_ != ncclSuccess && tutti_try_ != ncclInProgress) \
      return tutti_try_;                                      \
  } while (0)

ncclResult_t NcclCommunicatorImpl::enqueue(const OpRequest& r) {
  const cudaStream_t s = stream->get();
  const Tensor& in = r.input;
  const Tensor& out = r.output;
  const size_t es = in.element_size();
  switch (r.kind) {
    case CollectiveKind::kAllreduce:
      return ncclAllReduce(in.data(), out.data(), in.numel(),
                           nccl_type(in.dtype()), nccl_op(r.op), comm, s);
    case CollectiveKind::kBroadcast:
      return ncclBroadcast(in.data(), in.data(), in.numel(),
                           nccl_type(in.dtype()), r.root, comm, s);
    case CollectiveKind::kAllgather:
      return ncclAllGather(in.data(), out.data(), in.numel(),
                           nccl_type(in.dtype()), comm, s);
    case CollectiveKind::kAllgatherv: {
      // NCCL has no allgatherv: one broadcast per rank, grouped.
      GroupGuard group;
      TUTTI_NCCL_TRY(group.started());
      int64_t off = 0;
      for (int i = 0; i < size; ++i) {
        char* dst = static_cast<char*>(out.data()) + off * es;
        const void* src = i == rank ? in.data() : dst;
        TUTTI_NCCL_TRY(ncclBroadcast(src, dst, r.counts[i],
                                     nccl_type(in.dtype()), i, comm, s));
        off += r.counts[i];
      }
      return group.end();
    }
    case CollectiveKind::kReduceScatter:
      return ncclReduceScatter(in.data(), out.data(), out.numel(),
                               nccl_type(in.dtype()), nccl_op(r.op), comm, s);
    case CollectiveKind::kAlltoall: {
      const int64_t block = in.numel() / size;
      GroupGuard group;
      TUTTI_NCCL_TRY(group.started());
      for (int p = 0; p < size; ++p) {
        TUTTI_NCCL_TRY(ncclSend(static_cast<const char*>(in.data()) + p * block * es,
                                block, nccl_type(in.dtype()), p, comm, s));
        TUTTI_NCCL_TRY(ncclRecv(static_cast<char*>(out.data()) + p * block * es,
                                block, nccl_type(in.dtype()), p, comm, s));
      }
      return group.end();
    }
    case CollectiveKind::kBarrier:
      return ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, comm, s);
    case CollectiveKind::kSend:
      return ncclSend(in.data(), in.numel(), nccl_type(in.dtype()), r.root,
                      comm, s);
    case CollectiveKind::kRecv:
      return ncclRecv(in.data(), in.numel(), nccl_type(in.dtype()), r.root,
                      comm, s);
  }
  return ncclInvalidArgument;
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclCommunicatorImpl> impl)
    : impl_(std::move(impl)) {}
NcclCommunicator::~NcclCommunicator() { close(); }

std::shared_ptr<NcclCommunicator> NcclCommunicator::create(
    std::shared_ptr<mpi::MpiCommunicator> host, int device,
    const std::string& name) {
  // The unique id first: its broadcast is a checked host collective bounded
  // by TUTTI_TIMEOUT, so a missing rank fails it here, before the
  // communicator's own setup (more host collectives, then NCCL's).
  const int rank = host ? host->rank() : 0;
  ncclUniqueId id;
  if (rank == 0)
    TUTTI_NCCL_CHECK(ncclGetUniqueId(&id), "creating NCCL communicator '", name,
                     "'");
  if (host) {
    Tensor t(&id, DType::kUInt8, Shape{static_cast<int64_t>(sizeof(id))});
    OpOptions o;
    o.name = "ncclUniqueId";
    host->broadcast(t, 0, o);
  }
  auto impl = std::make_shared<NcclCommunicatorImpl>(host, device, name);
  impl->rank = rank;
  impl->size = host ? host->size() : 1;
  cuda::DeviceGuard g(device);
  const double timeout_s = impl->settings.get().timeout_s;
  ncclConfig_t config = nonblocking_config();
  ncclComm_t c = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&c, impl->size, id, impl->rank, &config);
  if (c) rc = await(c, rc, mpi::Deadline(timeout_s));
  if (rc != ncclSuccess) {
    if (c)
      TUTTI_NCCL_WARN(ncclCommAbort(c), "aborting the half-built NCCL communicator '",
                      name, "'");
    if (rc != ncclInProgress)
      TUTTI_THROW(kNccl, "NCCL communicator '", name, "' (rank ", impl->rank,
                  " of ", impl->size, " on cuda:", device,
                  "): ncclCommInitRankConfig failed: ", result_text(rc, nullptr));
    const Error err(
        ErrorCode::kTimeout,
        detail::cat(detail::rank_prefix(), "NCCL communicator '", name,
                    "' (rank ", impl->rank, " of ", impl->size, " on cuda:",
                    device, "): ncclCommInitRankConfig did not complete within ",
                    timeout_s, " s (TUTTI_TIMEOUT): a rank did not join "
                    "(it failed, or took another path); the half-built "
                    "communicator was aborted"));
    comm::communicator_broke(err);
    throw err;
  }
  impl->comm = c;
  TUTTI_LOG(kInfo) << "NCCL communicator '" << name << "' ready on cuda:"
                   << device << " (" << impl->size << " ranks, non-blocking)";
  return std::shared_ptr<NcclCommunicator>(new NcclCommunicator(impl));
}

int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::size() const { return impl_->size; }
std::string NcclCommunicator::name() const { return impl_->name; }
int NcclCommunicator::device() const { return impl_->device; }
void NcclCommunicator::drain() { impl_->engine.drain(); }
void NcclCommunicator::synchronize() {
  impl_->engine.drain();
  std::shared_ptr<CudaWork> last;
  {
    std::lock_guard<std::mutex> lock(impl_->last_mu);
    last = impl_->last_work;
  }
  if (last) last->synchronize();  // bounded by the watchdog; rethrows its error
}
void NcclCommunicator::close() { impl_->close(); }
void NcclCommunicator::abandon() {
  impl_->abort();  // close() then finds no communicator to finalise
  impl_->close();
}
bool NcclCommunicator::broken() const { return impl_->watchdog.broken(); }

WorkPtr NcclCommunicator::submit(const OpRequest& request, bool blocking) {
  struct Queued {
    OpRequest request;
    bool checked;
  };
  NcclCommunicatorImpl* impl = impl_.get();
  // A closed engine runs nothing: fail here rather than hand out a Work
  // that never starts.
  if (impl->closed)
    TUTTI_THROW(kAborted, collective_kind_name(request.kind),
                " on NCCL communicator '", impl->name, "': it is closed");
  const comm::CommSettings::Values settings = impl->settings.get();
  auto q = std::make_shared<Queued>();
  q->request = request;
  if (q->request.options.timeout_s <= 0) q->request.options.timeout_s = settings.timeout_s;
  q->checked = settings.check_ops;
  cuda::DeviceGuard g(impl->device);
  auto work = std::make_shared<CudaWork>(
      impl_, impl->device, static_cast<cudaStream_t>(request.options.stream));
  // Order the communication after the work already on the caller's stream.
  work->ready.record(static_cast<cudaStream_t>(request.options.stream));
  // `impl` outlives its engine's tasks: close() drains them first.
  impl->engine.submit(
      [impl, q, work] { impl->execute(q->request, q->checked, work); }, blocking);
  return work;
}

std::shared_ptr<Communicator> NcclCommunicator::split(int, int,
                                                      const std::string&) {
  TUTTI_THROW(kUnsupported,
              "split a ProcessGroup, not its NCCL communicator: the host "
              "communicator must split alongside");
}

std::shared_ptr<NcclCommunicator> NcclCommunicator::split_with(
    int color, int key, std::shared_ptr<mpi::MpiCommunicator> host_child,
    const std::string& name) {
  NcclCommunicatorImpl* parent = impl_.get();
  std::shared_ptr<NcclCommunicator> child;
  // ncclCommSplit is collective over the parent: run it in order with the
  // parent's operations.
  parent->engine.run_and_wait([&] {
      const std::string what = detail::cat(
          "ncclCommSplit (color ", color, ", key ", key, ") of '",
          parent->name, "' into '", name, "'");
      parent->watchdog.throw_if_broken(what);
      const double timeout_s = parent->settings.get().timeout_s;
      const mpi::Deadline deadline(timeout_s);
      ncclConfig_t config = nonblocking_config();
      ncclComm_t out = nullptr;
      // The parent must be ready, not "in progress": on a non-blocking
      // communicator an earlier split can leave it so for a while after its
      // child is ready, and NCCL then refuses the call (seen on an H100:
      // "Attempt to use communicator before the previous operation
      // returned ncclSuccess" at tutti.ProcessMesh's second split).
      ncclResult_t rc = parent->settle(ncclInProgress, deadline);
      if (rc == ncclSuccess) {
        std::lock_guard<std::mutex> lock(parent->nccl_mu);
        parent->watchdog.throw_if_broken(what);
        cuda::DeviceGuard g(parent->device);
        rc = ncclCommSplit(parent->comm,
                           color < 0 ? NCCL_SPLIT_NOCOLOR : color, key,
                           &out, &config);
      }
      rc = parent->settle(rc, deadline);
      if (rc == ncclSuccess && out) rc = await(out, ncclInProgress, deadline);
      // And ready again once the child is, for the parent's next call.
      if (rc == ncclSuccess) rc = parent->settle(ncclInProgress, deadline);
      if (rc != ncclSuccess) {
        if (out) TUTTI_NCCL_WARN(ncclCommAbort(out), what);
        const Error e =
            rc == ncclInProgress
                ? Error(ErrorCode::kTimeout,
                        detail::cat(detail::rank_prefix(), what,
                                    " did not complete within ",
                                    timeout_s,
                                    " s (TUTTI_TIMEOUT): a rank did not "
                                    "take part"))
                : Error(ErrorCode::kNccl,
                        detail::cat(detail::rank_prefix(), what,
                                    " failed: ", result_text(rc, nullptr)));
        // The parent's collective state is unknown now.
        parent->watchdog.break_with(e, nullptr);
        throw e;
      }
      if (out) {
        auto impl = std::make_shared<NcclCommunicatorImpl>(
            host_child, parent->device, name);
        impl->comm = out;  // owned (and finalised) by impl from here
        TUTTI_NCCL_CHECK(ncclCommUserRank(out, &impl->rank), what);
        TUTTI_NCCL_CHECK(ncclCommCount(out, &impl->size), what);
        child.reset(new NcclCommunicator(impl));
      }
  });
  return child;
}

#else  // !TUTTI_WITH_NCCL

class NcclCommunicatorImpl {};

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclCommunicatorImpl> impl)
    : impl_(std::move(impl)) {}
NcclCommunicator::~NcclCommunicator() = default;

std::shared_ptr<NcclCommunicator> NcclCommunicator::create(
    std::shared_ptr<mpi::MpiCommunicator>, int device, const std::string&) {
  TUTTI_THROW(kUnsupported, "a tensor on cuda:", device,
              " needs NCCL, but this build of tutti has no CUDA/NCCL support "
              "(rebuild with -DTUTTI_WITH_CUDA=ON)");
}
int NcclCommunicator::rank() const { return 0; }
int NcclCommunicator::size() const { return 1; }
std::string NcclCommunicator::name() const { return ""; }
int NcclCommunicator::device() const { return -1; }
void NcclCommunicator::drain() {}
void NcclCommunicator::synchronize() {}
void NcclCommunicator::close() {}
void NcclCommunicator::abandon() {}
bool NcclCommunicator::broken() const { return false; }
WorkPtr NcclCommunicator::submit(const OpRequest&, bool) {
  TUTTI_THROW(kUnsupported, "this build of tutti has no NCCL support");
}
std::shared_ptr<Communicator> NcclCommunicator::split(int, int,
                                                      const std::string&) {
  TUTTI_THROW(kUnsupported, "this build of tutti has no NCCL support");
}
std::shared_ptr<NcclCommunicator> NcclCommunicator::split_with(
    int, int, std::shared_ptr<mpi::MpiCommunicator>, const std::string&) {
  TUTTI_THROW(kUnsupported, "this build of tutti has no NCCL support");
}

#endif

}  // namespace nccl
}  // namespace tutti
