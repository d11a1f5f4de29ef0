#include "comm/mpi/join.h"

#include <algorithm>

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

// The ids of `mine` that every rank of `comm` has (collective).
std::vector<int64_t> common_ids(Communicator& comm, const std::vector<int64_t>& mine) {
  const int n = comm.size();
  int64_t count = static_cast<int64_t>(mine.size());
  std::vector<int64_t> counts(static_cast<size_t>(n));
  comm.allgather(Tensor::of(&count, 1), Tensor::of(counts),
                 OpOptions{"join: number of live splits"});
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<int64_t> all(static_cast<size_t>(total));
  std::vector<int64_t> in = mine;
  comm.allgatherv(Tensor::of(in), Tensor::of(all), counts,
                  OpOptions{"join: ids of the live splits"});
  std::vector<int64_t> common;
  for (int64_t id : mine)
    if (std::count(all.begin(), all.end(), id) == n) common.push_back(id);
  return common;
}

}  // namespace

JoinSession::JoinSession(size_t loops, double timeout_s)
    : timeout_s_(timeout_s), last_ns_(now_ns()), slots_(loops) {}

void JoinSession::progressed() { last_ns_.store(now_ns()); }

bool JoinSession::expired() const {
  if (timeout_s_ <= 0) return false;
  return static_cast<double>(now_ns() - last_ns_.load()) * 1e-9 > timeout_s_;
}

std::string JoinSession::failed_group() {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_group_;
}

void JoinSession::started(size_t slot, uint64_t start_seq) {
  std::lock_guard<std::mutex> lock(mu_);
  slots_[slot].started = true;
  slots_[slot].start_seq = start_seq;
  cv_.notify_all();
}

bool JoinSession::wait_followers_started(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] {
    for (size_t i = 1; i < slots_.size(); ++i)
      if (!slots_[i].started && !slots_[i].done) return false;
    return true;
  });
}

void JoinSession::cancel(size_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  slots_[slot].cancelled = true;
}

bool JoinSession::cancelled(size_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_[slot].cancelled;
}

void JoinSession::finish(size_t slot, std::exception_ptr error,
                         const std::string& group) {
  std::lock_guard<std::mutex> lock(mu_);
  slots_[slot].done = true;
  if (error && !error_) {
    error_ = error;
    failed_group_ = group;
    failed_.store(true);
  }
  cv_.notify_all();
}

void JoinSession::wait(size_t slot) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] {
    if (slot != std::string::npos) return slots_[slot].done || error_ != nullptr;
    for (const Slot& s : slots_)
      if (!s.done) return false;
    return true;
  });
  if (error_) std::rethrow_exception(error_);
}

uint64_t JoinSession::start_seq(size_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_[slot].start_seq;
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
  session->wait(0);
  // Every rank joined on `comm`, and each had finished its own ops on the
  // followers before its loop on `comm` began: nothing runs in the family
  // any more.  A follower live on every rank ends by itself.  One destroyed
  // on some rank (Python frees a dropped model's reducer whenever its
  // garbage collector runs) can never see every rank join: find the ids
  // live everywhere and give up the others (unusable anyway: a split
  // missing on one rank can never run a collective again).
  std::vector<int64_t> mine;
  for (size_t i = 1; i < family.size(); ++i)
    mine.push_back(static_cast<int64_t>(family[i]->comm_id()));
  const std::vector<int64_t> everywhere = common_ids(*comm, mine);
  uint64_t stamp = session->start_seq(0);
  for (size_t i = 1; i < family.size(); ++i) {
    if (std::count(everywhere.begin(), everywhere.end(), mine[i - 1]))
      stamp += session->start_seq(i);
    else
      session->cancel(i);
  }
  session->wait(std::string::npos);
  const int64_t size = comm->size();
  int64_t key = static_cast<int64_t>(stamp) * size + comm->rank();
  comm->allreduce(Tensor::of(&key, 1), ReduceOp::kMax,
                  OpOptions{"join: the last rank to join"});
  return static_cast<int>(key % size);
}

}  // namespace mpi
}  // namespace tutti
