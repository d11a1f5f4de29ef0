// Every collective x dtype x size on the world, each rank with distinct
// inputs and closed-form expected values (run under mpiexec -np 1..4).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "common/test_util.h"

namespace tutti {
namespace {

using test::Buffer;
using test::rank_value;

const DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                         DType::kFloat64, DType::kInt8,    DType::kUInt8,
                         DType::kInt32,   DType::kInt64};
// The largest size is past every transport's eager limit (rendezvous) and
// divides by no rank count of 2-4 (ragged ring chunks), yet small enough
// that the closed-form check over every dtype and op stays quick.
const int64_t kSizes[] = {0, 1, 7, 1000, (1 << 18) + 3};

// The value rank r stores at i, after rounding into the dtype.
double stored(DType d, double v) {
  unsigned char b[8];
  store_from_double(b, d, 0, v);
  return load_as_double(b, d, 0);
}

// Factors for products stay in [-2, 2] so 4-rank products fit every dtype.
double prod_value(int r, int64_t i) {
  return static_cast<double>((i + r) % 5) - 2.0;
}

// Rank r's input for `op` at elements [offset, offset + n), as stored in the
// dtype (one conversion pass).
std::vector<double> inputs(DType d, ReduceOp op, int r, int64_t n, int64_t offset = 0) {
  Buffer b(d, n);
  b.fill([&](int64_t i) {
    return op == ReduceOp::kProd ? prod_value(r, i + offset) : rank_value(r, i + offset);
  });
  return b.values();
}

// The reduction over ranks computed in double, then rounded like tutti
// rounds (sums of these small integers are exact in every dtype; avg divides
// once in the element type's arithmetic).
std::vector<double> expected_reduce(DType d, ReduceOp op, int nranks, int64_t n,
                                    int64_t offset = 0) {
  std::vector<double> acc = inputs(d, op, 0, n, offset);
  for (int r = 1; r < nranks; ++r) {
    const std::vector<double> v = inputs(d, op, r, n, offset);
    for (size_t i = 0; i < acc.size(); ++i) {
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg: acc[i] += v[i]; break;
        case ReduceOp::kProd: acc[i] *= v[i]; break;
        case ReduceOp::kMin: acc[i] = std::min(acc[i], v[i]); break;
        case ReduceOp::kMax: acc[i] = std::max(acc[i], v[i]); break;
      }
    }
  }
  for (double& a : acc) {
    if (op == ReduceOp::kAvg) {
      if (!dtype_is_floating(d))
        a = std::trunc(a / nranks);
      else if (d == DType::kFloat64)
        a = a / nranks;
      else  // float32 division, rounded to the element type once
        a = static_cast<double>(static_cast<float>(a) / static_cast<float>(nranks));
    }
  }
  Buffer rounded(d, n);
  rounded.fill([&](int64_t i) { return acc[static_cast<size_t>(i)]; });
  return rounded.values();
}

class Collectives : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {
 protected:
  DType dtype() const { return std::get<0>(GetParam()); }
  int64_t n() const { return std::get<1>(GetParam()); }
  ProcessGroupPtr w = world();
  int rank = w->rank();
  int size = w->size();
};

TEST_P(Collectives, AllreduceEveryOpInPlaceAndOutOfPlace) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                      ReduceOp::kMax, ReduceOp::kProd}) {
    const std::vector<double> mine = inputs(dtype(), op, rank, n());
    const std::vector<double> expect = expected_reduce(dtype(), op, size, n());
    Buffer in(dtype(), n()), out(dtype(), n());
    in.fill([&](int64_t i) { return mine[i]; });
    w->allreduce(in.tensor(), out.tensor(), op);
    EXPECT_TRUE(test::matches(out, [&](int64_t i) { return expect[i]; }))
        << reduce_op_name(op) << " out-of-place";
    EXPECT_TRUE(test::matches(in, [&](int64_t i) { return mine[i]; })) << "input untouched";
    w->allreduce(in.tensor(), op);
    EXPECT_TRUE(test::matches(in, [&](int64_t i) { return expect[i]; }))
        << reduce_op_name(op) << " in place";
  }
}

TEST_P(Collectives, BroadcastFromFirstAndLastRank) {
  for (int root : {0, size - 1}) {
    Buffer b(dtype(), n());
    b.fill([&](int64_t i) { return stored(dtype(), rank_value(rank, i)); });
    w->broadcast(b.tensor(), root);
    EXPECT_TRUE(test::matches(b, [&](int64_t i) { return stored(dtype(), rank_value(root, i)); }))
        << "root " << root;
  }
}

TEST_P(Collectives, AllgatherAndInPlaceAllgather) {
  Buffer in(dtype(), n()), out(dtype(), n() * size);
  in.fill([&](int64_t i) { return stored(dtype(), rank_value(rank, i)); });
  w->allgather(in.tensor(), out.tensor());
  auto expect = [&](int64_t j) {
    return stored(dtype(), rank_value(static_cast<int>(j / std::max<int64_t>(n(), 1)),
                                      j % std::max<int64_t>(n(), 1)));
  };
  EXPECT_TRUE(test::matches(out, expect));
  // In place: this rank's block of the output is the input.
  Buffer inplace(dtype(), n() * size);
  for (int64_t i = 0; i < n(); ++i)
    inplace.set(rank * n() + i, stored(dtype(), rank_value(rank, i)));
  Tensor whole = inplace.tensor();
  w->allgather(whole.slice(rank * n(), (rank + 1) * n()), whole);
  EXPECT_TRUE(test::matches(inplace, expect));
}

TEST_P(Collectives, AllgathervWithUnequalCounts) {
  // Rank r contributes (n + r) % 5 + r * (n > 0) elements: zero-sized
  // contributions included.
  std::vector<int64_t> counts(size);
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    counts[r] = n() == 0 ? 0 : (n() + r) % 5 + r * (n() / 7);
    total += counts[r];
  }
  Buffer in(dtype(), counts[rank]), out(dtype(), total);
  in.fill([&](int64_t i) { return stored(dtype(), rank_value(rank, i)); });
  w->allgatherv(in.tensor(), out.tensor(), counts);
  std::vector<double> expect;
  for (int r = 0; r < size; ++r)
    for (int64_t i = 0; i < counts[r]; ++i) expect.push_back(stored(dtype(), rank_value(r, i)));
  EXPECT_TRUE(test::matches(out, [&](int64_t j) { return expect[j]; }));
}

TEST_P(Collectives, ReduceScatterEveryOp) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                      ReduceOp::kMax, ReduceOp::kProd}) {
    // Rank r receives the reduction of block r: only that block's expected
    // values are needed here.
    const std::vector<double> expect = expected_reduce(dtype(), op, size, n(), rank * n());
    Buffer in(dtype(), n() * size), out(dtype(), n());
    in.fill([&](int64_t j) { return op == ReduceOp::kProd ? prod_value(rank, j) : rank_value(rank, j); });
    w->reduce_scatter(in.tensor(), out.tensor(), op);
    EXPECT_TRUE(test::matches(out, [&](int64_t i) { return expect[i]; })) << reduce_op_name(op);
  }
}

TEST_P(Collectives, Alltoall) {
  // Block j of rank r's input holds rank_value(r, j * k + i); rank r
  // receives block r from every rank.
  const int64_t k = n() / std::max(size, 1);
  Buffer in(dtype(), k * size), out(dtype(), k * size);
  in.fill([&](int64_t j) { return stored(dtype(), rank_value(rank, j)); });
  w->alltoall(in.tensor(), out.tensor());
  EXPECT_TRUE(test::matches(out, [&](int64_t j) {
    const int src = static_cast<int>(j / std::max<int64_t>(k, 1));
    return stored(dtype(), rank_value(src, rank * k + j % std::max<int64_t>(k, 1)));
  }));
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<DType, int64_t>>& p) {
  return std::string(dtype_name(std::get<0>(p.param))) + "_n" + std::to_string(std::get<1>(p.param));
}

INSTANTIATE_TEST_SUITE_P(AllDTypesAndSizes, Collectives,
                         ::testing::Combine(::testing::ValuesIn(kDTypes), ::testing::ValuesIn(kSizes)),
                         param_name);

TEST(CollectivesAsync, ManyInFlightCompleteInOrder) {
  auto w = world();
  const int rank = w->rank(), size = w->size();
  constexpr int kOps = 16;
  std::vector<Buffer> bufs;
  for (int k = 0; k < kOps; ++k) {
    bufs.emplace_back(DType::kFloat32, 1000 + k);
    bufs.back().fill([&](int64_t i) { return rank_value(rank, i) + k; });
  }
  std::vector<WorkPtr> works;
  for (int k = 0; k < kOps; ++k) works.push_back(w->allreduce_async(bufs[k].tensor(), ReduceOp::kSum));
  WorkPtr barrier = w->barrier_async();
  for (int k = kOps - 1; k >= 0; --k) works[k]->wait();  // any wait order
  barrier->wait();
  for (int k = 0; k < kOps; ++k) {
    EXPECT_TRUE(works[k]->test());
    EXPECT_GT(works[k]->seq(), 0u);
    EXPECT_TRUE(test::matches(bufs[k], [&](int64_t i) {
      double s = 0;
      for (int r = 0; r < size; ++r) s += rank_value(r, i) + k;
      return s;
    }));
  }
  EXPECT_LT(works[0]->seq(), works[kOps - 1]->seq()) << "sequence numbers follow submission";
  EXPECT_NE(works[3]->description().find("allreduce #"), std::string::npos);
}

TEST(SubGroups, SplitByParityAndNested) {
  auto w = world();
  const int rank = w->rank(), size = w->size();
  auto g = w->split_group(rank % 2, rank, "parity");
  ASSERT_TRUE(g);
  std::vector<int> members;
  for (int r = rank % 2; r < size; r += 2) members.push_back(r);
  EXPECT_EQ(g->size(), static_cast<int>(members.size()));
  EXPECT_EQ(g->world_rank(g->rank()), rank);
  Buffer b(DType::kInt64, 33);
  b.fill([&](int64_t i) { return rank_value(rank, i); });
  g->allreduce(b.tensor(), ReduceOp::kSum);
  EXPECT_TRUE(test::matches(b, [&](int64_t i) {
    double s = 0;
    for (int r : members) s += rank_value(r, i);
    return s;
  }));
  // Reverse order by key.
  auto rev = w->split_group(0, size - rank, "reversed");
  EXPECT_EQ(rev->rank(), size - 1 - rank);
  // A rank opting out gets nullptr; the others still form a group.
  auto most = w->split_group(rank == 0 ? -1 : 1, rank, "no-zero");
  if (rank == 0) {
    EXPECT_EQ(most, nullptr);
  } else {
    ASSERT_TRUE(most);
    EXPECT_EQ(most->size(), size - 1);
    int32_t one = 1;
    most->allreduce(Tensor::of(&one, 1));
    EXPECT_EQ(one, size - 1);
  }
  // The world is still in step after the splits.
  int32_t x = 1;
  w->allreduce(Tensor::of(&x, 1));
  EXPECT_EQ(x, size);
}

TEST(SubGroups, NodeAndCrossNodeGroups) {
  auto w = world();
  auto node = w->node_group();
  EXPECT_EQ(node->size(), local_size()) << "one host: the node is the world";
  EXPECT_EQ(node->rank(), local_rank());
  auto cross = w->cross_node_group();
  EXPECT_EQ(cross->size(), w->size() / node->size());
}

TEST(PointToPoint, RingExchange) {
  auto w = world();
  const int rank = w->rank(), size = w->size();
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{100000}}) {
    Buffer out(DType::kFloat32, n), in(DType::kFloat32, n);
    out.fill([&](int64_t i) { return rank_value(rank, i); });
    // Receive posted first, then send: both in flight together.
    WorkPtr r = w->recv_async(in.tensor(), prev, 7);
    WorkPtr s = w->send_async(out.tensor(), next, 7);
    s->wait();
    r->wait();
    EXPECT_TRUE(test::matches(in, [&](int64_t i) { return rank_value(prev, i); }));
  }
}

TEST(PointToPoint, ShortMessageIsAnError) {
  auto w = world();
  if (w->size() < 2) GTEST_SKIP() << "needs two ranks";
  const int rank = w->rank();
  if (rank == 0) {
    std::vector<float> v(5, 1.0f);
    w->send(Tensor::of(v), 1, 3);
  } else if (rank == 1) {
    std::vector<float> v(8);
    try {
      w->recv(Tensor::of(v), 0, 3);
      FAIL() << "expected a size mismatch";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kMismatch);
      EXPECT_NE(std::string(e.what()).find("received 5 elements, expected 8"), std::string::npos)
          << e.what();
    }
  }
  w->barrier();
}

}  // namespace
}  // namespace tutti
