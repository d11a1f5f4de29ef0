// Small operations folded into the agreement check's frame (issue 29;
// docs/communication.md, "Agreement checks"): the frame's header, and how
// each collective's payload is laid out, combined and read back so that
// the check and the data take one recursive-doubling exchange together
// (mpi/agreement.h, mpi/log_coll.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/op_desc.h"

namespace tutti {
namespace comm {

// The agreement check's frame (docs/communication.md, "Agreement checks"):
// a 16-byte header, this rank's fingerprint and its complement, combined by
// MAX over the ranks (all agree iff the maxima are the rank's own words),
// then optionally an operation's payload combined in the same exchange.
struct CheckHeader {
  uint64_t f = 0;
  uint64_t not_f = 0;
};
static_assert(sizeof(CheckHeader) == 16, "the header is exchanged as raw bytes");
// Both words all ones: a peer's frame had another size than this rank's.
// MAX keeps it, so every rank sees a disagreement (no fingerprint is all
// ones: check_word() avoids it).
constexpr uint64_t kPoisonWord = ~uint64_t{0};
// The header word of a descriptor: its fingerprint, marked when the rank
// rejected the op's arguments, never 0 or all ones.
uint64_t check_word(const WireDesc& w, bool locally_invalid);

// How an operation rides in the frame after the header ("folds"), so that
// the check and the data take one ceil(log2 W)-round exchange together.
enum class FoldCombine : uint8_t {
  kReduce,     // element-wise reduce_inplace(dtype, op): all-reduce, reduce-scatter
  kBitwiseOr,  // each rank's bytes at its offset, zero elsewhere: broadcast
               // (only the root contributes), all-gather(v), barrier (none)
};
struct FoldPlan {
  bool folds = false;
  FoldCombine combine = FoldCombine::kBitwiseOr;
  DType dtype = DType::kUInt8;  // kReduce
  ReduceOp op = ReduceOp::kSum;  // kReduce (kAvg sums; unfold() divides)
  size_t bytes = 0;             // payload size, the same on every rank that agrees
  const void* src = nullptr;    // this rank's contribution ...
  size_t src_bytes = 0;
  size_t offset = 0;            // ... at payload[offset]; the rest is zero
};
// The plan for a request that passed validate(): folds when the payload is
// at most `limit` bytes (an all-reduce also when it has fewer elements than
// ranks: latency-bound whatever its size); alltoall, send and recv never.
FoldPlan fold_plan(const OpRequest& r, int rank, int size, size_t limit);
// Writes a folded op's result from `payload` where the op puts it (the
// output; broadcast: the tensor on non-roots), dividing for kAvg.
void unfold(const OpRequest& r, const FoldPlan& plan, int rank, int size,
            const void* payload);
// Fills `payload` (plan.bytes) with this rank's contribution.
void fill_payload(const FoldPlan& plan, void* payload);

}  // namespace comm
}  // namespace tutti
