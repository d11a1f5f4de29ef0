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

// The check for NCCL calls that must succeed outright (not the enqueues on
// a non-blocking communicator, whose ncclInProgress the caller settles).
// The optional arguments are the context (the op, the communicator, the
// peer), concatenated.  Throws Error(kNccl) "rank R: <context>: ncclXxx
// failed: <NCCL's text>" (detail::call_failed, as TUTTI_MPI_CHECK).
#define TUTTI_NCCL_CHECK(expr, ...)                                         \
  do {                                                                      \
    const ncclResult_t tutti_nr_ = (expr);                                  \
    if (tutti_nr_ != ncclSuccess)                                           \
      TUTTI_THROW(kNccl, ::tutti::detail::call_failed(                      \
                             #expr, ::tutti::detail::cat(__VA_ARGS__),      \
                             ::tutti::nccl::result_text(tutti_nr_, nullptr))); \
  } while (0)

// The same where throwing is wrong (close, destructors, an abort while
// another error is raised): logs at WARN; evaluates to true on success.
#define TUTTI_NCCL_WARN(expr, ...) \
  ::tutti::nccl::nccl_ok((expr), #expr, ::tutti::detail::cat(__VA_ARGS__))

namespace tutti {
namespace nccl {

// What the NCCL communicator refuses of a send/recv that the MPI one
// serves: a tag (NCCL matches a peer's sends and receives in posting order,
// so tagged messages posted in different orders would be swapped silently)
// and this rank as the peer (one communication stream: the send would wait
// forever for the receive queued behind it).  Throws kInvalidArgument
// naming the op `desc` and what to do instead; no-op for other kinds.
void check_p2p(const OpRequest& r, int rank, const std::string& desc);

// "unhandled system error (<NCCL's last error text>)".
std::string result_text(ncclResult_t r, ncclComm_t comm);
// TUTTI_NCCL_WARN's body: true for ncclSuccess, else logs and returns false.
bool nccl_ok(ncclResult_t r, const char* expr, const std::string& context);
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
    if (!open_) return;
    // ncclInProgress: the group was handed to a non-blocking communicator.
    const ncclResult_t r = ncclGroupEnd();
    if (r != ncclInProgress)
      nccl_ok(r, "ncclGroupEnd", "closing an NCCL group after an error");
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
