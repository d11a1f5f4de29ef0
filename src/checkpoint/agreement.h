// The small collectives of the checkpoint protocol, each bounded in time:
// a rank that died or hangs turns into Error(kTimeout) on the others after
// `timeout_s` instead of a hang.  They run on the manager's private
// communicator, so they never interleave with the training loop's
// collectives even when the writer thread runs them.
//
// Agreements (who failed, which layout) are all-reduces and broadcasts of a
// few words: their timeouts name the ranks that never arrived.  What only
// rank 0 needs (the shard reports and piece lists of a commit, the reasons
// of a failure) travels up a binomial tree of point-to-point messages
// (tree_gather): every rank sends one aggregate to its parent and receives
// one from each of its at most ceil(log2 W) children, so no rank handles
// more than O(log W) messages, and the failure texts are capped on the way
// (problem_report.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tutti/process_group.h"

namespace tutti {
namespace ckpt {

// What the protocol sent and received on this process, for tests and
// benchmarks (tests/scale): collective calls that agree or report, the
// broadcasts that carry checkpoint data (a node sharing replicated state),
// and the point-to-point messages of tree gathers.  Counted process-wide
// with relaxed atomics.
struct ProtocolCounts {
  uint64_t collectives = 0;
  uint64_t data_broadcasts = 0;
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t bytes_sent = 0;
};
ProtocolCounts protocol_counts();
void reset_protocol_counts();

class Agreement {
 public:
  // `what` names the operation in errors ("checkpoint step 20").
  Agreement(ProcessGroup& comm, double timeout_s, std::string what)
      : comm_(comm), timeout_s_(timeout_s), what_(std::move(what)) {}

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  int64_t broadcast(int64_t value, int root, const char* phase);
  std::vector<int64_t> broadcast(std::vector<int64_t> values, int root, const char* phase);
  int64_t allreduce_max(int64_t value, const char* phase);
  // Element-wise MAX of every rank's words (the same count on every rank).
  std::vector<int64_t> allreduce_max(std::vector<int64_t> words, const char* phase);
  std::string broadcast(const std::string& text, int root, const char* phase);
  // n host bytes at `data` from `root` to every rank (one collective,
  // counted as a data broadcast).
  void broadcast_bytes(void* data, uint64_t n, int root, const char* phase);

  // The binomial tree to rank 0: returns, on rank 0, `mine` with every
  // other rank's aggregate folded in by merge(into, child) (children in
  // rank order, each holding its subtree); other ranks get "".  Each rank
  // sends one aggregate as two messages (its length, its bytes).
  using Merge = std::function<void(std::string& into, const std::string& child)>;
  std::string tree_gather(std::string mine, const Merge& merge, const char* phase);

  // Every rank's record to rank 0, in rank order (ranks with `mine` ==
  // nullptr add none).  Other ranks get an empty list.
  std::vector<std::pair<int, std::string>> gather_records(const std::string* mine,
                                                          const char* phase);

 private:
  OpOptions options(const char* phase) const;
  ProcessGroup& comm_;
  double timeout_s_;
  std::string what_;
};

// The configured bound: `requested` if > 0, else TUTTI_CKPT_TIMEOUT, else
// TUTTI_TIMEOUT.
double agreement_timeout(double requested);

}  // namespace ckpt
}  // namespace tutti
