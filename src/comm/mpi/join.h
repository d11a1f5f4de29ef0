// join() for uneven inputs (Horovod's hvd.join(), torch DDP's Join): a rank
// that ran out of data waits until every rank of the group has joined and,
// meanwhile, takes part in the collectives the others still run with the
// reduction's identity.  docs/communication.md, "Uneven inputs".
//
// Protocol.  A joined rank posts the agreement check (agreement.h) with
// comm::join_wire(), the same descriptor on every joined rank:
//  * every rank joined -> phase 1 agrees -> this communicator's join is over;
//  * some ranks run an op -> phase 1 disagrees (max(f) and max(~f) cannot
//    both match) -> phase 2 gathers every descriptor, and running and joined
//    ranks apply comm::join_verdict() to the same descriptors: a servable op
//    runs on all ranks (the joined ones through run_collective() over a
//    scratch tensor holding the identity), any other one is kMismatch on
//    every running rank and skipped by the joined ones (no rank ran it).
// A group's same-membership splits (the reducer's launch channels,
// DistributedOptimizer(groups=...), process sets of every rank) carry
// collectives too: they register as followers of their parent, and join()
// serves the whole family at once, one loop per communicator on its own
// progress engine, each ending when its own check shows every rank joined.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tutti {
namespace mpi {

class MpiCommunicator;

// What the serve loops of one join() share.  Slot 0 is the group's own
// communicator, the others its followers.
class JoinSession {
 public:
  JoinSession(size_t loops, double timeout_s);

  // A loop saw progress (an agreement settled, an op was served): the
  // TUTTI_TIMEOUT of every loop counts from the latest one, so a joined
  // rank may wait as long as its peers keep running collectives.
  void progressed();
  // More than TUTTI_TIMEOUT since the last progress (never with 0).
  bool expired() const;
  double timeout_s() const { return timeout_s_; }
  // Set once a loop failed: the others stop at their next poll.
  bool failed() const { return failed_.load(); }
  std::string failed_group();

  // Loop `slot` began: the ops this rank queued on its communicator before
  // join() are done; `start_seq` is the communicator's op count then.
  void started(size_t slot, uint64_t start_seq);
  // Up to `seconds` for every follower loop to begin; true once they have.
  bool wait_followers_started(double seconds);
  // join() gives up a follower that is not live on every rank (it can
  // never see every rank join): its loop returns at its next poll.
  void cancel(size_t slot);
  bool cancelled(size_t slot);
  // Loop `slot` ended (error null on success).
  void finish(size_t slot, std::exception_ptr error, const std::string& group);
  // Waits for loop `slot` (or every loop: npos); rethrows the first error.
  void wait(size_t slot);
  uint64_t start_seq(size_t slot);

 private:
  struct Slot {
    bool started = false;
    bool done = false;
    bool cancelled = false;
    uint64_t start_seq = 0;
  };
  double timeout_s_;
  std::atomic<int64_t> last_ns_;
  std::atomic<bool> failed_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  std::exception_ptr error_;
  std::string failed_group_;
};

// The join of `comm` and its live followers; returns the rank (of `comm`)
// that joined last, the same on every rank.  Collective over every rank of
// `comm`.  Throws kUnsupported when the agreement check is off
// (TUTTI_CHECK_COLLECTIVES=0: running ranks would not tell joined ranks what
// they run), kTimeout after TUTTI_TIMEOUT without progress.
int join(const std::shared_ptr<MpiCommunicator>& comm);

}  // namespace mpi
}  // namespace tutti
