// The staged device transport (src/comm/staged/) on the CPU: the same
// StagedCommunicator code that serves CUDA tensors, driven through its
// memcpy copier over host tensors, under mpiexec -np 2 and 3.
//  * every op kind x dtype x size against closed-form values and against
//    the plain host communicator (the world's MPI) bit for bit, also on
//    random float values where the reductions round;
//  * async works, send/recv with tags, splits, the staging pool (it stops
//    allocating once warm);
//  * errors: counts that differ across ranks are the host path's kMismatch
//    naming the op; a bad argument on one rank names the rank, the tensor
//    and what was expected there, and its peers learn that it rejected the
//    op; a failing copy makes the communicator unusable (kAborted); a
//    closed communicator refuses ops;
//  * TUTTI_DEVICE_TRANSPORT: the collective decision as a pure function of
//    the ranks' votes, and the setting's parsing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "comm/device_transport.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/staged/copier.h"
#include "comm/staged/staged_communicator.h"
#include "common/test_util.h"
#include "tutti/config.h"

namespace tutti {
namespace {

using test::Buffer;
using test::expect_contains;
using test::expect_error;
using test::rank_value;
using staged::StagedCommunicator;

std::shared_ptr<mpi::MpiCommunicator> world_mpi() {
  return std::dynamic_pointer_cast<mpi::MpiCommunicator>(world()->cpu_communicator());
}

// Collective: a staged communicator over the world's MPI communicator whose
// "device" tensors are host tensors.
std::shared_ptr<StagedCommunicator> make_staged(
    std::unique_ptr<staged::Copier> copier = std::make_unique<staged::MemcpyCopier>()) {
  return StagedCommunicator::create(world_mpi(), std::move(copier), "world-staged");
}

// The value rank r stores at i, after rounding into the dtype.
double stored(DType d, double v) {
  unsigned char b[8];
  store_from_double(b, d, 0, v);
  return load_as_double(b, d, 0);
}

double prod_value(int r, int64_t i) { return static_cast<double>((i + r) % 5) - 2.0; }

double input_value(ReduceOp op, int r, int64_t i) {
  return op == ReduceOp::kProd ? prod_value(r, i) : rank_value(r, i);
}

// The reduction over `n` ranks of their inputs at element i, in double
// (exact for these small integers), rounded as tutti rounds an average.
double reduced(DType d, ReduceOp op, int n, int64_t i) {
  double acc = stored(d, input_value(op, 0, i));
  for (int r = 1; r < n; ++r) {
    const double v = stored(d, input_value(op, r, i));
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
    }
  }
  if (op == ReduceOp::kAvg) {
    if (!dtype_is_floating(d))
      acc = std::trunc(acc / n);
    else if (d == DType::kFloat64)
      acc = acc / n;
    else
      acc = static_cast<double>(static_cast<float>(acc) / static_cast<float>(n));
  }
  return stored(d, acc);
}

::testing::AssertionResult same_bits(const Buffer& staged, const Buffer& host) {
  if (staged.bytes == host.bytes) return ::testing::AssertionSuccess();
  for (size_t i = 0; i < staged.bytes.size(); ++i)
    if (staged.bytes[i] != host.bytes[i])
      return ::testing::AssertionFailure()
             << "staged and host results differ at byte " << i << " (element "
             << i / dtype_size(staged.dtype) << ": " << staged.get(i / dtype_size(staged.dtype))
             << " vs " << host.get(i / dtype_size(host.dtype)) << ")";
  return ::testing::AssertionFailure() << "sizes differ";
}

const DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                         DType::kInt8,    DType::kUInt8,   DType::kInt32,    DType::kInt64};
// Zero, one, odd, and past the eager limits (ragged for 2 and 3 ranks).
const int64_t kSizes[] = {0, 1, 7, 1000, (1 << 16) + 3};

class StagedOps : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {
 protected:
  DType dtype() const { return std::get<0>(GetParam()); }
  int64_t n() const { return std::get<1>(GetParam()); }
  ProcessGroupPtr w = world();
  int rank = w->rank();
  int size = w->size();
  std::shared_ptr<StagedCommunicator> s = make_staged();
};

TEST_P(StagedOps, AllreduceEveryOpInPlaceAndOutOfPlace) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                      ReduceOp::kProd}) {
    Buffer in(dtype(), n()), out(dtype(), n()), host_out(dtype(), n());
    in.fill([&](int64_t i) { return input_value(op, rank, i); });
    const Buffer original = in;
    s->allreduce(in.tensor(), out.tensor(), op, {"grad"});
    w->allreduce(in.tensor(), host_out.tensor(), op);
    EXPECT_TRUE(test::matches(out, [&](int64_t i) { return reduced(dtype(), op, size, i); }))
        << reduce_op_name(op) << " out of place";
    EXPECT_TRUE(same_bits(out, host_out)) << reduce_op_name(op) << " out of place";
    EXPECT_EQ(in.bytes, original.bytes) << "the input was written";
    Buffer host_in = in;
    s->allreduce(in.tensor(), op);
    w->allreduce(host_in.tensor(), op);
    EXPECT_TRUE(test::matches(in, [&](int64_t i) { return reduced(dtype(), op, size, i); }))
        << reduce_op_name(op) << " in place";
    EXPECT_TRUE(same_bits(in, host_in)) << reduce_op_name(op) << " in place";
  }
}

TEST_P(StagedOps, BroadcastFromFirstAndLastRank) {
  for (int root : {0, size - 1}) {
    Buffer b(dtype(), n());
    b.fill([&](int64_t i) { return rank_value(rank, i); });
    Buffer host = b;
    s->broadcast(b.tensor(), root);
    w->broadcast(host.tensor(), root);
    EXPECT_TRUE(test::matches(b, [&](int64_t i) { return stored(dtype(), rank_value(root, i)); }))
        << "root " << root;
    EXPECT_TRUE(same_bits(b, host)) << "root " << root;
  }
}

TEST_P(StagedOps, AllgatherAndInPlaceAllgather) {
  const int64_t m = std::max<int64_t>(n(), 1);
  auto expect = [&](int64_t j) { return stored(dtype(), rank_value(static_cast<int>(j / m), j % m)); };
  Buffer in(dtype(), n()), out(dtype(), n() * size), host(dtype(), n() * size);
  in.fill([&](int64_t i) { return rank_value(rank, i); });
  s->allgather(in.tensor(), out.tensor());
  w->allgather(in.tensor(), host.tensor());
  EXPECT_TRUE(test::matches(out, expect));
  EXPECT_TRUE(same_bits(out, host));
  // In place: the input is this rank's block of the output; the other
  // blocks hold a poison the gather must overwrite.
  Buffer inplace(dtype(), n() * size);
  inplace.fill([&](int64_t j) {
    return j / m == rank ? rank_value(rank, j % m) : 99.0;
  });
  Tensor whole = inplace.tensor();
  s->allgather(whole.slice(rank * n(), (rank + 1) * n()), whole);
  EXPECT_TRUE(test::matches(inplace, expect)) << "in place";
}

TEST_P(StagedOps, AllgathervWithUnequalCountsIncludingZero) {
  std::vector<int64_t> counts(static_cast<size_t>(size));
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    counts[static_cast<size_t>(r)] = (n() + r) % 5 + r * (n() > 0 ? 1 : 0);
    total += counts[static_cast<size_t>(r)];
  }
  Buffer in(dtype(), counts[static_cast<size_t>(rank)]), out(dtype(), total), host(dtype(), total);
  in.fill([&](int64_t i) { return rank_value(rank, i); });
  s->allgatherv(in.tensor(), out.tensor(), counts);
  w->allgatherv(in.tensor(), host.tensor(), counts);
  std::vector<double> expect;
  for (int r = 0; r < size; ++r)
    for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i)
      expect.push_back(stored(dtype(), rank_value(r, i)));
  EXPECT_TRUE(test::matches(out, [&](int64_t j) { return expect[static_cast<size_t>(j)]; }));
  EXPECT_TRUE(same_bits(out, host));
}

TEST_P(StagedOps, ReduceScatterSumAndAvg) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    // Rank r's block b element i is rank_value(r, b * n + i).
    Buffer in(dtype(), n() * size), out(dtype(), n()), host(dtype(), n());
    in.fill([&](int64_t j) { return rank_value(rank, j); });
    s->reduce_scatter(in.tensor(), out.tensor(), op);
    w->reduce_scatter(in.tensor(), host.tensor(), op);
    EXPECT_TRUE(test::matches(out, [&](int64_t i) {
      return reduced(dtype(), op, size, rank * n() + i);
    })) << reduce_op_name(op);
    EXPECT_TRUE(same_bits(out, host)) << reduce_op_name(op);
  }
}

TEST_P(StagedOps, Alltoall) {
  // Block j of rank r's input goes to rank j; element i of it is r's
  // rank_value at j * n + i.
  Buffer in(dtype(), n() * size), out(dtype(), n() * size), host(dtype(), n() * size);
  in.fill([&](int64_t j) { return rank_value(rank, j); });
  s->alltoall(in.tensor(), out.tensor());
  w->alltoall(in.tensor(), host.tensor());
  const int64_t m = std::max<int64_t>(n(), 1);
  EXPECT_TRUE(test::matches(out, [&](int64_t j) {
    return stored(dtype(), rank_value(static_cast<int>(j / m), rank * n() + j % m));
  }));
  EXPECT_TRUE(same_bits(out, host));
}

INSTANTIATE_TEST_SUITE_P(DTypesAndSizes, StagedOps,
                         ::testing::Combine(::testing::ValuesIn(kDTypes),
                                            ::testing::ValuesIn(kSizes)));

class Staged : public ::testing::Test {
 protected:
  ProcessGroupPtr w = world();
  int rank = w->rank();
  int size = w->size();
};

// Values that round: the 16-bit sums go through tutti's float32 MPI ops and
// round once, the float32 sums depend on MPI's order of the ranks.  Staged
// and host must agree to the bit all the same.
TEST_F(Staged, RandomFloatReductionsAreTheHostPathsBits) {
  auto s = make_staged();
  std::mt19937 rng(1234 + 77 * rank);
  std::uniform_real_distribution<double> u(-3.0, 3.0);
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProd}) {
      Buffer mine(d, 100003);
      mine.fill([&](int64_t) { return u(rng); });
      Buffer staged_out = mine, host_out = mine;
      s->allreduce(staged_out.tensor(), op);
      w->allreduce(host_out.tensor(), op);
      EXPECT_TRUE(same_bits(staged_out, host_out)) << dtype_name(d) << " " << reduce_op_name(op);
      Buffer rs(d, 1001 * size), rs_staged(d, 1001), rs_host(d, 1001);
      rs.fill([&](int64_t) { return u(rng); });
      s->reduce_scatter(rs.tensor(), rs_staged.tensor(), op);
      w->reduce_scatter(rs.tensor(), rs_host.tensor(), op);
      EXPECT_TRUE(same_bits(rs_staged, rs_host)) << dtype_name(d) << " reduce_scatter";
    }
  }
}

TEST_F(Staged, AsyncOpsCompleteInSubmissionOrderWhateverTheWaitOrder) {
  auto s = make_staged();
  std::vector<Buffer> bufs;
  for (int k = 0; k < 5; ++k) {
    bufs.emplace_back(DType::kInt64, 1000 + k);
    bufs.back().fill([&](int64_t i) { return rank_value(rank, i) + k; });
  }
  std::vector<WorkPtr> works;
  for (int k = 0; k < 4; ++k)
    works.push_back(s->allreduce_async(bufs[static_cast<size_t>(k)].tensor(), ReduceOp::kSum,
                                       {"bucket " + std::to_string(k)}));
  works.push_back(s->broadcast_async(bufs[4].tensor(), size - 1));
  for (size_t k = works.size(); k-- > 0;) works[k]->wait();
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(works[static_cast<size_t>(k)]->test());
    EXPECT_TRUE(test::matches(bufs[static_cast<size_t>(k)], [&](int64_t i) {
      double sum = 0;
      for (int r = 0; r < size; ++r) sum += rank_value(r, i) + k;
      return sum;
    })) << "bucket " << k;
    // Numbered on the communicator in submission order.
    EXPECT_EQ(works[static_cast<size_t>(k)]->seq(), static_cast<uint64_t>(k + 1));
    expect_contains(works[static_cast<size_t>(k)]->description(),
                    "allreduce #" + std::to_string(k + 1) + " 'bucket " + std::to_string(k) + "'");
  }
  works[4]->synchronize();
  EXPECT_TRUE(test::matches(bufs[4], [&](int64_t i) { return rank_value(size - 1, i) + 4; }));
  s->synchronize();
  s->barrier();
}

// A ring: rank r sends to r + 1 and receives from r - 1, twice, with two
// tags posted in opposite orders (tags match, not posting order), the
// receives posted first and completed by wait() or test().
TEST_F(Staged, SendRecvRingWithTags) {
  auto s = make_staged();
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  Buffer a_out(DType::kFloat32, 333), b_out(DType::kFloat32, 17);
  Buffer a_in(DType::kFloat32, 333), b_in(DType::kFloat32, 17);
  a_out.fill([&](int64_t i) { return rank_value(rank, i); });
  b_out.fill([&](int64_t i) { return 100.0 + rank_value(rank, i); });
  WorkPtr rb = s->recv_async(b_in.tensor(), prev, 9);
  WorkPtr ra = s->recv_async(a_in.tensor(), prev, 7);
  WorkPtr sa = s->send_async(a_out.tensor(), next, 7);
  WorkPtr sb = s->send_async(b_out.tensor(), next, 9);
  ra->wait();
  while (!rb->test()) {
  }
  sa->wait();
  sb->synchronize();
  EXPECT_TRUE(test::matches(a_in, [&](int64_t i) { return rank_value(prev, i); }));
  EXPECT_TRUE(test::matches(b_in, [&](int64_t i) { return 100.0 + rank_value(prev, i); }));
  // Blocking forms: even ranks send first, odd ones receive first (small
  // messages: a blocking send completes before its receive is posted).
  Buffer c(DType::kInt32, 5);
  c.fill([&](int64_t i) { return rank * 10.0 + i; });
  Buffer got(DType::kInt32, 5);
  if (rank % 2 == 0) {
    s->send(c.tensor(), next, 3);
    s->recv(got.tensor(), prev, 3);
  } else {
    s->recv(got.tensor(), prev, 3);
    s->send(c.tensor(), next, 3);
  }
  EXPECT_TRUE(test::matches(got, [&](int64_t i) { return prev * 10.0 + i; }));
}

TEST_F(Staged, TheStagingPoolStopsAllocatingOnceWarm) {
  auto s = make_staged();
  auto step = [&] {
    Buffer g(DType::kFloat32, 5000), out(DType::kFloat32, 5000 * size);
    g.fill([&](int64_t i) { return rank_value(rank, i); });
    s->allreduce(g.tensor(), ReduceOp::kAvg);
    s->allgather(g.tensor(), out.tensor());
    s->broadcast(g.tensor(), 0);
  };
  step();
  const size_t warm = s->staging_allocations();
  EXPECT_GT(warm, 0u);
  for (int k = 0; k < 5; ++k) step();
  EXPECT_EQ(s->staging_allocations(), warm) << "the pool allocated on the hot path";
}

TEST_F(Staged, SplitsAlongTheParityOfTheRank) {
  auto s = make_staged();
  auto child = s->split_device(rank % 2, rank, nullptr, "world-staged/parity");
  ASSERT_NE(child, nullptr);
  int expect_size = 0, expect_sum = 0;
  for (int r = 0; r < size; ++r)
    if (r % 2 == rank % 2) {
      ++expect_size;
      expect_sum += r;
    }
  EXPECT_EQ(child->size(), expect_size);
  EXPECT_EQ(child->backend(), "staged");
  int32_t v = rank;
  child->allreduce(Tensor::of(&v, 1), ReduceOp::kSum);
  EXPECT_EQ(v, expect_sum);
  // A negative color takes part and gets nothing.
  auto only_rank0 = s->split_device(rank == 0 ? 0 : -1, 0, nullptr, "world-staged/zero");
  EXPECT_EQ(only_rank0 != nullptr, rank == 0);
  // The parent still works after its splits.
  v = 1;
  s->allreduce(Tensor::of(&v, 1), ReduceOp::kSum);
  EXPECT_EQ(v, size);
}

// Ranks that pass different counts get the host path's mismatch, naming
// the op, on every rank; nobody ran it, so the communicator stays usable.
TEST_F(Staged, CountsThatDifferAcrossRanksAreTheHostPathsMismatch) {
  auto s = make_staged();
  Buffer b(DType::kFloat32, rank == 1 ? 17 : 16);
  const std::string m = expect_error(
      [&] { s->allreduce(b.tensor(), ReduceOp::kSum, {"layer3.weight"}); }, ErrorCode::kMismatch);
  expect_contains(m, "rank " + std::to_string(rank) + ": allreduce #1 'layer3.weight'");
  expect_contains(m, "on group 'world-staged': ranks disagree on the operation");
  expect_contains(m, "rank 1 has allreduce #1 float32 x17 sum but rank 0 has allreduce #1 "
                     "float32 x16 sum; no rank ran it");
  Buffer ok(DType::kFloat32, 4);
  ok.fill([&](int64_t) { return 1.0; });
  s->allreduce(ok.tensor(), ReduceOp::kSum);
  EXPECT_TRUE(test::matches(ok, [&](int64_t) { return static_cast<double>(size); }));
}

// A bad argument on the last rank: there, an error naming the rank, the op
// with its number, the tensor and what was expected; on the others, that
// the last rank rejected the op (at once, not at TUTTI_TIMEOUT).
TEST_F(Staged, ABadArgumentNamesRankTensorAndExpectation) {
  auto s = make_staged();
  const int bad = size - 1;
  Buffer in(DType::kFloat32, 4), out(DType::kFloat32, rank == bad ? 3 : 4);
  if (rank == bad) {
    const std::string m = expect_error(
        [&] { s->allreduce(in.tensor(), out.tensor(), ReduceOp::kSum, {"fc.bias"}); },
        ErrorCode::kInvalidArgument);
    expect_contains(m, "rank " + std::to_string(bad) + ": allreduce #1 'fc.bias' float32[4] sum "
                       "on group 'world-staged': output float32[3] cpu has 3 elements, "
                       "expected 4 like the input");
  } else {
    const std::string m = expect_error(
        [&] { s->allreduce(in.tensor(), out.tensor(), ReduceOp::kSum, {"fc.bias"}); },
        ErrorCode::kMismatch);
    expect_contains(m, "allreduce #1 'fc.bias'");
    expect_contains(m, "rank " + std::to_string(bad) + " rejected the arguments of this operation");
  }
  // A tensor on another device than the communicator's: rejected before
  // anything is copied (the pointer is never read).
  float host = 0;
  Tensor elsewhere(&host, DType::kFloat32, Shape{1}, Device::cuda(3));
  Tensor t = rank == bad ? elsewhere : Tensor::of(&host, 1);
  const std::string m =
      expect_error([&] { s->broadcast(t, 0, {"embedding"}); },
                   rank == bad ? ErrorCode::kInvalidArgument : ErrorCode::kMismatch);
  if (rank == bad)
    expect_contains(m, "broadcast #2 'embedding' float32[1] root 0 on group 'world-staged': "
                       "this staged communicator serves cpu, got float32[1] cuda:3");
  else
    expect_contains(m, "rank " + std::to_string(bad) + " rejected the arguments");
  // Still usable.
  int32_t v = 1;
  s->allreduce(Tensor::of(&v, 1), ReduceOp::kSum);
  EXPECT_EQ(v, size);
}

// A copier whose device-to-host copy fails on its `fail_at`-th op (every
// rank alike): the op fails with the copy's error, the communicator is
// unusable afterwards.
class FailingCopier : public staged::Copier {
 public:
  explicit FailingCopier(int fail_at) : fail_at_(fail_at) {}
  Device device() const override { return Device::cpu(); }
  bool pinned() const override { return false; }
  std::unique_ptr<staged::Copier> another() const override {
    return std::make_unique<FailingCopier>(fail_at_);
  }
  std::unique_ptr<staged::OpCopies> begin(void* stream) override {
    ++ops_;
    if (ops_ != fail_at_) return inner_.begin(stream);
    struct Failing : staged::OpCopies {
      void to_host(void*, const void*, size_t) override {
        TUTTI_THROW(kCuda, "device-to-host copy failed (simulated)");
      }
      bool wait_host(double) override { return true; }
      void to_device(void*, const void*, size_t) override {}
      void finish() override {}
      void stream_wait() override {}
      bool done() override { return true; }
    };
    return std::make_unique<Failing>();
  }
  bool quiesce(double) override { return true; }

 private:
  int fail_at_;
  int ops_ = 0;
  staged::MemcpyCopier inner_;
};

TEST_F(Staged, AFailedCopyMakesTheCommunicatorUnusable) {
  auto s = make_staged(std::make_unique<FailingCopier>(2));
  int32_t v = 1;
  s->allreduce(Tensor::of(&v, 1), ReduceOp::kSum);
  EXPECT_EQ(v, size);
  const std::string m =
      expect_error([&] { s->allreduce(Tensor::of(&v, 1), ReduceOp::kSum); }, ErrorCode::kCuda);
  expect_contains(m, "device-to-host copy failed (simulated)");
  EXPECT_TRUE(s->broken());
  const std::string later =
      expect_error([&] { s->allreduce(Tensor::of(&v, 1), ReduceOp::kSum, {"next"}); },
                   ErrorCode::kAborted);
  expect_contains(later, "allreduce #3 'next'");
  expect_contains(later, "the staged communicator 'world-staged' is unusable after an earlier "
                         "failure: ");
  expect_contains(later, "device-to-host copy failed (simulated)");
}

TEST_F(Staged, AClosedCommunicatorRefusesOps) {
  auto s = make_staged();
  s->close();
  s->close();  // idempotent
  int32_t v = 1;
  const std::string m =
      expect_error([&] { s->allreduce(Tensor::of(&v, 1), ReduceOp::kSum); }, ErrorCode::kAborted);
  expect_contains(m, "allreduce on staged communicator 'world-staged': it is closed");
}

// ---- TUTTI_DEVICE_TRANSPORT ------------------------------------------------

comm::TransportVote vote(uint8_t device, uint64_t host, comm::TransportSetting s,
                         bool nccl = true) {
  comm::TransportVote v;
  v.uuid[15] = device;
  v.host = host;
  v.setting = static_cast<uint8_t>(s);
  v.nccl_built = nccl ? 1 : 0;
  return v;
}

TEST(DeviceTransport, AutoTakesNcclUnlessTwoRanksOfAHostShareADevice) {
  using comm::DeviceTransport;
  const auto a = comm::TransportSetting::kAuto;
  std::string why;
  // One device per rank (two hosts, each with devices 0 and 1; the UUIDs
  // differ across hosts in reality, equal here: the host tells them apart).
  EXPECT_EQ(comm::decide_transport({vote(0, 11, a), vote(1, 11, a), vote(0, 22, a), vote(1, 22, a)},
                                   "world", &why),
            DeviceTransport::kNccl);
  // Ranks 1 and 2 share device 1 of host 11.
  EXPECT_EQ(comm::decide_transport({vote(0, 11, a), vote(1, 11, a), vote(1, 11, a)}, "world", &why),
            DeviceTransport::kStaged);
  expect_contains(why, "ranks 1 and 2 of the group share CUDA device "
                       "00000000-0000-0000-0000-000000000001 on one host");
  // A build without NCCL on some rank.
  EXPECT_EQ(comm::decide_transport({vote(0, 11, a), vote(1, 11, a, false)}, "world", &why),
            DeviceTransport::kStaged);
  expect_contains(why, "no NCCL");
  EXPECT_EQ(comm::decide_transport({vote(0, 11, a)}, "world"), DeviceTransport::kNccl);
}

TEST(DeviceTransport, ExplicitSettingsAndSettingsThatDiffer) {
  using comm::DeviceTransport;
  using comm::TransportSetting;
  EXPECT_EQ(comm::decide_transport({vote(0, 1, TransportSetting::kStaged),
                                    vote(1, 1, TransportSetting::kStaged)}, "world"),
            DeviceTransport::kStaged);
  // nccl even where a device is shared: NCCL's own error then says why.
  EXPECT_EQ(comm::decide_transport({vote(0, 1, TransportSetting::kNccl),
                                    vote(0, 1, TransportSetting::kNccl)}, "world"),
            DeviceTransport::kNccl);
  std::string m = expect_error(
      [] {
        comm::decide_transport({vote(0, 1, TransportSetting::kNccl),
                                vote(1, 1, TransportSetting::kNccl, false)}, "tp");
      },
      ErrorCode::kUnsupported);
  expect_contains(m, "TUTTI_DEVICE_TRANSPORT=nccl for group 'tp', but tutti was built without "
                     "NCCL on some rank");
  m = expect_error(
      [] {
        comm::decide_transport({vote(0, 1, TransportSetting::kAuto),
                                vote(1, 1, TransportSetting::kStaged),
                                vote(2, 1, TransportSetting::kAuto)}, "dp");
      },
      ErrorCode::kInvalidArgument);
  expect_contains(m, "TUTTI_DEVICE_TRANSPORT differs across the ranks of group 'dp' (ranks 0, 2 "
                     "have auto; rank 1 has staged)");
}

TEST(DeviceTransport, TheSettingAndItsError) {
  const char* old = std::getenv("TUTTI_DEVICE_TRANSPORT");
  const std::string saved = old ? old : "";
  if (!old) EXPECT_EQ(comm::transport_setting(), comm::TransportSetting::kAuto) << "the default";
  setenv("TUTTI_DEVICE_TRANSPORT", "staged", 1);
  config::reload();
  EXPECT_EQ(comm::transport_setting(), comm::TransportSetting::kStaged);
  setenv("TUTTI_DEVICE_TRANSPORT", "gloo", 1);
  config::reload();
  const std::string m =
      expect_error([] { comm::transport_setting(); }, ErrorCode::kInvalidArgument);
  expect_contains(m, "TUTTI_DEVICE_TRANSPORT='gloo' (expected auto, nccl or staged)");
  if (old)
    setenv("TUTTI_DEVICE_TRANSPORT", saved.c_str(), 1);
  else
    unsetenv("TUTTI_DEVICE_TRANSPORT");
  config::reload();
}

}  // namespace
}  // namespace tutti
