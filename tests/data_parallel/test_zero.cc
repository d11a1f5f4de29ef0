// ShardedOptimizer (ZeRO-1/2) against the unsharded optimizer (Reducer
// all-reduce + optim::step over whole tensors) at -np 1..4: uneven shards
// (64 elements in 3 buckets of 30, 29 and 5 elements) with parameters
// straddling shard boundaries; SGD with momentum, Adam, AdamW; copying and
// bucket-view reducers; and the reduce-scatter in float16 / bfloat16.
//
// Bit-identity: stage 1 always (the same all-reduce, the same element-wise
// update of each element by exactly one rank).  Stage 2 at W <= 2 (a sum of
// two values does not depend on order; the reduce-scatter averages by the
// same division as the reducer's write-back).  At W = 3, 4 MPI's reduce-
// scatter may add the ranks' values in another order than its all-reduce;
// the averaged gradients then differ by a few float32 ulps, and after three
// steps the parameters agree within kStage2Bound (relative).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "data_parallel/test_zero_util.h"

namespace tutti {
namespace {

using test::ZeroConfig;
using test::ZeroModel;

constexpr double kStage2Bound = 1e-5;
constexpr int kSteps = 3;

const optim::Kind kKinds[] = {optim::Kind::kSgd, optim::Kind::kAdam, optim::Kind::kAdamW};

// Trains the reference and a sharded model side by side; returns the max
// relative parameter difference after each step (and whether the bytes were
// identical after every step).
struct Parity {
  double max_rel = 0;
  double max_abs = 0;
  bool identical = true;
};

Parity run_parity(ZeroConfig c) {
  ZeroConfig ref_config = c;
  ref_config.stage = 0;
  ref_config.reduce_dtype = DType::kFloat32;
  ZeroModel ref(world(), ref_config), z(world(), c);
  Parity out;
  for (int64_t t = 1; t <= kSteps; ++t) {
    EXPECT_TRUE(ref.backward(t));
    ref.step();
    EXPECT_TRUE(z.backward(t));
    z.step();
    out.identical = out.identical && ref.param_bytes() == z.param_bytes();
    out.max_rel = std::max(out.max_rel, test::max_rel_diff(z.param_values(), ref.param_values()));
    out.max_abs = std::max(out.max_abs, test::max_abs_diff(z.param_values(), ref.param_values()));
  }
  EXPECT_TRUE(test::same_on_every_rank(z.param_bytes())) << "ranks' parameters differ";
  EXPECT_EQ(z.zero->steps(), kSteps);
  return out;
}

TEST(Zero, MatchesUnshardedOptimizer) {
  const int w = world()->size();
  for (optim::Kind kind : kKinds)
    for (int stage : {1, 2})
      for (bool view : {false, true}) {
        ZeroConfig c;
        c.hyper = test::test_hyper(kind);
        c.stage = stage;
        c.bucket_view = view;
        SCOPED_TRACE(std::string(optim::kind_name(kind)) + " stage " + std::to_string(stage) +
                     (view ? " bucket view" : " copying"));
        const Parity p = run_parity(c);
        if (stage == 1 || w <= 2) {
          EXPECT_TRUE(p.identical) << "max relative difference " << p.max_rel;
        } else {
          EXPECT_LE(p.max_rel, kStage2Bound);
          if (!p.identical && world()->rank() == 0)
            std::printf("stage 2 at W=%d, %s: not bit-identical, max rel diff %.3g\n", w,
                        optim::kind_name(kind), p.max_rel);
        }
      }
}

// Each rank keeps master weights and state for ceil(N / W) elements of a
// bucket at most: the per-rank state is 1/W of the unsharded one, up to the
// rounding of uneven shards.  The shards tile every bucket exactly once.
TEST(Zero, ShardsTileBucketsAndStateShrinks) {
  const int w = world()->size();
  ZeroConfig c;
  c.hyper = test::test_hyper(optim::Kind::kAdam);
  ZeroModel z(world(), c);
  const auto& shards = z.zero->shards();
  ASSERT_EQ(shards.size(), z.reducer->buckets().size());
  int64_t owned = 0, total = 0;
  for (const ZeroShard& s : shards) {
    EXPECT_EQ(s.shard_numel, (s.bucket_numel + w - 1) / w);
    EXPECT_LE(s.end - s.begin, s.shard_numel);
    // Every rank's [begin, end): together they cover [0, N) once.
    std::vector<int64_t> mine = {s.begin, s.end}, all(static_cast<size_t>(2 * w));
    world()->allgather(Tensor::of(mine), Tensor::of(all));
    for (int r = 0; r < w; ++r) {
      EXPECT_EQ(all[2 * static_cast<size_t>(r)], std::min<int64_t>(r * s.shard_numel, s.bucket_numel));
      EXPECT_EQ(all[2 * static_cast<size_t>(r) + 1],
                std::min<int64_t>((r + 1) * s.shard_numel, s.bucket_numel));
    }
    owned += s.end - s.begin;
    total += s.bucket_numel;
  }
  EXPECT_EQ(total, 64);
  EXPECT_EQ(z.zero->unsharded_state_bytes(), total * 4 * 3);
  EXPECT_EQ(z.zero->state_bytes(), owned * 4 * 3);
  int64_t bound = 0;
  for (const ZeroShard& s : shards) bound += s.shard_numel;
  EXPECT_LE(owned, bound);
  std::vector<int64_t> sum = {owned};
  world()->allreduce(Tensor::of(sum), ReduceOp::kSum);
  EXPECT_EQ(sum[0], total);
  if (w >= 2) EXPECT_TRUE(test::has_straddling_parameter(*z.reducer, *z.zero));
}

// Stage 2 leaves the registered gradients as this rank computed them (no
// write-back): its shard of the average lives in gradient_shards().
TEST(Zero, Stage2KeepsLocalGradients) {
  ZeroConfig c;
  c.hyper = test::test_hyper(optim::Kind::kSgd);
  ZeroModel z(world(), c), local(world(), c);
  ASSERT_TRUE(z.backward(1));
  // The same local gradients, never reduced: fill them with no_sync.
  {
    NoSyncGuard g = local.reducer->no_sync();
    EXPECT_FALSE(local.backward(1));
  }
  for (int p = 0; p < 5; ++p) {
    const Tensor a = z.reducer->gradient(p), b = local.reducer->gradient(p);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.nbytes())) << "parameter " << p;
  }
  int64_t shard_elems = 0;
  for (const Tensor& t : z.zero->gradient_shards()) shard_elems += t.numel();
  int64_t owned = 0;
  for (const ZeroShard& s : z.zero->shards()) owned += s.end - s.begin;
  EXPECT_EQ(shard_elems, owned);
  z.step();
}

// overlap_all_gather: step() only launches the all-gathers (last bucket,
// i.e. first layers, first); the next backward pass runs while they are in
// flight; wait_parameter(0) writes w1's bucket (the last) and not bucket 0
// (w3, launched last); wait_parameters() the rest, bit-identical to the
// unsharded optimizer.
TEST(Zero, OverlappedAllGather) {
  const int w = world()->size();
  ZeroConfig c;
  c.hyper = test::test_hyper(optim::Kind::kAdam);
  c.overlap_all_gather = true;
  ZeroConfig rc = c;
  rc.stage = 0;
  ZeroModel ref(world(), rc), z(world(), c);
  const auto& buckets = z.reducer->buckets();
  ASSERT_EQ(buckets.front().slots.front().name, "w3");
  ASSERT_EQ(buckets.back().slots.back().name, "w1");
  ASSERT_TRUE(z.backward(1));
  for (int64_t t = 1; t <= kSteps; ++t) {
    ASSERT_TRUE(ref.backward(t));
    ref.step();
    const std::vector<unsigned char> before = z.param_bytes();
    z.step();
    EXPECT_EQ(z.param_bytes(), before) << "step " << t << " wrote parameters before a wait";
    if (t < kSteps) ASSERT_TRUE(z.backward(t + 1));  // overlaps the all-gathers
    z.zero->wait_parameter(0);                        // w1, the last bucket
    if (w <= 2) EXPECT_EQ(z.param_bytes(0), ref.param_bytes(0)) << "step " << t;
    EXPECT_NE(z.param_bytes(0), std::vector<unsigned char>(before.begin(), before.begin() + 21 * 4))
        << "step " << t << ": wait_parameter(0) did not write w1";
    EXPECT_EQ(z.param_bytes(4), std::vector<unsigned char>(before.end() - 13 * 4, before.end()))
        << "step " << t << ": w3's bucket (launched last) was written early";
    z.zero->wait_parameters();
    if (w <= 2) {
      EXPECT_EQ(z.param_bytes(), ref.param_bytes()) << "step " << t;
    } else {
      EXPECT_LE(test::max_rel_diff(z.param_values(), ref.param_values()), kStage2Bound);
    }
  }
}

// The reduce-scatter in float16 / bfloat16 (float32 model): each rank's
// gradient (|g| <= 0.1) is divided by W and rounded to 11 / 8 significant
// bits, and the sum rounded again, so the averaged gradient is off by at
// most ~2 * 0.1 * 2^-11 (float16) or 2 * 0.1 * 2^-8 (bfloat16).  SGD with
// momentum 0.9 and lr 0.1 moves a parameter by lr * (1 + 1.9 + 2.71) = 0.56
// gradients in three steps, hence the absolute bounds 0.56 * 0.2 * 2^-11
// ~ 5.5e-5 (float16) and 4.4e-4 (bfloat16).
TEST(Zero, ReduceScatterCompression) {
  for (DType wire : {DType::kFloat16, DType::kBFloat16}) {
    ZeroConfig c;
    c.hyper = test::test_hyper(optim::Kind::kSgd);
    c.stage = 2;
    c.reduce_dtype = wire;
    SCOPED_TRACE(dtype_name(wire));
    const Parity p = run_parity(c);
    EXPECT_LE(p.max_abs, wire == DType::kFloat16 ? 5.5e-5 : 4.4e-4);
    if (world()->rank() == 0)
      std::printf("reduce_dtype %s: max abs diff %.3g\n", dtype_name(wire), p.max_abs);
  }
}

}  // namespace
}  // namespace tutti
