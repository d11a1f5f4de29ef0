// The small collectives of the checkpoint protocol, each bounded in time:
// a rank that died or hangs turns into Error(kTimeout) on the others after
// `timeout_s` instead of a hang.  They run on the manager's private
// communicator, so they never interleave with the training loop's
// collectives even when the writer thread runs them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/process_group.h"

namespace tutti {
namespace ckpt {

class Agreement {
 public:
  // `what` names the operation in errors ("checkpoint step 20").
  Agreement(ProcessGroup& comm, double timeout_s, std::string what)
      : comm_(comm), timeout_s_(timeout_s), what_(std::move(what)) {}

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  int64_t broadcast(int64_t value, int root, const char* phase);
  // Every rank contributes the same number of values; result in rank order.
  std::vector<int64_t> allgather(const std::vector<int64_t>& mine, const char* phase);
  int64_t allreduce_max(int64_t value, const char* phase);
  std::string broadcast(const std::string& text, int root, const char* phase);
  // Every rank's text, in rank order (error paths: one broadcast per rank
  // with a non-empty text).
  std::vector<std::string> allgather_text(const std::string& text, const char* phase);

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
