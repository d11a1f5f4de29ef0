// The collective agreement check as a state machine, so that a backend can
// overlap it with the operation (NCCL) or wait for it first (MPI).
//
// Phase 1: one recursive-doubling all-reduce (log_coll.h, ceil(log2 W)
// rounds) of a frame on a communicator private to the caller: a 16-byte
// header, the op's fingerprint and its complement combined by MAX (all
// ranks agree iff max(f) == f and max(~f) == ~f), optionally followed by a
// small operation's payload ("folded": comm::FoldPlan), combined by the op
// in the same rounds, so that such an op costs one exchange in all.
// Phase 2, only on a disagreement: a Bruck all-gather (ceil(log2 W)
// rounds) of every rank's descriptor, so that every rank raises the same
// kMismatch naming the differing ranks.  A rank whose arguments failed
// local validation still takes part (marked invalid, header only), so its
// peers learn at once that it rejected the op.  A frame of another size
// than a rank's own (an op folded on one rank and not on another) sets that
// rank's header to all ones, which MAX spreads to every rank: a mismatch,
// never a truncated or misread payload.
#pragma once

#include <mpi.h>

#include <memory>
#include <optional>
#include <vector>

#include "comm/mpi/log_coll.h"
#include "comm/mpi/mpi_runtime.h"
#include "comm/fold.h"
#include "comm/op_desc.h"

namespace tutti {
namespace mpi {

class AgreementCheck {
 public:
  // Posts phase 1 on `check_comm`.  Phase 2 runs on `detail_comm` (the same
  // communicator when one thread drives the checks in order; a separate one
  // when phase 2 may run on another thread than the one posting phase 1;
  // both match by tags from phase 1's post index, whatever the order in
  // which threads advance several checks).
  // `outcome` ends a mismatch message ("no rank ran it": the caller runs
  // the op only after the check; a string literal).
  // `serve_joined`: ranks inside join() (comm::kJoinKind descriptors) may
  // take part in this op (comm::join_verdict): a servable op counts as
  // agreed (but not folded: every rank then runs it unfolded), any other
  // one is kMismatch naming the joined ranks.  Only where the op runs after
  // the check (the MPI backend); without it a join descriptor is an
  // ordinary mismatch.  A check posted with join_wire() never throws
  // kMismatch: the join loop reads gathered() instead.
  // `fold`: the op rides in the frame (its payload is this rank's
  // contribution, copied now; `fold_capacity` bytes bound a peer's payload
  // that is received, usually TUTTI_MPI_FOLD_BYTES).  `compare`: false
  // skips the fingerprint comparison (TUTTI_CHECK_COLLECTIVES=0 with a
  // folded op): the exchange then only carries the payload, and a frame
  // of another size is still kMismatch ("ranks passed different sizes").
  // `scratch`: the frames' buffers (RdAllreduce), for a caller that runs
  // one check at a time; null: pool blocks.
  AgreementCheck(MPI_Comm check_comm, MPI_Comm detail_comm,
                 const comm::WireDesc& wire, bool locally_invalid,
                 const char* outcome = "no rank ran it",
                 bool serve_joined = false,
                 const comm::FoldPlan* fold = nullptr,
                 size_t fold_capacity = 0, bool compare = true,
                 FrameScratch* scratch = nullptr);
  // A check still in flight is abandoned: its buffers are leaked on purpose
  // (MPI may still write them).
  ~AgreementCheck();
  AgreementCheck(const AgreementCheck&) = delete;
  AgreementCheck& operator=(const AgreementCheck&) = delete;

  // Progresses the check without blocking: true once it is settled and all
  // ranks agree (or this rank is the invalid one: the caller throws its own
  // error); false while pending.  Throws kMismatch on a disagreement.
  // *progressed is set when a round completed.
  bool test(const comm::OpLabel& desc, bool* progressed = nullptr);
  // As test(), blocking until settled or `deadline` passes (false).  Backs
  // off like mpi::wait(), starting over at each round that completes.
  bool wait(const Deadline& deadline, const comm::OpLabel& desc,
            StallWatch* stall = nullptr);
  bool settled() const { return phase_ == kSettled; }
  // Every rank's descriptor (index = rank) once settled after phase 2;
  // null when phase 1 agreed.
  const std::vector<comm::WireDesc>* gathered() const {
    return phase_ == kSettled && !all_.empty() ? &all_ : nullptr;
  }
  // Settled in phase 1 with a fold: payload() holds the op's result.
  bool folded() const { return phase_ == kSettled && all_.empty() && fold_; }
  const void* payload() const;

 private:
  enum Phase { kReduce, kGather, kSettled };
  // What phase 2 gathers: the descriptor and the frame's size.
  struct Record {
    comm::WireDesc wire;
    uint64_t frame_bytes = 0;
  };
  static_assert(sizeof(Record) == 40, "Record is exchanged as raw bytes");
  // The frame's combine: MAX on the header, the fold's op on the payload.
  class Ops : public FrameOps {
   public:
    explicit Ops(const comm::FoldPlan* fold);
    void combine(const void* second, void* first, size_t bytes) const override;
    void size_differs(void* mine, size_t bytes) const override;

   private:
    comm::FoldCombine combine_ = comm::FoldCombine::kBitwiseOr;
    DType dtype_ = DType::kUInt8;
    ReduceOp op_ = ReduceOp::kSum;
  };
  // Phase 2 finished: throws kMismatch, or returns when this rank is one of
  // the invalid ones or the op is served to joined ranks.
  void settle_mismatch(const comm::OpLabel& desc);

  MPI_Comm detail_comm_;
  bool locally_invalid_;
  const char* outcome_;
  bool serve_joined_;
  bool fold_;
  bool compare_;
  uint64_t post_;
  uint64_t f_;
  Record record_;
  Phase phase_ = kReduce;
  Ops ops_;
  std::optional<RdAllreduce> reduce_;  // in place: no allocation per op
  std::unique_ptr<BruckAllgather> gather_;
  std::vector<comm::WireDesc> all_;
  std::vector<uint64_t> frame_bytes_;
};

}  // namespace mpi
}  // namespace tutti
