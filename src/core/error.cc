#include "tutti/error.h"

#include <cstring>

#include "core/check.h"
#include "core/runtime_state.h"

namespace tutti {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kMismatch: return "mismatch";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kCommFailure: return "communication failure";
    case ErrorCode::kIo: return "I/O error";
    case ErrorCode::kCorrupt: return "corrupt data";
    case ErrorCode::kCuda: return "CUDA error";
    case ErrorCode::kNccl: return "NCCL error";
    case ErrorCode::kMpi: return "MPI error";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kInternal: return "internal error";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kAborted: return "aborted";
    case ErrorCode::kRanksLost: return "ranks lost";
  }
  return "unknown error";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error("[tutti " + std::string(error_code_name(code)) + "] " +
                         message),
      code_(code),
      message_(message) {}

namespace detail {

std::string rank_prefix() {
  int r = runtime_world_rank();
  if (r < 0) return "";
  return "rank " + std::to_string(r) + ": ";
}

void throw_error(ErrorCode code, const char* file, int line,
                 const std::string& message) {
  std::string msg = rank_prefix() + message;
  // Internal errors are bugs: say where, so the report is actionable.
  if (code == ErrorCode::kInternal) {
    const char* base = std::strrchr(file, '/');
    msg += cat(" (", base ? base + 1 : file, ":", line, ")");
  }
  throw Error(code, msg);
}

Error error_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err;
  } catch (const std::exception& x) {
    return Error(ErrorCode::kInternal, cat(rank_prefix(), x.what()));
  } catch (...) {
    return Error(ErrorCode::kInternal, cat(rank_prefix(), "an unknown exception"));
  }
}

}  // namespace detail
}  // namespace tutti
