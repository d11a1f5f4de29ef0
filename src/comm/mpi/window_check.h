// The agreement check of a window of operations (comm/op_window.h): the
// NCCL path checks every K-th operation instead of every one, and still
// names the first operation that differed (docs/scale.md, "NCCL path").
//
// Phase 1: one recursive-doubling all-reduce (log_coll.h, ceil(log2 W)
// rounds) of the window's hash and its complement, combined by MAX (all
// ranks agree iff the maxima are a rank's own words), as the per-op check
// (agreement.h) does with one operation's fingerprint.
// Only on a disagreement:
//  2a. an all-reduce (MAX) of every operation's check word and complement
//      (16 bytes per operation of the window): each rank finds the first
//      index where its words are not the maxima;
//  2b. an all-reduce (MIN) of those indexes: the first operation on which
//      some rank differs, the same on every rank;
//  2c. a Bruck all-gather of every rank's descriptor of that operation,
//      so that every rank raises the same kMismatch naming the ranks and
//      their arguments (comm::mismatch_message).
// Windows hold the same sequence numbers on every rank (they close by
// sequence number), so a rank that skipped an operation differs at the
// first one it skipped.  Phase 2 runs on the detail communicator with
// tags from phase 1's post index, as the per-op check does.
#pragma once

#include <mpi.h>

#include <memory>
#include <optional>
#include <vector>

#include "comm/mpi/log_coll.h"
#include "comm/mpi/mpi_runtime.h"
#include "comm/op_window.h"

namespace tutti {
namespace mpi {

class WindowCheck {
 public:
  // Posts phase 1 on `check_comm` (in window order on every rank).
  // `outcome` ends a mismatch message (a string literal).
  WindowCheck(MPI_Comm check_comm, MPI_Comm detail_comm, comm::OpWindowRecord window,
              const char* outcome);
  // A check still in flight is abandoned: its buffers are leaked on purpose
  // (MPI may still write them).
  ~WindowCheck();
  WindowCheck(const WindowCheck&) = delete;
  WindowCheck& operator=(const WindowCheck&) = delete;

  // Progresses without blocking: true once settled and all ranks agree (or
  // this rank rejected one of the window's operations: the caller throws
  // its own error); false while pending.  Throws kMismatch on a
  // disagreement, naming the first operation that differed.
  bool test(const comm::OpLabel& desc, bool* progressed = nullptr);
  // As test(), blocking until settled or `deadline` passes (false).
  bool wait(const Deadline& deadline, const comm::OpLabel& desc,
            StallWatch* stall = nullptr);
  bool settled() const { return phase_ == kSettled; }
  uint64_t first_seq() const { return window_.first_seq; }
  uint64_t last_seq() const { return window_.last_seq; }
  size_t ops() const { return window_.words.size(); }
  // After a disagreement: index into the window of the first operation on
  // which some rank differed (every rank has the same), else -1.
  int64_t first_difference() const { return first_diff_; }

 private:
  enum Phase { kHash, kWords, kIndex, kGather, kSettled };
  // What 2c gathers: the descriptor (pad = rejected) and the window's
  // length (a rank that checked another set of operations).
  struct Record {
    comm::WireDesc wire;
    uint64_t ops = 0;
  };
  static_assert(sizeof(Record) == 40, "Record is exchanged as raw bytes");
  // Element-wise MAX or MIN of uint64 words; a frame of another size
  // poisons this rank's words (all ones under MAX, zero under MIN).
  class WordOps : public FrameOps {
   public:
    explicit WordOps(bool max) : max_(max) {}
    void combine(const void* second, void* first, size_t bytes) const override;
    void size_differs(void* mine, size_t bytes) const override;

   private:
    bool max_;
  };
  std::string range() const;
  void settle_mismatch(const comm::OpLabel& desc);

  MPI_Comm detail_comm_;
  const char* outcome_;
  comm::OpWindowRecord window_;
  uint64_t post_;
  uint64_t hash_;
  Phase phase_ = kHash;
  int64_t first_diff_ = -1;
  WordOps max_{true};
  WordOps min_{false};
  std::optional<RdAllreduce> reduce_;
  std::unique_ptr<BruckAllgather> gather_;
  Record record_;
};

}  // namespace mpi
}  // namespace tutti
