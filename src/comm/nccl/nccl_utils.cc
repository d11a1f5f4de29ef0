#include "comm/nccl/nccl_utils.h"

#if TUTTI_WITH_NCCL
#include "comm/backoff.h"
#include "tutti/log.h"

namespace tutti {
namespace nccl {

void check_p2p(const OpRequest& r, int rank, const std::string& desc) {
  if (r.kind != CollectiveKind::kSend && r.kind != CollectiveKind::kRecv) return;
  TUTTI_ARG_CHECK(r.tag == 0, desc, ": tag ", r.tag, " on an NCCL communicator, which "
                  "matches a peer's sends and receives in the order they are posted and "
                  "carries no tag; post them in the same order on both ranks with tag 0, "
                  "or use host tensors (the MPI backend) for tagged messages");
  TUTTI_ARG_CHECK(r.root != rank, desc, ": a ", r.kind == CollectiveKind::kSend ? "send to" : "receive from",
                  " this rank itself (", rank, ") on an NCCL communicator would wait "
                  "forever (one stream: the send waits for the receive queued behind "
                  "it); copy the tensor instead");
}

std::string result_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += detail::cat(" (", last, ")");
  return s;
}

bool nccl_ok(ncclResult_t r, const char* expr, const std::string& context) {
  if (r == ncclSuccess) return true;
  TUTTI_LOG(kWarn) << detail::call_failed(expr, context, result_text(r, nullptr));
  return false;
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat64: return ncclFloat64;
    case DType::kInt8: return ncclInt8;
    case DType::kUInt8: return ncclUint8;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
  }
  TUTTI_THROW(kInternal, "no NCCL type for dtype ", static_cast<int>(d));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProd: return ncclProd;
  }
  TUTTI_THROW(kInternal, "no NCCL op for ", reduce_op_name(op));
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

ncclResult_t await(ncclComm_t comm, ncclResult_t rc,
                   const mpi::Deadline& deadline) {
  return await([comm](ncclResult_t* state) {
    return ncclCommGetAsyncError(comm, state);
  }, rc, deadline);
}

ncclResult_t await(const std::function<ncclResult_t(ncclResult_t*)>& query,
                   ncclResult_t rc, const mpi::Deadline& deadline) {
  // Enqueues settle within microseconds (the spinning polls); init and
  // split wait for every rank, and back off to sleeps like the MPI waits.
  comm::Backoff backoff = comm::Backoff::from_settings();
  while (rc == ncclInProgress) {
    const comm::Backoff::Step step = backoff.next(comm::Backoff::Clock::now());
    if (step.check_clock && deadline.expired()) return ncclInProgress;
    comm::Backoff::pause(step);
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = query(&state);
    if (q != ncclSuccess) return q;
    rc = state;
  }
  return rc;
}

}  // namespace nccl
}  // namespace tutti
#endif  // TUTTI_WITH_NCCL
