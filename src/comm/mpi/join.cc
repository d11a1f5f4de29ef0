#include "comm/mpi/join.h"

#include <algorithm>

#include "comm/mpi/agreement.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/running_op.h"
#include "comm/mpi/status_service.h"
#include "comm/registry.h"
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

// The family without the followers that some other member no longer has
// (its garbage collector freed the group: Python frees a dropped model's
// reducer whenever it runs), asked over the status service, out of band,
// since the group itself is busy with the running ranks' ops.  A join loop
// posts its check on every follower it serves, and a collective posted on a
// communicator that a member has freed is erroneous in MPI (Open MPI queues
// the fragments under the freed context id for whichever communicator gets
// it next): the Python suite segfaulted in ob1's matching inside join()
// once two ranks held different DistributedDataParallel models' channels.
// Such a follower is given up at once (later ops on it: kAborted).  A peer
// that does not answer keeps the follower, and one freed during the join
// is given up after it (common_ids below), as before.
std::vector<std::shared_ptr<MpiCommunicator>> live_everywhere(
    std::vector<std::shared_ptr<MpiCommunicator>> family) {
  if (family.size() <= 1 || !StatusService::instance().running()) return family;
  const double grace =
      static_cast<double>(config::get_int("TUTTI_STATUS_GRACE_MS")) / 1000.0;
  std::vector<std::shared_ptr<MpiCommunicator>> kept{family[0]};
  for (size_t i = 1; i < family.size(); ++i) {
    const auto& f = family[i];
    bool everywhere = true;
    for (const PeerStatus& p :
         StatusService::instance().query(f->comm_id(), f->peer_world_ranks(), grace))
      everywhere = everywhere && (!p.answered || p.member);
    if (everywhere)
      kept.push_back(f);
    else
      f->give_up();
  }
  return kept;
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

std::vector<std::shared_ptr<MpiCommunicator>> MpiCommunicator::followers() {
  std::lock_guard<std::mutex> lock(followers_mu_);
  std::vector<std::shared_ptr<MpiCommunicator>> live;
  std::vector<std::weak_ptr<MpiCommunicator>> kept;
  for (const auto& w : followers_)
    if (auto f = w.lock()) {
      // A follower an earlier join() gave up (poisoned) is unusable: a loop
      // started on it failed at once, and join() raised while its loop on
      // the group went on serving.
      if (f->closed_ || f->poisoned_) continue;
      live.push_back(f);
      kept.push_back(w);
    }
  followers_.swap(kept);
  return live;
}

void MpiCommunicator::start_join_loop(const std::shared_ptr<JoinSession>& session,
                                      size_t slot) {
  auto self = shared_from_this();
  engine_.submit(
      [self, session, slot] {
        // After the ops this rank queued before join(): they ran as a
        // running rank's, and count in the stamp (join.cc).
        session->started(slot, self->next_seq_);
        std::exception_ptr error;
        try {
          self->serve_joined(*session, slot);
        } catch (...) {
          error = std::current_exception();
        }
        session->finish(slot, error, self->name_);
      },
      false);
}

void MpiCommunicator::serve_joined(JoinSession& session, size_t slot) {
  const comm::OpLabel label(detail::cat("join on group '", name_, "'"));
  // Between waits (every 0.2 s): the deadline counts from the last progress
  // of ANY loop of this join, and another loop's failure stops this one.
  // False: join() gave this follower up.
  auto poll = [&] {
    if (session.cancelled(slot) || session.failed()) {
      // The pending check is abandoned: the communicator is unusable now.
      poisoned_ = true;
      // Given up (destroyed on another rank): no peer will ever post on it,
      // so MPI_Finalize has nothing to wait for.
      if (!session.failed()) return false;
      comm::note_communicator_poisoned();
      TUTTI_THROW(kAborted, label, ": stopped because the join failed on group '",
                  session.failed_group(), "'; communicator '", name_,
                  "' is unusable now");
    }
    if (session.expired())
      fail_timeout(label, next_seq_ + 1, session.timeout_s(),
                   "waiting for the ranks that have not joined (counted from "
                   "the last operation served on any communicator of this "
                   "join)");
    return true;
  };
  if (slot == 0) {
    // Post on the group only once this rank's own ops on the followers are
    // done: then all ranks joined here means no rank has an op left on any
    // communicator of the family.
    while (!session.wait_followers_started(0.2)) poll();
  }
  std::vector<char> scratch;
  for (;;) {
    if (closed_ || poisoned_)
      TUTTI_THROW(kAborted, label, ": communicator '", name_,
                  "' is unusable after an earlier failure");
    if (size_ == 1) return;
    // Peers' status queries see this rank at the next op, inside join.
    progress_->kind = comm::kJoinKind;
    progress_->entered = next_seq_ + 1;
    AgreementCheck check(check_, check_, comm::join_wire(), false);
    while (!check.wait(Deadline(0.2), label))
      if (!poll()) return;
    session.progressed();
    const std::vector<comm::WireDesc>* all = check.gathered();
    if (!all) {  // every rank joined
      progress_->entered = progress_->completed = next_seq_;
      return;
    }
    const comm::JoinVerdict verdict = comm::join_verdict(*all);
    if (verdict.runner < 0)
      TUTTI_THROW(kInternal, label, ": the join check disagreed but no rank runs an op");
    const comm::WireDesc& op = (*all)[static_cast<size_t>(verdict.runner)];
    // Number as the running ranks do (an op they refused still counted).
    next_seq_ = op.seq;
    if (!verdict.servable) {
      // The running ranks raise kMismatch; nobody runs it.
      progress_->kind = op.kind;
      progress_->entered = progress_->completed = op.seq;
      continue;
    }
    serve_op(op, scratch);
    session.progressed();
  }
}

void MpiCommunicator::serve_op(const comm::WireDesc& op, std::vector<char>& scratch) {
  const comm::CommSettings::Values settings = settings_.get();
  OpRequest r;
  r.kind = static_cast<CollectiveKind>(op.kind);
  r.op = static_cast<ReduceOp>(op.op);
  r.root = op.root;
  r.options.name = "served by a joined rank";
  r.options.timeout_s = settings.timeout_s;
  if (r.kind != CollectiveKind::kBarrier) {
    // make_wire's count for all-reduce and broadcast: the element count.
    const auto dtype = static_cast<DType>(op.dtype);
    scratch.resize(static_cast<size_t>(op.count) * dtype_size(dtype));
    if (r.kind == CollectiveKind::kAllreduce)
      comm::fill_identity(dtype, r.op, scratch.data(), op.count);
    r.input = r.output = Tensor(scratch.data(), dtype, Shape{op.count});
  }
  const comm::OpLabel desc(r, op.seq, name_);
  RunningOp running(*this, op.seq, op.kind, desc, comm::payload_bytes(r),
                    settings.stall_warn_s, settings.timeout_s);
  running.set_phase("exchanging data (served by a joined rank)");
  run_collective(r, Deadline(settings.timeout_s), desc, op.seq);
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
  family = live_everywhere(std::move(family));
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
