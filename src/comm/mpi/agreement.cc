#include "comm/mpi/agreement.h"

#include <string>

namespace tutti {
namespace mpi {

AgreementCheck::AgreementCheck(MPI_Comm check_comm, MPI_Comm detail_comm,
                               const comm::WireDesc& wire, bool locally_invalid,
                               const char* outcome, bool serve_joined)
    : detail_comm_(detail_comm), locally_invalid_(locally_invalid),
      outcome_(outcome), serve_joined_(serve_joined),
      b_(new Buffers()) {
  b_->wire = wire;
  b_->wire.pad = locally_invalid ? 1 : 0;
  f_ = comm::fingerprint(b_->wire) ^ (locally_invalid ? 0x5a5aull : 0);
  b_->fp[0] = f_;
  b_->fp[1] = ~f_;
  const int rc = MPI_Iallreduce(MPI_IN_PLACE, b_->fp, 2, MPI_UINT64_T, MPI_MAX,
                                check_comm, &b_->req);
  if (rc != MPI_SUCCESS) {
    delete b_;
    throw_mpi_error(rc, "MPI_Iallreduce",
                    detail::cat("agreement check of ", comm::describe_wire(wire)),
                    __FILE__, __LINE__);
  }
}

AgreementCheck::~AgreementCheck() {
  if (b_->req == MPI_REQUEST_NULL || !is_initialized())
    delete b_;
  // else: abandoned with MPI still owning the buffers.
}

bool AgreementCheck::test(const comm::OpLabel& desc) {
  if (phase_ == kSettled) return true;
  int flag = 0;
  TUTTI_MPI_CHECK(MPI_Test(&b_->req, &flag, MPI_STATUS_IGNORE), desc,
                  " (agreement check)");
  if (!flag) return false;
  if (phase_ == kReduce) {
    if (b_->fp[0] == f_ && b_->fp[1] == ~f_) {
      phase_ = kSettled;
      return true;
    }
    int size = 0;
    TUTTI_MPI_CHECK(MPI_Comm_size(detail_comm_, &size), desc, " (agreement check)");
    b_->all.resize(static_cast<size_t>(size));
    phase_ = kGather;
    TUTTI_MPI_CHECK(MPI_Iallgather(&b_->wire, sizeof(comm::WireDesc), MPI_BYTE,
                                   b_->all.data(), sizeof(comm::WireDesc),
                                   MPI_BYTE, detail_comm_, &b_->req),
                    desc, " (agreement check, naming the differing ranks)");
    return test(desc);
  }
  phase_ = kSettled;
  settle_mismatch(desc);
  return true;
}

void AgreementCheck::settle_mismatch(const comm::OpLabel& desc) {
  if (b_->wire.kind == comm::kJoinKind) return;  // the join loop decides
  std::vector<int> invalid;
  for (size_t i = 0; i < b_->all.size(); ++i)
    if (b_->all[i].pad) invalid.push_back(static_cast<int>(i));
  if (!invalid.empty()) {
    if (locally_invalid_) return;  // the caller throws its own, precise error
    std::string who;
    for (size_t i = 0; i < invalid.size(); ++i)
      who += (i ? ", " : "") + std::to_string(invalid[i]);
    TUTTI_THROW(kMismatch, desc, ": rank", invalid.size() > 1 ? "s " : " ", who,
                " rejected the arguments of this operation (see the error on ",
                invalid.size() > 1 ? "those ranks" : "that rank",
                "); ", outcome_);
  }
  if (serve_joined_) {
    // The same verdict the joined ranks reach from the same descriptors.
    const comm::JoinVerdict join = comm::join_verdict(b_->all);
    if (join.any_joined && join.runners_agree) {
      if (join.servable) return;  // the joined ranks take part
      TUTTI_THROW(kMismatch, desc, ": rank", join.joined.find(',') ==
                  std::string::npos ? " " : "s ", join.joined,
                  " called join() (out of data) and cannot take part: ",
                  join.refusal, "; ", outcome_);
    }
  }
  for (auto& d : b_->all) d.pad = 0;
  TUTTI_THROW(kMismatch, desc, ": ranks disagree on the operation: ",
              comm::mismatch_message(b_->all), "; ", outcome_);
}

bool AgreementCheck::wait(const Deadline& deadline, const comm::OpLabel& desc,
                          StallWatch* stall) {
  for (;;) {
    if (test(desc)) return true;
    if (!mpi::wait(&b_->req, deadline, desc, MPI_STATUS_IGNORE, stall))
      return false;
  }
}

}  // namespace mpi
}  // namespace tutti
