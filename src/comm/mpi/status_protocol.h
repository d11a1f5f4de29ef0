// The status tree's protocol (status_tree.h has the tree and the
// aggregate): stall and timeout reports gathered through the tree, and
// departure notices spread through it.  Run by the status service's
// responder thread (status_service.h) on its private communicator; asks
// and departures come from any thread.
//
// A report about op #seq of a communicator (key: comm id, seq):
//  * the asking rank hands it to its own responder, which sends kAsk to its
//    tree parent; a parent that is already waiting for the same key only
//    remembers the child (one ask per key goes up), and the root starts one
//    gather;
//  * a gather: a node sends kGather to each child, adds its own answer (its
//    CommProgress for that communicator) and the children's kReply
//    aggregates, and replies to whoever asked for its span;
//  * the root's result (the whole tree's aggregate) travels back down the
//    asks' path as a kReply for the whole span, and every node on it keeps
//    it: a stall warning's ask accepts one up to 0.9 stall periods old
//    (every waiting rank asks once per period, at about the same time), a
//    timeout's up to 0.5 s.
// Per report and process: at most one ask up, one gather from the parent,
// fanout gathers down, one reply up, one whole reply from the parent and
// fanout replies down: 2 x fanout + 2 messages sent whatever W, and none
// at all while no op stalls.
//
// Silence.  A child that has not replied by its deadline (a leaf: 90% of
// the gather's time; a child with h levels below it: (h + 1) / (h + 2) of
// it, the rest for its children) is reported as "did not answer",
// and its children are asked directly while time is left (adopted), so a
// dead or stopped member costs its subtree one level of delay, not its
// answers.  A rank whose parent sends nothing back in time asks the root
// itself (kGather for the whole span), adopting the root's children if the
// root is silent.
//
// Departures.  A rank that closes a communicator sends one kNotice to each
// tree neighbour (parent and children); each receiver records it and
// forwards it to its other neighbours, batched per pass, unless it has
// closed that communicator itself: its own notice already tells its side
// of the tree that it will enter no further op there, and a member waiting
// in an op that rank completed cannot be waiting for the first one.  So a
// close costs O(W) messages in total and at most fanout + 1 per process.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comm/mpi/status_tree.h"

namespace tutti {
namespace mpi {

// Messages of the status tree this process sent and received, by type.
struct TreeCounts {
  enum Type { kAsk, kGather, kReply, kNotice, kTypes };
  uint64_t sent[kTypes] = {};
  uint64_t received[kTypes] = {};
  uint64_t bytes_sent = 0;
  uint64_t total_sent() const { return sent[0] + sent[1] + sent[2] + sent[3]; }
  uint64_t total_received() const {
    return received[0] + received[1] + received[2] + received[3];
  }
};

class StatusProtocol {
 public:
  using Clock = std::chrono::steady_clock;
  struct Hooks {
    // This process's answer about a communicator (member = false: none).
    std::function<tree::Answer(uint64_t comm)> answer;
    // A departure notice about `comm` from world rank `origin`; false when
    // it was known already (then it is not forwarded again).
    std::function<bool(uint64_t comm, int origin, uint64_t last_entered, bool shutdown)> departed;
  };

  // `keep`: how long aggregates are kept (most of a stall period).
  StatusProtocol(MPI_Comm comm, int tag, int fanout, Clock::duration keep, Hooks hooks);
  ~StatusProtocol();

  // Any thread: the aggregate of every member's answer about `comm` for op
  // #seq (`members`: world ranks, ascending, this rank among them).  Waits
  // at most `grace_s`; an aggregate gathered for another rank's ask at most
  // `max_age_s` ago (at least kFresh, 0.5 s; at most `keep`) is reused.
  // False when nothing came back (the responder is gone).
  bool ask(uint64_t comm, uint64_t seq, const std::vector<int>& members, double grace_s,
           double max_age_s, tree::Aggregate* out);
  // Any thread: this rank closed `comm` after entering op #last_entered;
  // notices go to its tree neighbours at once.
  void depart(uint64_t comm, const std::vector<int>& members, uint64_t last_entered,
              bool shutdown);

  // Responder thread: receives and handles what arrived, serves asks,
  // expires deadlines, sends forwarded notices.  True while a report is in
  // progress here (poll again soon).
  bool poll();
  // Responder thread: sleeps up to `ms`, less when an ask or a notice
  // arrives from this process.
  void idle(int ms);
  // Tests the sends in flight; `give_up`: frees them (MPI still delivers a
  // freed send) and keeps their buffers.  True when none is left.
  bool reap(bool give_up);

  TreeCounts counts() const;
  void reset_counts();

 private:
  using Key = std::pair<uint64_t, uint64_t>;  // comm id, op seq
  struct Local;
  struct Wait {
    tree::Span span;
    Clock::time_point deadline;
  };
  // An aggregate this node collects: its own span, or the whole tree when
  // its parent went silent (a fallback).
  struct Gather {
    std::vector<int> members;
    tree::Span span;
    tree::Aggregate agg;
    std::vector<Wait> waits;
    Clock::time_point end;      // when its answer is due
    std::vector<int> reply_to;  // world ranks that asked for `span`
  };
  // The whole tree's aggregate wanted here.
  struct Ask {
    std::vector<int> members;
    std::vector<int> requesters;  // children that sent kAsk
    std::vector<std::shared_ptr<Local>> locals;
    Clock::time_point started, up_deadline, end;
    bool fallback = false;
  };
  struct Cached {
    tree::Aggregate agg;
    Clock::time_point at;
  };
  struct Message;

  void handle(int from, const std::vector<uint8_t>& bytes);
  void on_ask(const Key& key, const std::vector<int>& members, Clock::duration budget,
              Clock::duration max_age, int from, const std::shared_ptr<Local>& local);
  void on_gather(const Key& key, const std::vector<int>& members, tree::Span span,
                 Clock::duration budget, Clock::duration max_age, int from);
  void on_reply(const Key& key, tree::Span span, const tree::Aggregate& agg);
  void on_notice(int from, uint64_t comm, const std::vector<int>& members,
                 const std::vector<std::pair<int, std::pair<uint64_t, bool>>>& entries);
  // Starts this node's gather of its own span.
  Gather& start_gather(const Key& key, const std::vector<int>& members, Clock::duration budget);
  // Sends kGather for `span` to its node and waits for its reply for
  // `budget`; `max_age`: a kept aggregate of the whole tree this old will do.
  void request(Gather& g, const Key& key, tree::Span span, Clock::duration budget,
               Clock::duration max_age = Clock::duration::zero());
  void expire(Gather& g, const Key& key, Clock::time_point now);
  // Completes finished gathers of `key`; true when `key`'s ask was served.
  void settle(const Key& key);
  void finish(const Key& key, const tree::Aggregate& whole);
  void send(int to, std::vector<uint8_t> bytes, int type);
  std::vector<uint8_t> message(int type, const Key& key, tree::Span span, Clock::duration budget,
                               const std::vector<int>* members) const;
  int index_of(const std::vector<int>& members) const;
  // World ranks of this rank's tree parent and children among `members`.
  std::vector<int> neighbours(const std::vector<int>& members) const;

  MPI_Comm comm_;
  int tag_;
  int fanout_;
  Clock::duration keep_;
  int me_ = -1;  // world rank
  Hooks hooks_;

  std::mutex mu_;  // locals_, queue_, closed_, sends_
  std::condition_variable cv_;
  std::vector<std::pair<Key, std::pair<std::vector<int>, std::shared_ptr<Local>>>> queue_;
  std::set<uint64_t> closed_;  // communicators this process closed
  std::vector<std::pair<MPI_Request, std::unique_ptr<std::vector<uint8_t>>>> sends_;

  // Responder thread only.
  std::map<Key, Gather> own_, fallback_;
  std::map<Key, Ask> asks_;
  std::map<Key, Cached> cache_;
  // Forwarded notices of this pass, per (comm, neighbour).
  std::map<std::pair<uint64_t, int>, std::pair<std::vector<int>, std::vector<uint8_t>>> forward_;

  std::atomic<uint64_t> sent_[TreeCounts::kTypes] = {};
  std::atomic<uint64_t> received_[TreeCounts::kTypes] = {};
  std::atomic<uint64_t> bytes_sent_{0};
};

}  // namespace mpi
}  // namespace tutti
