// The one exception type tutti throws across its public boundary.
//
// Every message names what a user needs to act on: the rank, the operation
// and its sequence number, the tensor, and what was expected, e.g.
//   "rank 1: allreduce #42 'layer3.weight': float32[1024] does not match
//    rank 0's float16[1024]".
// Library code never calls exit() or abort(); see docs/errors.md for which
// codes are recoverable.
#pragma once

#include <stdexcept>
#include <string>

#include "tutti/export.h"

namespace tutti {

enum class ErrorCode : int {
  kInvalidArgument = 1,  // caller passed something wrong (bug in caller)
  kMismatch = 2,         // ranks disagree about a collective or a plan
  kTimeout = 3,          // watchdog: an operation did not finish in time
  kCommFailure = 4,      // a transport failed or a peer is gone
  kIo = 5,               // file system errors (checkpoint writes, reads)
  kCorrupt = 6,          // a file failed validation (checksum, bounds)
  kCuda = 7,             // CUDA runtime error
  kNccl = 8,             // NCCL error
  kMpi = 9,              // MPI error
  kUnsupported = 10,     // feature not built in or not available here
  kInternal = 11,        // a broken invariant inside tutti (a bug)
  kNotFound = 12,        // e.g. no checkpoint to resume from
  kAborted = 13,         // an earlier failure made this object unusable
  kRanksLost = 14,       // peers died (MPI with ULFM): tutti::recover() can go on
};

TUTTI_API const char* error_code_name(ErrorCode code);

class TUTTI_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const noexcept { return code_; }
  // The message without the "[code] " prefix that what() carries.
  const std::string& message() const noexcept { return message_; }

 private:
  ErrorCode code_;
  std::string message_;
};

}  // namespace tutti
