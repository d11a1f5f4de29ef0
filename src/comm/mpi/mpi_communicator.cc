#include "comm/mpi/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <optional>

#include "comm/counters.h"
#include "comm/mpi/ulfm.h"
#include "comm/cpu_work.h"
#include "comm/fold.h"
#include "comm/mpi/agreement.h"
#include "comm/mpi/running_op.h"
#include "comm/registry.h"
#include "comm/staged_work.h"
#include "core/cpu_reduce.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {
namespace mpi {
namespace {

using comm::CpuWork;

// Largest element count passed to one MPI call (counts are int).
constexpr int64_t kMaxChunk = int64_t{1} << 30;

int checked_int(int64_t v, const comm::OpLabel& desc, const char* what) {
  if (v > INT_MAX)
    TUTTI_THROW(kUnsupported, desc, ": ", what, " of ", v,
                " elements exceeds MPI's int count limit (", INT_MAX,
                "); split the tensor");
  return static_cast<int>(v);
}

uint64_t mix_id(uint64_t parent, uint64_t a, uint64_t b) {
  uint64_t h = parent * 0x9e3779b97f4a7c15ull ^ (a + 0x632be59bd9b4e019ull);
  h = (h ^ (h >> 29)) * 0xbf58476d1ce4e5b9ull;
  h ^= b + 0x94d049bb133111ebull + (h << 6);
  return (h ^ (h >> 32)) | 1;  // never 0
}

// Send/recv complete outside the engine: the engine posts them in order and
// the waiter polls, so that a blocked receive cannot hold up the collectives
// (or the matching send) queued behind it.
class P2PWork : public comm::StagedWork {
 public:
  P2PWork(std::shared_ptr<MpiCommunicator> owner, double timeout_s,
          const OpRequest& request)
      : comm::StagedWork("mpi", "p2p " + owner->name()), owner_(std::move(owner)),
        deadline_(timeout_s), timeout_s_(timeout_s),
        expected_(request.kind == CollectiveKind::kRecv ? request.input.numel() : -1),
        dtype_(request.input.dtype()), kind_(request.kind), name_(request.options.name),
        peer_(request.root), count_(request.input.numel()) {}

  // The posted request; set before started().
  MPI_Request* request() { return &req_; }

  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    wait_started(lock);
    if (stage_ == kDone) return;
    MPI_Status st;
    int rc = MPI_SUCCESS;
    const bool ok = mpi::wait_rc(&req_, deadline_, &st, &rc);
    if (rc != MPI_SUCCESS) fail_locked(translate(rc));
    if (!ok) {
      try {
        owner_->fail_timeout(comm::OpLabel(desc_), seq_, timeout_s_,
                             "waiting for the peer");
      } catch (...) {
        fail_locked(std::current_exception());
      }
    }
    complete_locked(st);
  }
  void synchronize() override { wait(); }
  bool test() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (stage_ == kQueued) return false;
    if (error_) std::rethrow_exception(error_);
    if (stage_ == kDone) return true;
    int flag = 0;
    MPI_Status st;
    const int rc = MPI_Test(&req_, &flag, &st);
    if (rc != MPI_SUCCESS) fail_locked(translate(rc));
    if (!flag) return false;
    complete_locked(st);
    return true;
  }

 private:
  [[noreturn]] void fail_locked(std::exception_ptr e) {
    error_ = e;
    stage_ = kDone;
    std::rethrow_exception(e);
  }
  std::exception_ptr translate(int rc) {
    int cls = rc;
    if (MPI_Error_class(rc, &cls) != MPI_SUCCESS) cls = rc;  // not a class
    if (cls == MPI_ERR_TRUNCATE)
      return std::make_exception_ptr(Error(
          ErrorCode::kMismatch,
          detail::cat(detail::rank_prefix(), desc_,
                      ": the message is larger than the receive tensor (",
                      expected_, " elements)")));
    return std::make_exception_ptr(
        Error(ErrorCode::kMpi, detail::cat(detail::rank_prefix(), desc_, ": ",
                                           error_string(rc))));
  }
  void complete_locked(const MPI_Status& st) {
    stage_ = kDone;
    if (expected_ < 0) return;  // a send
    // A receive: the message must fill the tensor.
    int count = 0;
    const int rc = MPI_Get_count(&st, datatype(dtype_), &count);
    if (rc != MPI_SUCCESS) fail_locked(translate(rc));
    if (count != expected_)
      fail_locked(std::make_exception_ptr(Error(
          ErrorCode::kMismatch,
          detail::cat(detail::rank_prefix(), desc_, ": received ", count,
                      " elements, expected ", expected_))));
  }

  // The timeline event's arguments, like a collective's (CpuWork::trace).
  void trace_args(timeline::Args& a) const override {
    a.s("op", collective_kind_name(kind_)).s("name", name_).s("dtype", dtype_name(dtype_))
        .i("count", count_).i("bytes", count_ * static_cast<int64_t>(dtype_size(dtype_)))
        .i("peer", peer_).s("group", owner_->name());
  }

  std::shared_ptr<MpiCommunicator> owner_;
  Deadline deadline_;
  double timeout_s_;
  int64_t expected_;
  DType dtype_;
  CollectiveKind kind_;
  std::string name_;
  int peer_;
  int64_t count_;
  MPI_Request req_ = MPI_REQUEST_NULL;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name,
                                 uint64_t comm_id)
    : data_(comm), name_(std::move(name)), comm_id_(comm_id), engine_(name_),
      progress_(std::make_shared<CommProgress>()) {
  const std::string what = detail::cat("setting up communicator '", name_, "'");
  TUTTI_MPI_CHECK(MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN), what);
  TUTTI_MPI_CHECK(MPI_Comm_dup(data_, &check_), what);
  TUTTI_MPI_CHECK(MPI_Comm_set_errhandler(check_, MPI_ERRORS_RETURN), what);
  TUTTI_MPI_CHECK(MPI_Comm_rank(data_, &rank_), what);
  TUTTI_MPI_CHECK(MPI_Comm_size(data_, &size_), what);
  // World ranks of the members, for reports that span groups.
  MPI_Group mine, world;
  TUTTI_MPI_CHECK(MPI_Comm_group(data_, &mine), what);
  // (ulfm::base(): MPI_COMM_WORLD, or the world a recovery shrank.)
  TUTTI_MPI_CHECK(MPI_Comm_group(ulfm::base(), &world), what);
  std::vector<int> local(size_);
  for (int i = 0; i < size_; ++i) local[i] = i;
  world_ranks_.resize(size_);
  TUTTI_MPI_CHECK(MPI_Group_translate_ranks(mine, size_, local.data(), world,
                                            world_ranks_.data()),
                  what);
  TUTTI_MPI_CHECK(MPI_Group_free(&mine), what);
  TUTTI_MPI_CHECK(MPI_Group_free(&world), what);
  StatusService::instance().add(comm_id_, progress_);
}

MpiCommunicator::~MpiCommunicator() { close(); }

void MpiCommunicator::close() {
  std::lock_guard<std::mutex> lock(close_mu_);
  if (closed_.load()) return;
  // Ops submitted before the close run first.  Refusing them here (as
  // close() once did) depended on timing: a rank whose engine had already
  // taken an async op up ran it, a rank whose engine had not refused it,
  // and the first rank then waited for the second until TUTTI_TIMEOUT (a
  // reducer's bucket all-reduces in flight at shutdown(), issue 27).
  engine_.drain();
  closed_ = true;
  engine_.stop();  // anything submitted meanwhile fails with kAborted
  // This rank enters no further op here: members waiting for one fail now.
  StatusService::instance().depart(comm_id_, peer_world_ranks(),
                                   progress_->entered.load());
  StatusService::instance().remove(comm_id_);
  if (is_initialized()) {
    // After a timeout a request may still be pending on these communicators;
    // freeing them is still legal (MPI frees once the requests complete).
    // Runs from the destructor: a failure is logged, never thrown.
    free_comms();
  }
}

void MpiCommunicator::free_comms() {
  std::lock_guard<std::mutex> lock(comm_mu_);
  const std::string what = detail::cat("closing communicator '", name_, "'");
  if (check_ != MPI_COMM_NULL) TUTTI_MPI_WARN(MPI_Comm_free(&check_), what);
  if (data_ != MPI_COMM_NULL && data_ != MPI_COMM_WORLD)
    TUTTI_MPI_WARN(MPI_Comm_free(&data_), what);
  check_ = data_ = MPI_COMM_NULL;
}

void MpiCommunicator::revoke() {
  std::lock_guard<std::mutex> lock(comm_mu_);
  ulfm::revoke(data_);
  ulfm::revoke(check_);
}

void MpiCommunicator::abandon() {
  std::lock_guard<std::mutex> lock(close_mu_);
  if (closed_.load()) return;
  // Queued ops fail with kAborted; the running one fails at once on the
  // revoked communicators (kRanksLost).  No departure notices: the members
  // that live abandon it too, the dead cannot read them.
  poisoned_ = true;
  revoke();
  engine_.stop();
  closed_ = true;
  StatusService::instance().remove(comm_id_);
  if (is_initialized()) free_comms();
}

void MpiCommunicator::drain() { engine_.drain(); }

uint64_t MpiCommunicator::derived_id() {
  // Split children's ids mix a split index with a color (or a node's
  // lowest rank); these mix a count with a marker no color takes.
  return mix_id(comm_id_, ++derived_, 0x4e43434c00000000ull);
}

WorkPtr MpiCommunicator::submit(const OpRequest& request, bool blocking) {
  return submit_layered(request, blocking, nullptr);
}

WorkPtr MpiCommunicator::submit_layered(const OpRequest& request, bool blocking,
                                        Check also_validate) {
  const comm::CommSettings::Values settings = settings_.get();
  const double timeout =
      request.options.timeout_s > 0 ? request.options.timeout_s : settings.timeout_s;
  if (request.kind == CollectiveKind::kSend ||
      request.kind == CollectiveKind::kRecv) {
    auto work = std::make_shared<P2PWork>(shared_from_this(), timeout, request);
    auto self = shared_from_this();
    engine_.submit(
        [self, request, work, also_validate] {
          // Point-to-point ops involve two ranks only: they are numbered
          // apart from the collectives, which every rank counts.
          const uint64_t seq = ++self->next_p2p_seq_;
          const comm::OpLabel desc(request, seq, self->name_);
          try {
            if (self->closed_ || self->poisoned_)
              TUTTI_THROW(kAborted, desc, ": communicator '", self->name_,
                          "' is unusable after an earlier failure");
            if (also_validate) also_validate(desc);
            comm::validate(request, self->rank_, self->size_, desc);
            TUTTI_ARG_CHECK(request.input.device().is_cpu(), desc,
                            ": the MPI backend takes host tensors, got ",
                            request.input.str());
            const int count = checked_int(request.input.numel(), desc, "a message");
            if (request.kind == CollectiveKind::kSend)
              TUTTI_MPI_CHECK(MPI_Isend(request.input.data(), count,
                                        datatype(request.input.dtype()),
                                        request.root, request.tag, self->data_,
                                        work->request()),
                              desc);
            else
              TUTTI_MPI_CHECK(MPI_Irecv(request.input.data(), count,
                                        datatype(request.input.dtype()),
                                        request.root, request.tag, self->data_,
                                        work->request()),
                              desc);
            work->started(seq, desc.str());
          } catch (...) {
            work->failed(std::current_exception(), seq, desc.str());
          }
        },
        false);
    return work;
  }
  auto work = std::make_shared<CpuWork>(0, "");
  auto self = shared_from_this();
  // The work's sequence number is assigned when it runs (run order is the
  // order every rank agrees on).
  auto q = std::make_shared<Queued>();
  q->request = request;
  q->request.options.timeout_s = timeout;
  q->check = settings.check_ops;
  q->stall_warn_s = settings.stall_warn_s;
  q->also_validate = std::move(also_validate);
  engine_.submit([self, q, work] { self->execute(q, *work); }, blocking);
  return work;
}


void MpiCommunicator::execute(const std::shared_ptr<Queued>& q, CpuWork& work) {
  const OpRequest& r = q->request;
  const uint64_t seq = ++next_seq_;
  const comm::OpLabel desc(r, seq, name_);
  work.start(seq, std::shared_ptr<const OpRequest>(q, &q->request), name_);
  std::exception_ptr error;
  try {
    if (closed_ || poisoned_)
      TUTTI_THROW(kAborted, desc, ": communicator '", name_,
                  "' is unusable after an earlier failure");
    RunningOp running(*this, seq, static_cast<uint8_t>(r.kind), desc,
                      comm::payload_bytes(r), q->stall_warn_s,
                      r.options.timeout_s);
    const Deadline deadline(r.options.timeout_s);
    // Local validation first, but a bad rank still joins the agreement
    // check so that its peers fail too instead of waiting for it.
    std::exception_ptr local_error;
    try {
      if (q->also_validate) q->also_validate(desc);
      comm::validate(r, rank_, size_, desc);
      if (r.kind != CollectiveKind::kBarrier)
        TUTTI_ARG_CHECK(r.input.device().is_cpu() && r.output.device().is_cpu(),
                        desc, ": the MPI backend takes host tensors, got ",
                        r.input.str());
    } catch (const Error&) {
      local_error = std::current_exception();
    }
    // A small op rides in the check's frame (comm::FoldPlan): one
    // recursive-doubling exchange carries both; it also runs so, without
    // the fingerprint comparison, when the check is off.  A joined rank
    // (join.h) sends a header-only frame: the sizes differ, phase 2 finds
    // the op servable, and every rank runs it unfolded below.
    const bool check = size_ > 1 && q->check;
    comm::FoldPlan plan;
    if (size_ > 1 && !local_error) plan = comm::fold_plan(r, rank_, size_, fold_limit());
    bool folded = false;
    if (check || plan.folds) {
      if (!check) running.set_phase("exchanging data");
      AgreementCheck agreement(check_, check_, comm::make_wire(r, seq),
                               local_error != nullptr, "no rank ran it",
                               /*serve_joined=*/check, plan.folds ? &plan : nullptr,
                               fold_limit(), /*compare=*/check, &check_scratch_);
      if (!agreement.wait(deadline, desc, stall_))
        fail_timeout(desc, seq, r.options.timeout_s,
                     check ? "agreeing on the operation" : "exchanging data");
      if (local_error) std::rethrow_exception(local_error);
      if (agreement.folded()) {
        work.agreed();  // the timeline's end of the agreement phase
        comm::unfold(r, plan, rank_, size_, agreement.payload());
        folded = true;
      }
    }
    if (!folded) {
      if (local_error) std::rethrow_exception(local_error);
      running.set_phase("exchanging data");
      work.agreed();  // the timeline's end of the agreement phase
      run_collective(r, deadline, desc, seq);
    }
  } catch (...) {
    error = std::current_exception();
  }
  // After the RunningOp ended: peers see the op finished before its waiter
  // is released.
  work.finish(error);
}

size_t MpiCommunicator::fold_limit() {
  const uint64_t g = config::generation();
  if (g != fold_generation_) {
    const int64_t v = config::get_int("TUTTI_MPI_FOLD_BYTES");
    if (v < 0)
      TUTTI_THROW(kInvalidArgument, "TUTTI_MPI_FOLD_BYTES=", v,
                  " is negative (0 folds only barriers and empty operations)");
    fold_bytes_ = static_cast<size_t>(v);
    fold_generation_ = g;
  }
  return fold_bytes_;
}

void MpiCommunicator::check_agreement(MPI_Comm check_comm,
                                      const comm::WireDesc& wire,
                                      bool locally_invalid,
                                      const comm::OpLabel& desc,
                                      const Deadline& deadline,
                                      const std::function<void()>& on_timeout,
                                      StallWatch* stall) {
  AgreementCheck check(check_comm, check_comm, wire, locally_invalid,
                       "no rank ran it", /*serve_joined=*/true);
  if (!check.wait(deadline, desc, stall)) on_timeout();
}

std::vector<int> MpiCommunicator::peer_world_ranks() const {
  std::vector<int> peers;
  for (int i = 0; i < size_; ++i)
    if (i != rank_) peers.push_back(world_ranks_[i]);
  return peers;
}

void MpiCommunicator::warn_stall(const comm::OpLabel& desc, size_t bytes,
                                 uint64_t seq, double waited_s,
                                 double period_s, double timeout_s,
                                 const char* phase) {
  if (!log_enabled(LogLevel::kWarn)) return;
  const std::string report =
      peer_report(comm_id_, peer_world_ranks(), seq, world_ranks_[rank_],
                  /*stall=*/true, name_ == "world");
  TUTTI_LOG(kWarn) << "stall: " << desc << " (" << bytes << " bytes) has waited "
                   << static_cast<int64_t>(waited_s) << " s while " << phase
                   << "; " << report << " (TUTTI_STALL_WARN_S=" << period_s << "; "
                   << (timeout_s > 0
                           ? detail::cat("fails at TUTTI_TIMEOUT=", timeout_s, " s")
                           : std::string("no timeout"))
                   << ")";
}

void MpiCommunicator::fail_timeout(const comm::OpLabel& desc, uint64_t seq,
                                   double seconds, const char* phase) {
  poisoned_ = true;
  // Remembered process-wide: shutdown() must not finalise MPI even after
  // this communicator is destroyed (MPI_Finalize would wait for the peer).
  comm::note_communicator_poisoned();
  const std::string report =
      peer_report(comm_id_, peer_world_ranks(), seq, world_ranks_[rank_],
                  /*stall=*/false, name_ == "world");
  const Error error(
      ErrorCode::kTimeout,
      detail::cat(detail::rank_prefix(), desc, " did not complete within ",
                  seconds, " s (TUTTI_TIMEOUT) while ", phase, "; ", report,
                  ". The communicator is unusable now."));
  comm::communicator_broke(error);
  throw error;
}

void MpiCommunicator::check_departures(const comm::OpLabel& desc, uint64_t seq,
                                       const char* phase) {
  StatusService& service = StatusService::instance();
  const uint64_t seen = service.departures();
  if (seen != departures_seen_) {  // rare: some communicator lost a member
    departures_seen_ = seen;
    departed_ = service.departed(comm_id_);
  }
  std::string gone;
  for (const Departure& d : departed_) {
    if (d.last_entered >= seq) continue;  // it took part in this op
    gone += detail::cat(gone.empty() ? "" : "; ", "rank ", d.world_rank,
                        d.shutdown ? " shut down (tutti::shutdown(), called or at exit)"
                                   : " closed this group (dropped its last reference)",
                        " after entering ",
                        d.last_entered ? detail::cat("op #", d.last_entered)
                                       : std::string("no op"),
                        " of it, so it will never enter #", seq);
  }
  if (gone.empty()) return;
  poisoned_ = true;
  comm::note_communicator_poisoned();
  const Error error(
      ErrorCode::kCommFailure,
      detail::cat(detail::rank_prefix(), desc, " cannot complete (it was ", phase,
                  "): ", gone, name_ == "world" ? "" : " [world ranks]",
                  ". The communicator is unusable now."));
  comm::communicator_broke(error);
  throw error;
}

void MpiCommunicator::wait_or_fail(MPI_Request* req, const Deadline& deadline,
                                   const comm::OpLabel& desc, uint64_t seq,
                                   int64_t min_yield_us) {
  comm::counters::add_call(comm::counters::Protocol::kMpiCollective);
  if (!wait(req, deadline, desc, MPI_STATUS_IGNORE, stall_, min_yield_us))
    fail_timeout(desc, seq, deadline.seconds(), "exchanging data");
}

void MpiCommunicator::run_collective(const OpRequest& r,
                                     const Deadline& deadline,
                                     const comm::OpLabel& desc, uint64_t seq) {
  const Tensor& in = r.input;
  const Tensor& out = r.output;
  const size_t es = in.element_size();
  MPI_Request req;
  switch (r.kind) {
    case CollectiveKind::kAllreduce: {
      if (size_ == 1 || in.numel() == 0) {
        if (in.data() != out.data() && in.nbytes())
          std::memcpy(out.data(), in.data(), in.nbytes());
        return;
      }
      const MPI_Datatype dt = datatype(in.dtype());
      const MPI_Op op = reduce_op(in.dtype(), r.op);
      for (int64_t off = 0; off < in.numel(); off += kMaxChunk) {
        const int n = static_cast<int>(std::min(kMaxChunk, in.numel() - off));
        char* o = static_cast<char*>(out.data()) + off * es;
        const void* s = in.data() == out.data()
                            ? MPI_IN_PLACE
                            : static_cast<const char*>(in.data()) + off * es;
        TUTTI_MPI_CHECK(MPI_Iallreduce(s, o, n, dt, op, data_, &req), desc);
        // libnbc's ring (or Rabenseifner's) advances a round only while
        // this rank polls: yield, not sleep, for as long as it should take.
        wait_or_fail(&req, deadline, desc, seq,
                     modelled_us(2 * (size_ - 1), static_cast<int64_t>(n) * es * 2));
      }
      if (r.op == ReduceOp::kAvg)
        divide_inplace(out.dtype(), out.data(), out.numel(), size_);
      return;
    }
    case CollectiveKind::kBroadcast: {
      if (size_ == 1 || in.numel() == 0) return;
      const MPI_Datatype dt = datatype(in.dtype());
      for (int64_t off = 0; off < in.numel(); off += kMaxChunk) {
        const int n = static_cast<int>(std::min(kMaxChunk, in.numel() - off));
        TUTTI_MPI_CHECK(MPI_Ibcast(static_cast<char*>(in.data()) + off * es, n,
                                   dt, r.root, data_, &req), desc);
        wait_or_fail(&req, deadline, desc, seq);
      }
      return;
    }
    case CollectiveKind::kAllgather: {
      const int n = checked_int(in.numel(), desc, "a block");
      const MPI_Datatype dt = datatype(in.dtype());
      checked_int(out.numel(), desc, "the output");
      const char* mine = static_cast<const char*>(out.data()) + rank_ * in.nbytes();
      const void* s = in.data() == mine ? MPI_IN_PLACE : in.data();
      TUTTI_MPI_CHECK(MPI_Iallgather(s, n, dt, out.data(), n, dt, data_, &req), desc);
      wait_or_fail(&req, deadline, desc, seq);
      return;
    }
    case CollectiveKind::kAllgatherv: {
      const MPI_Datatype dt = datatype(in.dtype());
      std::vector<int> counts(size_), displs(size_);
      int64_t off = 0;
      for (int i = 0; i < size_; ++i) {
        counts[i] = checked_int(r.counts[i], desc, "a block");
        displs[i] = checked_int(off, desc, "an offset");
        off += r.counts[i];
      }
      TUTTI_MPI_CHECK(MPI_Iallgatherv(in.data(), counts[rank_], dt, out.data(),
                                      counts.data(), displs.data(), dt, data_,
                                      &req), desc);
      wait_or_fail(&req, deadline, desc, seq);
      return;
    }
    case CollectiveKind::kReduceScatter: {
      const int n = checked_int(out.numel(), desc, "a block");
      checked_int(in.numel(), desc, "the input");
      if (size_ == 1 || n == 0) {
        if (n) std::memcpy(out.data(), in.data(), out.nbytes());
        return;
      }
      TUTTI_MPI_CHECK(MPI_Ireduce_scatter_block(
          in.data(), out.data(), n, datatype(in.dtype()),
          reduce_op(in.dtype(), r.op), data_, &req), desc);
      wait_or_fail(&req, deadline, desc, seq);
      if (r.op == ReduceOp::kAvg)
        divide_inplace(out.dtype(), out.data(), out.numel(), size_);
      return;
    }
    case CollectiveKind::kAlltoall: {
      const int n = checked_int(in.numel() / size_, desc, "a block");
      checked_int(in.numel(), desc, "the input");
      const MPI_Datatype dt = datatype(in.dtype());
      TUTTI_MPI_CHECK(
          MPI_Ialltoall(in.data(), n, dt, out.data(), n, dt, data_, &req), desc);
      wait_or_fail(&req, deadline, desc, seq);
      return;
    }
    case CollectiveKind::kBarrier:
      if (size_ == 1) return;
      TUTTI_MPI_CHECK(MPI_Ibarrier(data_, &req), desc);
      wait_or_fail(&req, deadline, desc, seq);
      return;
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv:
      break;
  }
  TUTTI_THROW(kInternal, desc, ": unexpected kind in run_collective");
}

void MpiCommunicator::run_ordered(const std::function<void()>& fn) {
  engine_.run_and_wait(fn);
}

void MpiCommunicator::run_split(
    uint8_t kind, const std::string& detail,
    const std::function<void(const comm::OpLabel&, uint64_t, const Deadline&)>&
        body) {
  engine_.run_and_wait([&] {
    const uint64_t seq = ++next_seq_;
    const comm::OpLabel desc(detail::cat(
        kind == comm::kSplitSharedKind ? "node split #" : "split #", seq,
        detail, " of group '", name_, "'"));
    if (closed_ || poisoned_)
      TUTTI_THROW(kAborted, desc, ": communicator '", name_,
                  "' is unusable after an earlier failure");
    const comm::CommSettings::Values settings = settings_.get();
    RunningOp running(*this, seq, kind, desc, 0, settings.stall_warn_s,
                      settings.timeout_s);
    const Deadline deadline(settings.timeout_s);
    if (size_ > 1 && settings.check_ops) {
      comm::WireDesc w;
      w.seq = seq;
      w.kind = kind;
      check_agreement(check_, w, false, desc, deadline, [&] {
        fail_timeout(desc, seq, settings.timeout_s, "agreeing on the operation");
      }, stall_);
    }
    running.set_phase("splitting the communicator");
    body(desc, seq, deadline);
  });
}

std::shared_ptr<MpiCommunicator> MpiCommunicator::split_mpi(
    int color, int key, const std::string& name) {
  std::shared_ptr<MpiCommunicator> child;
  run_split(comm::kSplitKind, detail::cat(" (color ", color, ", key ", key, ")"),
            [&](const comm::OpLabel& desc, uint64_t, const Deadline&) {
              // Every rank agreed on the split: MPI_Comm_split (blocking;
              // MPI has no non-blocking form) finds them all there.
              const uint32_t index = splits_++;
              MPI_Comm out = MPI_COMM_NULL;
              TUTTI_MPI_CHECK(MPI_Comm_split(data_,
                                             color < 0 ? MPI_UNDEFINED : color,
                                             key, &out),
                              desc);
              if (out == MPI_COMM_NULL) return;
              child = std::make_shared<MpiCommunicator>(
                  out, name.empty() ? name_ + "/" + std::to_string(color) : name,
                  mix_id(comm_id_, index, static_cast<uint64_t>(color)));
              if (child->size() == size_) {
                // Same membership: a joined rank serves it too (join.h).
                // Dropped ones go here, so that the list stays short.
                std::lock_guard<std::mutex> lock(followers_mu_);
                followers_.erase(
                    std::remove_if(followers_.begin(), followers_.end(),
                                   [](const std::weak_ptr<MpiCommunicator>& f) {
                                     return f.expired();
                                   }),
                    followers_.end());
                followers_.push_back(child);
              }
            });
  return child;
}

std::shared_ptr<MpiCommunicator> MpiCommunicator::split_shared(
    const std::string& name) {
  std::shared_ptr<MpiCommunicator> child;
  run_split(comm::kSplitSharedKind, "", [&](const comm::OpLabel& desc,
                                            uint64_t seq,
                                            const Deadline& deadline) {
    const uint32_t index = splits_++;
    MPI_Comm out = MPI_COMM_NULL;
    TUTTI_MPI_CHECK(MPI_Comm_split_type(data_, MPI_COMM_TYPE_SHARED, rank_,
                                        MPI_INFO_NULL, &out),
                    desc);
    // The node's lowest world rank makes the id the same on its members
    // and different across nodes.  The buffer is on the heap: after a
    // timeout the request stays pending and MPI may still write it (leaked
    // on purpose, as AgreementCheck's).
    auto lowest_buf = std::make_unique<int>(world_ranks_[rank_]);
    try {
      TUTTI_MPI_CHECK(MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN), desc);
      MPI_Request req = MPI_REQUEST_NULL;
      TUTTI_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, lowest_buf.get(), 1, MPI_INT,
                                     MPI_MIN, out, &req),
                      desc, " (naming the node group)");
      if (!wait(&req, deadline, desc, MPI_STATUS_IGNORE, stall_)) {
        (void)lowest_buf.release();
        fail_timeout(desc, seq, deadline.seconds(), "naming the node group");
      }
    } catch (...) {
      // Freed by MPI once a pending request completes.
      TUTTI_MPI_WARN(MPI_Comm_free(&out), desc);
      throw;
    }
    const int lowest = *lowest_buf;
    child = std::make_shared<MpiCommunicator>(
        out, name, mix_id(comm_id_, index, static_cast<uint64_t>(lowest) + 7));
  });
  return child;
}

std::shared_ptr<Communicator> MpiCommunicator::split(int color, int key,
                                                     const std::string& name) {
  return split_mpi(color, key, name);
}

}  // namespace mpi
}  // namespace tutti
