// What ranks agree on before a collective, and the request validation that
// every backend shares.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "tutti/comm.h"

namespace tutti {
namespace comm {

// Fixed-size form of one operation, exchanged when ranks disagree.
struct WireDesc {
  uint64_t seq = 0;
  int64_t count = 0;   // the element count that must agree (see make_wire)
  uint64_t extra = 0;  // allgatherv: hash of the per-rank counts
  int32_t root = 0;
  uint8_t kind = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t pad = 0;
};
static_assert(sizeof(WireDesc) == 32, "WireDesc is exchanged as raw bytes");

// Internal kinds of WireDesc (communicator splits), above every
// CollectiveKind: a split of one rank against a node split of another is a
// mismatch.
constexpr uint8_t kSplitKind = 200;
constexpr uint8_t kSplitSharedKind = 201;
// A rank inside join() (docs/communication.md, "Uneven inputs"): seq 0 and
// every other field fixed, so that all joined ranks have one fingerprint
// and a group where every rank joined agrees in phase 1.
constexpr uint8_t kJoinKind = 202;
WireDesc join_wire();

// What joined ranks do with the operation the other ranks run, decided
// from every rank's descriptor (index = rank) by this one function on
// running and joined ranks alike, so that they always take the same
// decision.
struct JoinVerdict {
  bool any_joined = false;  // some rank is in join()
  bool servable = false;    // the joined ranks take part with the identity
  int runner = -1;          // a running rank (its descriptor is the op)
  bool runners_agree = false;  // every running rank is valid, same op
  std::string joined;       // "1, 3": the joined ranks, for messages
  std::string refusal;      // why not servable (empty when servable)
};
// Servable: at least one rank joined, every other rank is valid and has the
// same descriptor, and the op is an all-reduce (any reduce op), a barrier,
// or a broadcast whose root has not joined.
JoinVerdict join_verdict(const std::vector<WireDesc>& all);
// Fills `n` elements of `dtype` at `data` with the identity of `op`: 0 for
// sum/avg, 1 for prod, +inf (the dtype's largest integer) for min, -inf (the
// lowest) for max.
void fill_identity(DType dtype, ReduceOp op, void* data, int64_t n);

WireDesc make_wire(const OpRequest& r, uint64_t seq);
// A 64-bit hash of every field (seq included).
uint64_t fingerprint(const WireDesc& w);
// "float32 x1024 sum" (the parts that must agree for this kind).
std::string describe_wire(const WireDesc& w);
// "allreduce #42 'layer3.weight' float32[1024] sum on group 'world'"
std::string describe(const OpRequest& r, uint64_t seq, const std::string& group);

// An operation's description, formatted only when someone prints it (error
// messages), so the hot path does not build strings.  Streams with <<.
class OpLabel {
 public:
  OpLabel(const OpRequest& r, uint64_t seq, const std::string& group)
      : request_(&r), seq_(seq), group_(&group) {}
  explicit OpLabel(std::string text) : text_(std::move(text)) {}
  std::string str() const {
    return request_ ? describe(*request_, seq_, *group_) : text_;
  }

 private:
  const OpRequest* request_ = nullptr;
  uint64_t seq_ = 0;
  const std::string* group_ = nullptr;
  std::string text_;
};
std::ostream& operator<<(std::ostream& os, const OpLabel& label);

// Checks a request's local consistency (shapes, dtypes, roots, counts,
// overlap); throws Error(kInvalidArgument) naming the op and what was
// expected.
void validate(const OpRequest& r, int rank, int size, const OpLabel& desc);

// Given every rank's descriptor (index = rank), the message for a mismatch:
// "ranks 1, 3 have float16 x1000 sum but rank 0 has float32 x1000 sum".
// Empty if all descriptors agree.
std::string mismatch_message(const std::vector<WireDesc>& all);

// Bytes the operation moves per rank (for statistics and thresholds).
size_t payload_bytes(const OpRequest& r);

}  // namespace comm
}  // namespace tutti
