// NCCL plumbing of the NCCL communicator (TUTTI_WITH_NCCL builds only):
// the check macro, dtype/op mapping, the group guard, and the bounded wait
// on a non-blocking communicator.
#pragma once

#if TUTTI_WITH_NCCL
#include <nccl.h>

#include <functional>
#include <string>

#include "comm/mpi/mpi_runtime.h"
#include "core/check.h"
#include "tutti/comm.h"

#define TUTTI_NCCL_CHECK(expr)                                              \
  do {                                                                      \
    ncclResult_t tutti_nr_ = (expr);                                        \
    if (tutti_nr_ != ncclSuccess)                                           \
      TUTTI_THROW(kNccl, #expr, " failed: ",                                \
                  ::tutti::nccl::result_text(tutti_nr_, nullptr));          \
  } while (0)

namespace tutti {
namespace nccl {

// "unhandled system error (<NCCL's last error text>)".
std::string result_text(ncclResult_t r, ncclComm_t comm);
ncclDataType_t nccl_type(DType d);
ncclRedOp_t nccl_op(ReduceOp op);

// A non-blocking communicator (ncclConfig_t::blocking = 0) for init and
// split.
ncclConfig_t nonblocking_config();

// Waits while `rc` (what a call on a non-blocking communicator returned) is
// ncclInProgress, polling `query` (ncclCommGetAsyncError, or a locked
// wrapper of it), until the state settles or `deadline` passes; returns the
// final state (ncclInProgress on expiry).
ncclResult_t await(const std::function<ncclResult_t(ncclResult_t*)>& query,
                   ncclResult_t rc, const mpi::Deadline& deadline);
// The same on a communicator nobody else uses yet (init, split, finalize).
ncclResult_t await(ncclComm_t comm, ncclResult_t rc,
                   const mpi::Deadline& deadline);

// ncclGroupStart() ... ncclGroupEnd(), closed on every path: an error or
// an exception between the two still ends the group (an open group would
// swallow the next operation).
class GroupGuard {
 public:
  GroupGuard() : start_(ncclGroupStart()), open_(start_ == ncclSuccess) {}
  ~GroupGuard() {
    if (open_) ncclGroupEnd();
  }
  GroupGuard(const GroupGuard&) = delete;
  GroupGuard& operator=(const GroupGuard&) = delete;
  ncclResult_t started() const { return start_; }
  // Ends the group; ncclInProgress on a non-blocking communicator.
  ncclResult_t end() {
    if (!open_) return start_;
    open_ = false;
    return ncclGroupEnd();
  }

 private:
  ncclResult_t start_;
  bool open_;
};

}  // namespace nccl
}  // namespace tutti

#endif  // TUTTI_WITH_NCCL
