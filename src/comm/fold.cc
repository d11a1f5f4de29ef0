#include "comm/fold.h"

#include <cstring>

#include "core/cpu_reduce.h"

namespace tutti {
namespace comm {

uint64_t check_word(const WireDesc& w, bool locally_invalid) {
  uint64_t f = fingerprint(w) ^ (locally_invalid ? 0x5a5aull : 0);
  if (f == 0 || f == kPoisonWord) f = 1;
  return f;
}

FoldPlan fold_plan(const OpRequest& r, int rank, int size, size_t limit) {
  FoldPlan p;
  const Tensor& in = r.input;
  const Tensor& out = r.output;
  switch (r.kind) {
    case CollectiveKind::kAllreduce:
    case CollectiveKind::kReduceScatter:
      p.combine = FoldCombine::kReduce;
      p.dtype = in.dtype();
      p.op = r.op;
      p.bytes = p.src_bytes = in.nbytes();
      p.src = in.data();
      p.folds = p.bytes <= limit ||
                (r.kind == CollectiveKind::kAllreduce && in.numel() < size);
      return p;
    case CollectiveKind::kBroadcast:
      p.bytes = in.nbytes();
      if (rank == r.root) {
        p.src = in.data();
        p.src_bytes = in.nbytes();
      }
      break;
    case CollectiveKind::kAllgather:
      p.bytes = out.nbytes();
      p.src = in.data();
      p.src_bytes = in.nbytes();
      p.offset = static_cast<size_t>(rank) * in.nbytes();
      break;
    case CollectiveKind::kAllgatherv: {
      int64_t before = 0;
      for (int i = 0; i < rank; ++i) before += r.counts[static_cast<size_t>(i)];
      p.bytes = out.nbytes();
      p.src = in.data();
      p.src_bytes = in.nbytes();
      p.offset = static_cast<size_t>(before) * out.element_size();
      break;
    }
    case CollectiveKind::kBarrier:
      break;
    case CollectiveKind::kAlltoall:
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv:
      return p;
  }
  p.folds = p.bytes <= limit;
  return p;
}

void fill_payload(const FoldPlan& plan, void* payload) {
  char* dst = static_cast<char*>(payload);
  if (plan.combine == FoldCombine::kBitwiseOr) {
    std::memset(dst, 0, plan.offset);
    const size_t tail = plan.offset + plan.src_bytes;
    std::memset(dst + tail, 0, plan.bytes - tail);
  }
  if (plan.src_bytes) std::memcpy(dst + plan.offset, plan.src, plan.src_bytes);
}

void unfold(const OpRequest& r, const FoldPlan& plan, int rank, int size,
            const void* payload) {
  const char* src = static_cast<const char*>(payload);
  switch (r.kind) {
    case CollectiveKind::kAllreduce:
      if (plan.bytes) std::memcpy(r.output.data(), src, plan.bytes);
      if (r.op == ReduceOp::kAvg)
        divide_inplace(r.output.dtype(), r.output.data(),
                       static_cast<size_t>(r.output.numel()), size);
      return;
    case CollectiveKind::kReduceScatter: {
      const size_t block = r.output.nbytes();
      if (block) std::memcpy(r.output.data(), src + block * static_cast<size_t>(rank), block);
      if (r.op == ReduceOp::kAvg)
        divide_inplace(r.output.dtype(), r.output.data(),
                       static_cast<size_t>(r.output.numel()), size);
      return;
    }
    case CollectiveKind::kBroadcast:
      if (rank != r.root && plan.bytes) std::memcpy(r.input.data(), src, plan.bytes);
      return;
    case CollectiveKind::kAllgather:
    case CollectiveKind::kAllgatherv:
      if (plan.bytes) std::memcpy(r.output.data(), src, plan.bytes);
      return;
    default:
      return;
  }
}

}  // namespace comm
}  // namespace tutti
