#include "comm/mpi/status_service.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <sstream>

#include "comm/mpi/mpi_runtime.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {
namespace mpi {
namespace {

constexpr int kQueryTag = 1;
constexpr int kDepartTag = 2;  // departure notices (StatusService::depart)
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
  for (int i = 0; i < 100; ++i) {
    reap_notices(false);
    {
      std::lock_guard<std::mutex> lock(depart_mu_);
      if (outbox_.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  reap_notices(true);
  if (comm_ != MPI_COMM_NULL && is_initialized())
    TUTTI_MPI_WARN(MPI_Comm_free(&comm_), "stopping the status service");
  comm_ = MPI_COMM_NULL;
  running_ = false;
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
  std::lock_guard<std::mutex> lock(depart_mu_);
  for (int peer : world_ranks) {
    std::unique_ptr<Notice> n(new Notice{comm_id, last_entered,
                                         shutting_down_.load() ? 1u : 0u, 0});
    MPI_Request req = MPI_REQUEST_NULL;
    // Peers then wait for this rank until TUTTI_TIMEOUT, as before.
    if (TUTTI_MPI_WARN(MPI_Isend(n.get(), 4, MPI_UINT64_T, peer, kDepartTag, comm_, &req),
                       "departure notice to world rank ", peer))
      outbox_.emplace_back(req, std::move(n));
  }
}

void StatusService::reap_notices(bool give_up) {
  std::lock_guard<std::mutex> lock(depart_mu_);
  for (size_t i = 0; i < outbox_.size();) {
    int done = 0;
    // A failed send (a peer already gone) is dropped quietly: notices are
    // a courtesy, the peer's own timeout still bounds its wait.
    if (MPI_Test(&outbox_[i].first, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 1;
    if (!done && give_up) {
      if (outbox_[i].first != MPI_REQUEST_NULL) MPI_Request_free(&outbox_[i].first);
      (void)outbox_[i].second.release();  // MPI may still read it
      done = 1;
    }
    if (done) {
      outbox_[i] = std::move(outbox_.back());
      outbox_.pop_back();
    } else {
      ++i;
    }
  }
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
  // Departure notices (depart()): recorded, then the next one is awaited.
  uint64_t notice[4] = {0, 0, 0, 0};
  MPI_Request dreq = MPI_REQUEST_NULL;
  if (!TUTTI_MPI_WARN(MPI_Irecv(notice, 4, MPI_UINT64_T, MPI_ANY_SOURCE, kDepartTag,
                                comm_, &dreq),
                      kResponder))
    dreq = MPI_REQUEST_NULL;
  while (!stop_) {
    int flag = 0;
    MPI_Status st;
    if (dreq != MPI_REQUEST_NULL) {
      if (!TUTTI_MPI_WARN(MPI_Test(&dreq, &flag, &st), kResponder)) {
        dreq = MPI_REQUEST_NULL;  // no more notices: peers fall back to timeouts
      } else if (flag) {
        Departure d;
        d.world_rank = st.MPI_SOURCE;
        d.last_entered = notice[1];
        d.shutdown = notice[2] != 0;
        {
          std::lock_guard<std::mutex> lock(depart_mu_);
          departed_[notice[0]].push_back(d);
        }
        departures_.fetch_add(1, std::memory_order_release);
        if (!TUTTI_MPI_WARN(MPI_Irecv(notice, 4, MPI_UINT64_T, MPI_ANY_SOURCE,
                                      kDepartTag, comm_, &dreq),
                            kResponder))
          dreq = MPI_REQUEST_NULL;
        continue;
      }
    }
    reap_notices(false);
    flag = 0;
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
    // Answers are needed only when a peer's wait expired (it waits up to
    // TUTTI_STATUS_GRACE_MS, 2 s), and a departure ends a peer's wait within
    // this period: 20 ms is prompt enough, and each poll is a pass of MPI's
    // progress engine (at 5 ms: ~1.5% of a core).
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (req != MPI_REQUEST_NULL && TUTTI_MPI_WARN(MPI_Cancel(&req), kResponder))
    TUTTI_MPI_WARN(MPI_Wait(&req, MPI_STATUS_IGNORE), kResponder);
  if (dreq != MPI_REQUEST_NULL && TUTTI_MPI_WARN(MPI_Cancel(&dreq), kResponder))
    TUTTI_MPI_WARN(MPI_Wait(&dreq, MPI_STATUS_IGNORE), kResponder);
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

namespace {

// CommProgress::kind: a CollectiveKind or one of the split kinds.
const char* kind_name(uint8_t kind) {
  if (kind == comm::kSplitKind) return "split";
  if (kind == comm::kSplitSharedKind) return "node split";
  if (kind == comm::kJoinKind) return "join";
  return collective_kind_name(static_cast<CollectiveKind>(kind));
}

// " (last entered #4 barrier, finished it)" for a peer that did not reach
// the op.
std::string where_is(const PeerStatus& p) {
  std::ostringstream os;
  if (!p.member)
    os << " (has no such communicator)";
  else if (p.entered == 0)
    os << " (has not started any operation)";
  else
    os << " (last entered #" << p.entered << " "
       << kind_name(p.kind) << (p.completed >= p.entered ? ", finished it" : ", still in it") << ")";
  return os.str();
}

}  // namespace

std::string describe_stall(const std::vector<PeerStatus>& peers, uint64_t seq,
                           int self) {
  std::vector<int> arrived{self};
  std::ostringstream missing;
  int n_missing = 0;
  for (const auto& p : peers) {
    if (p.answered && p.member && p.entered >= seq) {
      arrived.push_back(p.world_rank);
      continue;
    }
    missing << (n_missing++ ? "; " : "") << "rank " << p.world_rank
            << (p.answered ? where_is(p)
                           : " (did not answer: dead, or stuck outside tutti)");
  }
  std::sort(arrived.begin(), arrived.end());
  std::ostringstream os;
  os << "arrived: " << (arrived.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < arrived.size(); ++i) os << (i ? ", " : "") << arrived[i];
  if (n_missing)
    os << "; missing: " << missing.str();
  else
    os << "; missing: none (every rank entered this op: the transport has "
          "not completed it yet)";
  return os.str();
}

std::string peer_report(uint64_t comm_id, const std::vector<int>& peers,
                        uint64_t seq, int self, bool stall, bool world_group) {
  if (!StatusService::instance().running())
    return "peers could not be asked (the status service is stopped)";
  const auto st = StatusService::instance().query(
      comm_id, peers,
      static_cast<double>(config::get_int("TUTTI_STATUS_GRACE_MS")) / 1000.0);
  return (stall ? describe_stall(st, seq, self) : describe_stragglers(st, seq)) +
         (world_group ? "" : " [world ranks]");
}

std::string describe_stragglers(const std::vector<PeerStatus>& peers,
                                uint64_t seq) {
  std::ostringstream never, ahead, silent, arrived;
  int n_never = 0, n_ahead = 0, n_silent = 0, n_arrived = 0;
  for (const auto& p : peers) {
    if (!p.answered) {
      silent << (n_silent++ ? ", " : "") << p.world_rank;
    } else if (!p.member || p.entered < seq) {
      never << (n_never++ ? "; " : "") << "rank " << p.world_rank
            << where_is(p);
    } else if (p.entered > seq) {
      ahead << (n_ahead++ ? "; " : "") << "rank " << p.world_rank << " (at #"
            << p.entered << ")";
    } else {
      arrived << (n_arrived++ ? ", " : "") << p.world_rank;
    }
  }
  std::ostringstream os;
  bool any = false;
  if (n_never) {
    os << "never arrived: " << never.str();
    any = true;
  }
  if (n_silent) {
    os << (any ? "; " : "") << "did not answer (dead, or stuck outside tutti): "
       << (n_silent == 1 ? "rank " : "ranks ") << silent.str();
    any = true;
  }
  if (n_ahead) {
    os << (any ? "; " : "") << "ahead of this op (ranks issued different "
       << "numbers of operations): " << ahead.str();
    any = true;
  }
  if (n_arrived)
    os << (any ? "; " : "") << "also arrived: "
       << (n_arrived == 1 ? "rank " : "ranks ") << arrived.str();
  if (!any && n_arrived)
    os << " (every rank entered this op: the transport did not complete it)";
  if (peers.empty()) os << "no peers to ask";
  return os.str();
}

}  // namespace mpi
}  // namespace tutti
