// Answers "where are you?" when an op stalls or times out, and tells peers
// who left.
//
// Every MPI communicator publishes, per rank, the sequence number of the
// last operation it entered and completed (CommProgress, registered with
// add()).  When an operation stalls (TUTTI_STALL_WARN_S) or times out, the
// waiting rank asks for a report (peer_report) and names the ranks that
// never arrived.  Reports travel through a tree over the communicator's
// members (status_protocol.h): the waiting ranks' asks go up, the root
// gathers every member's answer down the tree once, and the aggregate comes
// back down, so a report costs each process at most 2 x TUTTI_STATUS_FANOUT
// + 2 messages and nothing is sent while no op stalls.  The messages go
// over a private duplicate of MPI_COMM_WORLD, served by one responder
// thread per process; a member that does not answer within its share of
// TUTTI_STATUS_GRACE_MS is reported as unresponsive (dead or hung outside
// tutti), and its children are asked directly.  Needs MPI_THREAD_MULTIPLE,
// which init() requires.
//
// Departures: a rank that closes a communicator (shutdown(), at exit too,
// or by dropping its last reference) will never enter another op on it.
// close() sends a departure notice (the communicator's id, the last op this
// rank entered on it, whether it was shutting down) to its tree neighbours,
// which record it and pass it on; the responder thread records the notices
// it receives.  A rank waiting in op #k for a member whose notice says it
// stopped before #k fails at once (MpiCommunicator::check_departures)
// instead of at TUTTI_TIMEOUT.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi/status_protocol.h"
#include "comm/mpi/status_tree.h"

namespace tutti {
namespace mpi {

// One rank's progress on one communicator (shared with the responder).
struct CommProgress {
  std::atomic<uint64_t> entered{0};    // seq of the last op started
  std::atomic<uint64_t> completed{0};  // seq of the last op finished
  // CollectiveKind of `entered`, or comm::kSplitKind / kSplitSharedKind.
  std::atomic<uint8_t> kind{0};
};

// A member that closed a communicator (from a departure notice).
struct Departure {
  int world_rank = -1;
  uint64_t last_entered = 0;  // the last op it entered there (0: none)
  bool shutdown = false;      // closed by shutdown() (else dropped)
};

struct PeerStatus {
  int world_rank = -1;
  bool answered = false;  // replied within the grace period
  bool member = false;    // knows the communicator
  uint64_t entered = 0;
  uint64_t completed = 0;
  uint8_t kind = 0;
};

class StatusService {
 public:
  static StatusService& instance();

  // Duplicates `world` and starts the responder thread.
  void start(MPI_Comm world);
  // Stops the responder and frees the communicator (before MPI_Finalize, and
  // in tutti::recover() before start() over the shrunken world); forgets
  // the departures recorded.
  void stop();
  bool running() const { return running_; }

  void add(uint64_t comm_id, std::shared_ptr<CommProgress> progress);
  void remove(uint64_t comm_id);

  // Asks each of `world_ranks` for its progress on `comm_id`, one message
  // each (join() uses it for a family of a few communicators; reports go
  // through report()).
  std::vector<PeerStatus> query(uint64_t comm_id,
                                const std::vector<int>& world_ranks,
                                double grace_seconds);

  // Every member's answer about `comm_id` for op #seq through the status
  // tree (`peers`: the other members' world ranks).  Waits at most
  // `grace_seconds`; reuses an aggregate gathered up to `max_age_seconds`
  // ago (at least 0.5 s) for another member's report.  False when nothing
  // came back.
  bool report(uint64_t comm_id, const std::vector<int>& peers, uint64_t seq,
              double grace_seconds, double max_age_seconds, tree::Aggregate* out);
  // The status tree's messages this process sent and received (tests).
  TreeCounts tree_counts() const;
  void reset_tree_counts();

  // shutdown() has begun: later departures say "shut down".
  void begin_shutdown() { shutting_down_ = true; }
  // Tells the other members (`world_ranks`) that this rank closed `comm_id`
  // after entering op #`last_entered`: a notice to each tree neighbour, who
  // pass it on.  Non-blocking; a failure is logged.
  void depart(uint64_t comm_id, const std::vector<int>& world_ranks,
              uint64_t last_entered);
  // How many notices this process has received (a waiter compares it with
  // the count it last looked at: one atomic load).
  uint64_t departures() const { return departures_.load(std::memory_order_acquire); }
  // The members that left `comm_id` so far.
  std::vector<Departure> departed(uint64_t comm_id);

 private:
  void respond_loop();
  tree::Answer answer(uint64_t comm_id);
  bool record_departure(uint64_t comm_id, int origin, uint64_t last_entered, bool shutdown);

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool running_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<CommProgress>> comms_;
  std::mutex query_mu_;
  uint32_t next_reply_tag_ = 0;
  // stop() under ULFM: receives what peers sent that nobody received.
  void drain_unreceived();
  std::atomic<bool> shutting_down_{false};
  std::atomic<uint64_t> departures_{0};
  std::mutex depart_mu_;
  std::map<uint64_t, std::vector<Departure>> departed_;  // by comm id
  std::unique_ptr<StatusProtocol> tree_;
};

// Asks `peers` (world ranks) where they are on communicator `comm_id`
// (through the status tree) and describes op #`seq` for the error or
// warning of rank `self` (world rank): a stall view when `stall`, else the
// stragglers; " [world ranks]" is appended unless `world_group`.  Blocks up
// to TUTTI_STATUS_GRACE_MS when peers do not answer.  Used by the MPI
// communicator and by the NCCL one's watchdog.
std::string peer_report(uint64_t comm_id, const std::vector<int>& peers,
                        uint64_t seq, int self, bool stall, bool world_group);

// "rank 1 never arrived (last entered #4 barrier); rank 2 did not answer"
std::string describe_stragglers(const std::vector<PeerStatus>& peers,
                                uint64_t seq);

// The stall inspector's view of op #`seq`, which rank `self` (world rank)
// has entered: "arrived: ranks 0, 1, 3; missing: rank 2 (last entered #4
// barrier, finished it)".  A peer that entered #seq or later has arrived; one
// that did not answer is missing ("did not answer").
std::string describe_stall(const std::vector<PeerStatus>& peers, uint64_t seq,
                           int self);

// The same from the status tree's aggregate of every member (self
// included): describe_stall() or describe_stragglers() word for word when
// it lists every rank and there are at most `max_ranks` peers; above that
// ranks are named as ranges ("arrived: ranks 0-511, 513-1023; missing: rank
// 512 (last entered #2 barrier, finished it)"), missing ranks grouped by
// where they are, at most `max_ranks` groups, the rest counted.
std::string describe_report(const tree::Aggregate& all, uint64_t seq, int self,
                            const std::vector<int>& peers, bool stall, int max_ranks);

}  // namespace mpi
}  // namespace tutti
