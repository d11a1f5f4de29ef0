#include "comm/mpi/status_service.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>

#include "comm/mpi/mpi_runtime.h"
#include "comm/mpi/ulfm.h"
#include "comm/rank_list.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {
namespace mpi {
namespace {

constexpr int kQueryTag = 1;
constexpr int kTreeTag = 3;  // the status tree (status_protocol.h)
constexpr int kFirstReplyTag = 100;
constexpr int kReplyTagSpan = 30000;
// Contexts of the (logged, never thrown) MPI failures below.
constexpr const char* kResponder = "status responder";
constexpr const char* kAsking = "status query to world rank ";

}  // namespace

StatusService& StatusService::instance() {
  static StatusService* s = new StatusService();  // outlives static dtors
  return *s;
}

void StatusService::start(MPI_Comm world) {
  if (running_) return;
  TUTTI_MPI_CHECK(MPI_Comm_dup(world, &comm_), "starting the status service");
  TUTTI_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN),
                  "starting the status service");
  StatusProtocol::Hooks hooks;
  hooks.answer = [this](uint64_t id) { return answer(id); };
  hooks.departed = [this](uint64_t id, int origin, uint64_t last, bool shutdown) {
    return record_departure(id, origin, last, shutdown);
  };
  // Aggregates are kept for about a stall period: one gather serves every
  // waiting rank's warning of that period.
  const double period = config::get_double("TUTTI_STALL_WARN_S");
  tree_.reset(new StatusProtocol(
      comm_, kTreeTag, static_cast<int>(config::get_int("TUTTI_STATUS_FANOUT")),
      std::chrono::duration_cast<StatusProtocol::Clock::duration>(
          std::chrono::duration<double>(period > 0 ? period : 0)),
      std::move(hooks)));
  stop_ = false;
  running_ = true;
  thread_ = std::thread([this] { respond_loop(); });
}

void StatusService::stop() {
  if (!running_) return;
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  // Notices are a few bytes, sent eagerly: give them a moment to leave,
  // then free what is left (MPI still delivers a freed send).
  for (int i = 0; i < 100 && tree_ && !tree_->reap(false); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  if (tree_) tree_->reap(true);
  if (comm_ != MPI_COMM_NULL && is_initialized()) {
    if (ulfm::enabled()) drain_unreceived();
    TUTTI_MPI_WARN(MPI_Comm_free(&comm_), "stopping the status service");
  }
  comm_ = MPI_COMM_NULL;
  running_ = false;
  // A start() after a recovery (tutti::recover()) numbers the world anew and
  // its communicators take the old ids again: old departures are void.
  {
    std::lock_guard<std::mutex> lock(depart_mu_);
    departed_.clear();
  }
  departures_.fetch_add(1, std::memory_order_release);
}

void StatusService::drain_unreceived() {
  // Open MPI 5.0's MPI_Finalize under `--with-ft ulfm` waits forever when a
  // message that nobody received is left on any communicator (measured with
  // 5.0.11: one eager MPI_Isend never matched, both ranks hang in the
  // finalize barrier).  A departure notice or a late reply to a status query
  // is such a message.  Every member stops its responder before it enters
  // this barrier, so nothing is sent here after it completes; until then
  // (bounded by TUTTI_STATUS_GRACE_MS: a member that never stops, or died)
  // and once after, what arrived is received and dropped.
  auto drain = [this] {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, &st) != MPI_SUCCESS || !flag)
        return;
      int bytes = 0;
      MPI_Get_count(&st, MPI_BYTE, &bytes);
      std::vector<char> sink(static_cast<size_t>(std::max(bytes, 1)));
      if (MPI_Recv(sink.data(), bytes, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, comm_,
                   MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return;
    }
  };
  MPI_Request barrier = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(comm_, &barrier) == MPI_SUCCESS) {
    const Deadline deadline(1e-3 * static_cast<double>(config::get_int("TUTTI_STATUS_GRACE_MS")));
    int done = 0;
    while (!done && !deadline.expired()) {
      drain();
      if (MPI_Test(&barrier, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (!done && barrier != MPI_REQUEST_NULL) MPI_Request_free(&barrier);
  }
  drain();
}

void StatusService::add(uint64_t id, std::shared_ptr<CommProgress> p) {
  std::lock_guard<std::mutex> lock(mu_);
  comms_[id] = std::move(p);
}

void StatusService::remove(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  comms_.erase(id);
}

void StatusService::depart(uint64_t comm_id, const std::vector<int>& world_ranks,
                           uint64_t last_entered) {
  if (!running_ || world_ranks.empty()) return;
  int self = -1;
  MPI_Comm_rank(comm_, &self);
  std::vector<int> members = world_ranks;
  members.push_back(self);
  std::sort(members.begin(), members.end());
  // Peers then wait for this rank until TUTTI_TIMEOUT, as before.
  tree_->depart(comm_id, members, last_entered, shutting_down_.load());
}

bool StatusService::record_departure(uint64_t comm_id, int origin, uint64_t last_entered,
                                     bool shutdown) {
  {
    std::lock_guard<std::mutex> lock(depart_mu_);
    auto& list = departed_[comm_id];
    for (const Departure& d : list)
      if (d.world_rank == origin) return false;  // known already
    Departure d;
    d.world_rank = origin;
    d.last_entered = last_entered;
    d.shutdown = shutdown;
    list.push_back(d);
  }
  departures_.fetch_add(1, std::memory_order_release);
  return true;
}

tree::Answer StatusService::answer(uint64_t comm_id) {
  tree::Answer a;
  a.answered = true;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(comm_id);
  if (it == comms_.end()) return a;
  a.member = true;
  a.entered = it->second->entered.load();
  a.finished = it->second->completed.load() >= a.entered;
  a.kind = it->second->kind.load();
  return a;
}

bool StatusService::report(uint64_t comm_id, const std::vector<int>& peers, uint64_t seq,
                           double grace_seconds, double max_age_seconds, tree::Aggregate* out) {
  if (!running_ || !thread_.joinable()) return false;
  int self = -1;
  MPI_Comm_rank(comm_, &self);
  std::vector<int> members = peers;
  members.push_back(self);
  std::sort(members.begin(), members.end());
  return tree_->ask(comm_id, seq, members, grace_seconds, max_age_seconds, out);
}

TreeCounts StatusService::tree_counts() const { return tree_ ? tree_->counts() : TreeCounts(); }

void StatusService::reset_tree_counts() {
  if (tree_) tree_->reset_counts();
}

std::vector<Departure> StatusService::departed(uint64_t comm_id) {
  std::lock_guard<std::mutex> lock(depart_mu_);
  auto it = departed_.find(comm_id);
  return it == departed_.end() ? std::vector<Departure>() : it->second;
}

void StatusService::respond_loop() {
  pthread_setname_np(pthread_self(), "tutti-status");
  uint64_t query[2] = {0, 0};  // comm id, reply tag
  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<std::pair<MPI_Request, std::unique_ptr<uint64_t[]>>> sends;
  // A thread of its own: failures are logged (kResponder) and end the
  // responder; peers asking this rank then report it as not answering.
  if (!TUTTI_MPI_WARN(MPI_Irecv(query, 2, MPI_UINT64_T, MPI_ANY_SOURCE,
                                kQueryTag, comm_, &req),
                      kResponder))
    return;
  while (!stop_) {
    // The status tree: reports and departure notices.
    const bool busy = tree_->poll();
    int flag = 0;
    MPI_Status st;
    if (!TUTTI_MPI_WARN(MPI_Test(&req, &flag, &st), kResponder)) break;
    if (flag) {
      std::unique_ptr<uint64_t[]> reply(new uint64_t[4]{0, 0, 0, 0});
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = comms_.find(query[0]);
        if (it != comms_.end()) {
          reply[0] = it->second->entered.load();
          reply[1] = it->second->completed.load();
          reply[2] = it->second->kind.load();
          reply[3] = 1;
        }
      }
      MPI_Request sreq;
      if (TUTTI_MPI_WARN(MPI_Isend(reply.get(), 4, MPI_UINT64_T, st.MPI_SOURCE,
                                   static_cast<int>(query[1]), comm_, &sreq),
                         kResponder, " (answering world rank ", st.MPI_SOURCE, ")"))
        sends.emplace_back(sreq, std::move(reply));
      if (!TUTTI_MPI_WARN(MPI_Irecv(query, 2, MPI_UINT64_T, MPI_ANY_SOURCE,
                                    kQueryTag, comm_, &req),
                          kResponder))
        break;
      continue;
    }
    for (size_t i = 0; i < sends.size();) {
      int done = 0;
      if (!TUTTI_MPI_WARN(MPI_Test(&sends[i].first, &done, MPI_STATUS_IGNORE),
                          kResponder)) {
        // Dropped (the asker times out); MPI may still read the buffer.
        (void)sends[i].second.release();
        done = 1;
      }
      if (done) {
        sends[i] = std::move(sends.back());
        sends.pop_back();
      } else {
        ++i;
      }
    }
    // Quiet: a pass every 20 ms (each is a pass of MPI's progress engine;
    // at 5 ms: ~1.5% of a core), and at once when this process asks for a
    // report.  A report in progress: every millisecond, so that a message
    // crosses a tree level in about that (departure notices and answers to
    // other ranks' reports wait up to 20 ms).
    tree_->idle(busy ? 1 : 20);
  }
  if (req != MPI_REQUEST_NULL && TUTTI_MPI_WARN(MPI_Cancel(&req), kResponder))
    TUTTI_MPI_WARN(MPI_Wait(&req, MPI_STATUS_IGNORE), kResponder);
  for (auto& s : sends)  // small; eager-sent
    if (s.first != MPI_REQUEST_NULL)
      TUTTI_MPI_WARN(MPI_Request_free(&s.first), kResponder);
  // The buffers of freed sends must outlive them: keep them (a few bytes).
  for (auto& s : sends) s.second.release();
}

std::vector<PeerStatus> StatusService::query(uint64_t comm_id,
                                             const std::vector<int>& ranks,
                                             double grace_seconds) {
  std::vector<PeerStatus> out(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) out[i].world_rank = ranks[i];
  if (!running_ || !thread_.joinable() || ranks.empty()) return out;
  std::lock_guard<std::mutex> lock(query_mu_);
  const int reply_tag =
      kFirstReplyTag + static_cast<int>(next_reply_tag_++ % kReplyTagSpan);
  // Buffers live until the end of the process if requests are abandoned.
  auto* q = new uint64_t[2]{comm_id, static_cast<uint64_t>(reply_tag)};
  auto* replies = new uint64_t[4 * ranks.size()]();
  std::vector<MPI_Request> sends(ranks.size(), MPI_REQUEST_NULL);
  std::vector<MPI_Request> recvs(ranks.size(), MPI_REQUEST_NULL);
  // A diagnosis gathered while an error is being raised: a failed call is
  // logged and that peer counts as not answering, never thrown.
  std::vector<char> waiting(ranks.size(), 0);  // for this peer's reply
  size_t pending = 0;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (!TUTTI_MPI_WARN(MPI_Irecv(replies + 4 * i, 4, MPI_UINT64_T, ranks[i],
                                  reply_tag, comm_, &recvs[i]),
                        kAsking, ranks[i])) {
      recvs[i] = MPI_REQUEST_NULL;
      continue;
    }
    waiting[i] = 1;
    ++pending;
    if (!TUTTI_MPI_WARN(MPI_Isend(q, 2, MPI_UINT64_T, ranks[i], kQueryTag,
                                  comm_, &sends[i]),
                        kAsking, ranks[i]))
      sends[i] = MPI_REQUEST_NULL;
  }
  Deadline deadline(grace_seconds > 0 ? grace_seconds : 0.001);
  while (pending > 0 && !deadline.expired()) {
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (!waiting[i]) continue;
      int flag = 0;
      if (!TUTTI_MPI_WARN(MPI_Test(&recvs[i], &flag, MPI_STATUS_IGNORE),
                          kAsking, ranks[i])) {
        waiting[i] = 0;  // given up: reported as not answering
        --pending;
        continue;
      }
      if (flag) {
        waiting[i] = 0;
        out[i].answered = true;
        out[i].entered = replies[4 * i];
        out[i].completed = replies[4 * i + 1];
        out[i].kind = static_cast<uint8_t>(replies[4 * i + 2]);
        out[i].member = replies[4 * i + 3] != 0;
        --pending;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  bool abandoned = false;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (recvs[i] != MPI_REQUEST_NULL) {
      TUTTI_MPI_WARN(MPI_Cancel(&recvs[i]), kAsking, ranks[i]);
      TUTTI_MPI_WARN(MPI_Request_free(&recvs[i]), kAsking, ranks[i]);
      abandoned = true;
    }
    if (sends[i] == MPI_REQUEST_NULL) continue;
    int flag = 0;
    if (!TUTTI_MPI_WARN(MPI_Test(&sends[i], &flag, MPI_STATUS_IGNORE), kAsking,
                        ranks[i]) ||
        !flag) {
      TUTTI_MPI_WARN(MPI_Request_free(&sends[i]), kAsking, ranks[i]);
      abandoned = true;
    }
  }
  if (!abandoned) {
    delete[] q;
    delete[] replies;
  }
  return out;
}

std::string peer_report(uint64_t comm_id, const std::vector<int>& peers,
                        uint64_t seq, int self, bool stall, bool world_group) {
  if (!StatusService::instance().running())
    return "peers could not be asked (the status service is stopped)";
  const int max_ranks = comm::report_max_ranks();
  const std::string where = world_group ? "" : " [world ranks]";
  if (peers.empty())
    return (stall ? describe_stall({}, seq, self) : describe_stragglers({}, seq)) + where;
  const double grace = static_cast<double>(config::get_int("TUTTI_STATUS_GRACE_MS")) / 1000.0;
  // A stall warning repeats every period: an aggregate gathered for another
  // waiting rank's warning of the same period will do.
  const double max_age = stall ? 0.9 * config::get_double("TUTTI_STALL_WARN_S") : 0;
  tree::Aggregate all;
  if (!StatusService::instance().report(comm_id, peers, seq, grace, max_age, &all)) {
    all = tree::Aggregate();  // nobody answered
    all.add_silent(peers);
  }
  return describe_report(all, seq, self, peers, stall, max_ranks) + where;
}

}  // namespace mpi
}  // namespace tutti
