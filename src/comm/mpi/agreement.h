// The collective agreement check as a state machine, so that a backend can
// overlap it with the operation (NCCL) or wait for it first (MPI).
//
// Phase 1: one 16-byte MPI_Iallreduce(MAX) of the op's fingerprint and its
// complement on a communicator private to the caller; all ranks agree iff
// max(f) == f and max(~f) == ~f.  Phase 2, only on a disagreement: one
// 32-byte-per-rank MPI_Iallgather of the descriptors, so that every rank
// raises the same kMismatch naming the differing ranks.  A rank whose
// arguments failed local validation still takes part (marked invalid), so
// its peers learn at once that it rejected the op.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "comm/mpi/mpi_runtime.h"
#include "comm/op_desc.h"

namespace tutti {
namespace mpi {

class AgreementCheck {
 public:
  // Posts phase 1 on `check_comm`.  Phase 2 runs on `detail_comm` (the same
  // communicator when one thread drives the checks in order; a separate one
  // when phase 2 may run on another thread than the one posting phase 1).
  // `outcome` ends a mismatch message ("no rank ran it": the caller runs
  // the op only after the check; a string literal).
  // `serve_joined`: ranks inside join() (comm::kJoinKind descriptors) may
  // take part in this op (comm::join_verdict): a servable op counts as
  // agreed, any other one is kMismatch naming the joined ranks.  Only where
  // the op runs after the check (the MPI backend); without it a join
  // descriptor is an ordinary mismatch.  A check posted with join_wire()
  // never throws kMismatch: the join loop reads gathered() instead.
  AgreementCheck(MPI_Comm check_comm, MPI_Comm detail_comm,
                 const comm::WireDesc& wire, bool locally_invalid,
                 const char* outcome = "no rank ran it",
                 bool serve_joined = false);
  // A check still pending is abandoned: its buffers are leaked on purpose
  // (MPI may still write them; a collective request cannot be freed).
  ~AgreementCheck();
  AgreementCheck(const AgreementCheck&) = delete;
  AgreementCheck& operator=(const AgreementCheck&) = delete;

  // Progresses the check without blocking: true once it is settled and all
  // ranks agree (or this rank is the invalid one: the caller throws its own
  // error); false while pending.  Throws kMismatch on a disagreement.
  bool test(const comm::OpLabel& desc);
  // As test(), blocking until settled or `deadline` passes (false).
  bool wait(const Deadline& deadline, const comm::OpLabel& desc,
            StallWatch* stall = nullptr);
  bool settled() const { return phase_ == kSettled; }
  // Every rank's descriptor (index = rank) once settled after phase 2;
  // null when phase 1 agreed.
  const std::vector<comm::WireDesc>* gathered() const {
    return phase_ == kSettled && !b_->all.empty() ? &b_->all : nullptr;
  }

 private:
  enum Phase { kReduce, kGather, kSettled };
  struct Buffers {
    comm::WireDesc wire;
    uint64_t fp[2];
    std::vector<comm::WireDesc> all;
    MPI_Request req = MPI_REQUEST_NULL;
  };
  // Phase 2 finished: throws kMismatch, or returns when this rank is one of
  // the invalid ones.
  void settle_mismatch(const comm::OpLabel& desc);

  MPI_Comm detail_comm_;
  bool locally_invalid_;
  const char* outcome_;
  bool serve_joined_;
  uint64_t f_;
  Phase phase_ = kReduce;
  Buffers* b_;  // owned unless abandoned
};

}  // namespace mpi
}  // namespace tutti
