// The agreement check as the NCCL path runs it: posted without blocking,
// completed by polling test() (the watchdog's job), phase 2 on a second
// communicator.  Rank-distinct descriptors give closed-form verdicts.
#include <gtest/gtest.h>

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/mpi/agreement.h"
#include "tutti/tutti.h"

namespace tutti {
namespace mpi {
namespace {

class Agreement : public ::testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm_dup(MPI_COMM_WORLD, &check);
    MPI_Comm_dup(MPI_COMM_WORLD, &detail);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  void TearDown() override {
    MPI_Comm_free(&check);
    MPI_Comm_free(&detail);
  }
  comm::WireDesc wire(int64_t count, uint64_t seq = 1) {
    comm::WireDesc w;
    w.seq = seq;
    w.count = count;
    w.kind = static_cast<uint8_t>(CollectiveKind::kAllreduce);
    w.dtype = static_cast<uint8_t>(DType::kFloat32);
    return w;
  }
  // Polls like the watchdog until settled; returns "" or the error text.
  std::string poll(AgreementCheck& c, ErrorCode* code = nullptr) {
    const comm::OpLabel desc("allreduce #1 'grad'");
    try {
      for (int i = 0; i < 50000000 && !c.test(desc); ++i) {
      }
      EXPECT_TRUE(c.settled());
      return "";
    } catch (const Error& e) {
      if (code) *code = e.code();
      return e.message();
    }
  }
  MPI_Comm check = MPI_COMM_NULL, detail = MPI_COMM_NULL;
  int rank = 0, size = 1;
};

TEST_F(Agreement, AgreeingRanksSettleWithoutPhaseTwo) {
  // Several checks in flight at once, completed out of order.
  std::unique_ptr<AgreementCheck> a(new AgreementCheck(check, detail, wire(10, 1), false, "x"));
  std::unique_ptr<AgreementCheck> b(new AgreementCheck(check, detail, wire(20, 2), false, "x"));
  EXPECT_EQ(poll(*b), "");
  EXPECT_EQ(poll(*a), "");
}

TEST_F(Agreement, MismatchNamesTheDifferingRankAndTheOutcome) {
  // The last rank has one element more.
  const int64_t n = rank == size - 1 ? 17 : 16;
  AgreementCheck c(check, detail, wire(n), false, "the NCCL communicator was aborted");
  ErrorCode code = ErrorCode::kInternal;
  const std::string m = poll(c, &code);
  EXPECT_EQ(code, ErrorCode::kMismatch) << m;
  EXPECT_NE(m.find("ranks disagree on the operation"), std::string::npos) << m;
  EXPECT_NE(m.find("rank " + std::to_string(size - 1) + " has allreduce #1 float32 x17 sum"),
            std::string::npos) << m;
  EXPECT_NE(m.find("x16"), std::string::npos) << m;
  EXPECT_NE(m.find("; the NCCL communicator was aborted"), std::string::npos) << m;
  // The communicators stay in step: a further check agrees.
  AgreementCheck again(check, detail, wire(5, 2), false);
  EXPECT_EQ(poll(again), "");
}

TEST_F(Agreement, InvalidRankIsNamedAndItselfSettlesQuietly) {
  AgreementCheck c(check, detail, wire(16), rank == 0, "x");
  if (rank == 0) {
    // The invalid rank blocks for the verdict and throws its own error.
    EXPECT_TRUE(c.wait(Deadline(30), comm::OpLabel("allreduce #1")));
  } else {
    ErrorCode code = ErrorCode::kInternal;
    const std::string m = poll(c, &code);
    EXPECT_EQ(code, ErrorCode::kMismatch) << m;
    EXPECT_NE(m.find("rank 0 rejected the arguments of this operation"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace mpi
}  // namespace tutti
