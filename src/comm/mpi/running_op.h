// MpiCommunicator::RunningOp, shared by the communicator's files
// (mpi_communicator.cc, join.cc).  Internal.
#pragma once

#include <optional>

#include "comm/mpi/mpi_communicator.h"

namespace tutti {
namespace mpi {

// One numbered op while it runs on the engine (a collective or a split):
// peers' status queries see it entered, and finished once the scope ends
// (whether it succeeded or threw), so a timed-out rank names exactly the
// ranks that never arrived; the stall inspector and the departure check
// (a member that closed the communicator before this op fails it at once)
// watch it (stall_) until then.  Engine thread only, one at a time.
class MpiCommunicator::RunningOp {
 public:
  RunningOp(MpiCommunicator& c, uint64_t seq, uint8_t kind,
            const comm::OpLabel& desc, size_t bytes, double stall_warn_s,
            double timeout_s)
      : c_(c), desc_(desc), seq_(seq), bytes_(bytes),
        stall_warn_s_(stall_warn_s), timeout_s_(timeout_s) {
    c_.progress_->kind = kind;
    c_.progress_->entered = seq;
    // Quiet unless the op waits TUTTI_STALL_WARN_S (0: never) or a member
    // departs.  The callbacks capture one pointer (no allocation per op).
    if (c_.size_ > 1) {
      stall_.emplace(
          stall_warn_s,
          [this](double waited) {
            c_.warn_stall(desc_, bytes_, seq_, waited, stall_warn_s_, timeout_s_,
                          phase_);
          },
          StallWatch::Clock::now(),
          [this] { c_.check_departures(desc_, seq_, phase_); });
      c_.stall_ = &*stall_;
    }
  }
  ~RunningOp() {
    c_.stall_ = nullptr;
    c_.progress_->completed = seq_;
  }
  RunningOp(const RunningOp&) = delete;
  RunningOp& operator=(const RunningOp&) = delete;
  // What the op waits for now, for the stall warning.
  void set_phase(const char* phase) { phase_ = phase; }

 private:
  MpiCommunicator& c_;
  const comm::OpLabel& desc_;
  uint64_t seq_;
  size_t bytes_;
  double stall_warn_s_;
  double timeout_s_;
  const char* phase_ = "agreeing on the operation";
  std::optional<StallWatch> stall_;
};

}  // namespace mpi
}  // namespace tutti
