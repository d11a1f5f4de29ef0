// Answers "where are you?" after a timeout.
//
// Every MPI communicator publishes, per rank, the sequence number of the
// last operation it entered and completed.  When an operation times out,
// the rank asks the group's other members (over a private duplicate of
// MPI_COMM_WORLD, served by one responder thread per process) and names the
// ranks that never arrived.  A rank that does not answer within
// TUTTI_STATUS_GRACE_MS is reported as unresponsive (dead or hung outside
// tutti).  Needs MPI_THREAD_MULTIPLE, which init() requires.
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

namespace tutti {
namespace mpi {

// One rank's progress on one communicator (shared with the responder).
struct CommProgress {
  std::atomic<uint64_t> entered{0};    // seq of the last op started
  std::atomic<uint64_t> completed{0};  // seq of the last op finished
  // CollectiveKind of `entered`, or comm::kSplitKind / kSplitSharedKind.
  std::atomic<uint8_t> kind{0};
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
  // Stops the responder and frees the communicator.  Before MPI_Finalize.
  void stop();
  bool running() const { return running_; }

  void add(uint64_t comm_id, std::shared_ptr<CommProgress> progress);
  void remove(uint64_t comm_id);

  // Asks each of `world_ranks` for its progress on `comm_id`.
  std::vector<PeerStatus> query(uint64_t comm_id,
                                const std::vector<int>& world_ranks,
                                double grace_seconds);

 private:
  void respond_loop();

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool running_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<CommProgress>> comms_;
  std::mutex query_mu_;
  uint32_t next_reply_tag_ = 0;
};

// Asks `peers` (world ranks) where they are on communicator `comm_id` and
// describes op #`seq` for the error or warning of rank `self` (world rank):
// describe_stall() when `stall`, else describe_stragglers(); " [world
// ranks]" is appended unless `world_group`.  Blocks up to
// TUTTI_STATUS_GRACE_MS when peers do not answer.  Used by the MPI
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

}  // namespace mpi
}  // namespace tutti
