#include "comm/mpi/join.h"

#include "comm/mpi/mpi_communicator.h"
#include "core/check.h"
#include "tutti/config.h"

namespace tutti {
namespace mpi {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Every communicator of the family, parents before their followers.
void collect(const std::shared_ptr<MpiCommunicator>& c,
             std::vector<std::shared_ptr<MpiCommunicator>>& out) {
  out.push_back(c);
  for (const auto& f : c->followers()) collect(f, out);
}

}  // namespace

JoinSession::JoinSession(size_t loops, double timeout_s)
    : timeout_s_(timeout_s), last_ns_(now_ns()), pending_(loops) {}

void JoinSession::progressed() { last_ns_.store(now_ns()); }

bool JoinSession::expired() const {
  if (timeout_s_ <= 0) return false;
  return static_cast<double>(now_ns() - last_ns_.load()) * 1e-9 > timeout_s_;
}

void JoinSession::finish(size_t, uint64_t start_seq, std::exception_ptr error,
                         const std::string& group) {
  std::lock_guard<std::mutex> lock(mu_);
  stamp_ += start_seq;
  if (error && !error_) {
    error_ = error;
    failed_group_ = group;
    failed_.store(true);
  }
  --pending_;
  cv_.notify_all();
}

uint64_t JoinSession::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return pending_ == 0; });
  if (error_) std::rethrow_exception(error_);
  return stamp_;
}

int join(const std::shared_ptr<MpiCommunicator>& comm) {
  const std::string what = detail::cat("join() on group '", comm->name(), "'");
  if (!comm->checks_on())
    TUTTI_THROW(kUnsupported, what,
                ": needs the collective agreement check, which tells a joined "
                "rank what the others run, but TUTTI_CHECK_COLLECTIVES=0 "
                "turns it off");
  if (comm->poisoned())
    TUTTI_THROW(kAborted, what, ": the communicator is unusable after an "
                "earlier failure");
  if (comm->size() == 1) return 0;
  std::vector<std::shared_ptr<MpiCommunicator>> family;
  collect(comm, family);
  auto session = std::make_shared<JoinSession>(
      family.size(), config::get_double("TUTTI_TIMEOUT"));
  for (size_t i = 0; i < family.size(); ++i)
    family[i]->start_join_loop(session, i);
  // The stamp: the sum over the family of each communicator's op count
  // when its loop started (after the ops this rank queued before join()).
  // Why the largest stamp is the last rank to join: ops on a communicator
  // are numbered alike on every rank, and each op #k ran either as a
  // running rank's op or was served.  A rank X that ran #k had not joined
  // there, so its count there is >= k; a rank Y that served #k had joined,
  // so its count is < k.  When X joins after Y (every op X issued before
  // join() completed before it, the usual synchronous pattern), X ran every
  // op Y ran before joining, on every communicator, plus those Y served in
  // between: stamp(X) >= stamp(Y), strictly when some op ran between the
  // two joins.  Ranks with no op between their joins tie; the highest rank
  // wins, and since one all-reduce decides, every rank returns the same.
  const uint64_t stamp = session->wait();
  const int64_t size = comm->size();
  int64_t key = static_cast<int64_t>(stamp) * size + comm->rank();
  comm->allreduce(Tensor::of(&key, 1), ReduceOp::kMax,
                  OpOptions{"join: the last rank to join"});
  return static_cast<int>(key % size);
}

}  // namespace mpi
}  // namespace tutti
