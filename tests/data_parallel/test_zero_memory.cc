// ZeRO-2's gradient memory (issue 16) at -np 2 and 4: the model of
// test_zero_util (64 elements in 3 uneven buckets, parameters straddling
// shard boundaries).
//
// Stage 2 with a copying reducer keeps the persistent gradient shards
// (S_b = ceil(N_b / W) elements per bucket) plus a pool of bucket_buffers
// full-size bucket buffers; stage 1 keeps every bucket's buffer.  The byte
// counts are closed forms of the layout, so before the pool (every bucket's
// buffer resident in stage 2 as well) the first test fails.
//
// The all-gather buffers: one per bucket (a model copy) or a pool.
//
// Parity of the pooled stage 2 with the unsharded optimizer: bit-identical
// at W = 2; at W = 4 within kStage2Bound relative (the reduce-scatter may
// sum in another order than the all-reduce; see test_zero.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "data_parallel/test_zero_util.h"

namespace tutti {
namespace {

using test::ZeroConfig;
using test::ZeroModel;

constexpr double kStage2Bound = 1e-5;

struct Layout {
  int64_t shard_bytes = 0;   // sum_b S_b * 4
  int64_t padded_bytes = 0;  // sum_b ceil(N_b / W) * W * 4
  int64_t max_padded = 0;    // max_b ceil(N_b / W) * W * 4
  int64_t buckets = 0;
};

Layout layout_of(const ZeroModel& z) {
  const int64_t w = z.group->size();
  Layout l;
  for (const ZeroShard& s : z.zero->shards()) {
    const int64_t padded = s.shard_numel * w * 4;
    l.shard_bytes += s.shard_numel * 4;
    l.padded_bytes += padded;
    l.max_padded = std::max(l.max_padded, padded);
    ++l.buckets;
  }
  return l;
}

const std::vector<int> kBucketOrder = {4, 3, 2, 1, 0};  // reverse registration

void train(ZeroModel& m, int64_t steps) {
  for (int64_t t = 1; t <= steps; ++t) {
    m.pass(t, kBucketOrder, false);
    ASSERT_TRUE(m.reducer->synchronize());
    m.step();
  }
}

// Gradients in bucket order: bucket k + 1's first gradient finds the pool
// empty (pool of n) and waits for the reduce-scatter of bucket k + 1 - n,
// which has been launched; the pool never grows.
TEST(ZeroMemory, Stage2GradientBytesAreShardsPlusPool) {
  const int64_t steps = 2;
  ZeroConfig c;
  c.hyper = test::test_hyper(optim::Kind::kAdam);
  c.stage = 1;
  ZeroModel stage1(world(), c);
  train(stage1, steps);
  const Layout l = layout_of(stage1);
  ASSERT_EQ(l.buckets, 3);
  EXPECT_EQ(stage1.zero->gradient_bytes(), l.padded_bytes);
  c.stage = 2;
  c.bucket_buffers = 0;  // the layout before the pool
  ZeroModel whole(world(), c);
  train(whole, steps);
  EXPECT_EQ(whole.zero->gradient_bytes(), l.padded_bytes + l.shard_bytes);
  // A pool of 3 buffers of the largest bucket is no smaller than the 3
  // buckets: not installed.
  c.bucket_buffers = 3;
  ZeroModel three(world(), c);
  EXPECT_EQ(three.zero->gradient_bytes(), l.padded_bytes + l.shard_bytes);
  for (int n : {1, 2}) {
    SCOPED_TRACE("bucket_buffers " + std::to_string(n));
    c.bucket_buffers = n;
    ZeroModel z(world(), c);
    const int64_t bound = l.shard_bytes + n * l.max_padded;
    EXPECT_EQ(z.zero->gradient_bytes(), bound) << "before the first step";
    train(z, steps);
    EXPECT_EQ(z.zero->gradient_bytes(), bound);
    // Three tiny buckets: a pool of 2 holds 2/3 of the model; the saving
    // grows with the number of buckets (bench_zero --grad-memory).
    EXPECT_LT(z.zero->gradient_bytes(), whole.zero->gradient_bytes());
    const ReducerStats st = z.reducer->stats();
    EXPECT_EQ(st.bucket_bytes, n * l.max_padded);
    EXPECT_EQ(st.pool_growths, 0);
    EXPECT_EQ(st.pool_waits, steps * std::max<int64_t>(0, l.buckets - n));
    if (world()->size() <= 2)
      EXPECT_EQ(z.param_bytes(), stage1.param_bytes()) << "pooled stage 2 vs stage 1";
    else
      EXPECT_LE(test::max_rel_diff(z.param_values(), stage1.param_values()), kStage2Bound);
    EXPECT_EQ(z.param_bytes(), whole.param_bytes()) << "pooled vs unpooled stage 2";
    if (world()->rank() == 0)
      std::printf("W=%d gradient bytes: stage 1 %lld, stage 2 unpooled %lld, pool %d: %lld\n",
                  world()->size(), static_cast<long long>(stage1.zero->gradient_bytes()),
                  static_cast<long long>(whole.zero->gradient_bytes()), n,
                  static_cast<long long>(z.zero->gradient_bytes()));
  }
}

// Gradient accumulation over 2 micro-steps (w2 produced only in the first,
// so synchronize() fills its slot from the accumulated tensor), rank 0 in
// bucket order and the other ranks in registration order (bucket 2 fills
// first but launches last: the pool must grow instead of waiting, and no
// rank may hang), a pool of 1 buffer, SGD and AdamW, three steps.
TEST(ZeroMemory, PooledStage2AccumulationAndOrderParity) {
  const int w = world()->size();
  const std::vector<int> order =
      world()->rank() == 0 ? kBucketOrder : std::vector<int>{0, 1, 2, 3, 4};
  std::vector<int> second;
  for (int p : order)
    if (p != 2) second.push_back(p);
  for (optim::Kind kind : {optim::Kind::kSgd, optim::Kind::kAdamW}) {
    SCOPED_TRACE(optim::kind_name(kind));
    ZeroConfig c;
    c.hyper = test::test_hyper(kind);
    c.passes = 2;
    c.bucket_buffers = 1;
    ZeroConfig rc = c;
    rc.stage = 0;
    ZeroModel ref(world(), rc), z(world(), c);
    const Layout l = layout_of(z);
    for (int64_t t = 1; t <= 3; ++t)
      for (ZeroModel* m : {&ref, &z}) {
        m->pass(t + 100, order, false);
        ASSERT_FALSE(m->reducer->synchronize());
        m->pass(t, second, true);
        ASSERT_TRUE(m->reducer->synchronize());
        m->step();
      }
    if (w <= 2) {
      EXPECT_EQ(z.param_bytes(), ref.param_bytes());
    } else {
      EXPECT_LE(test::max_rel_diff(z.param_values(), ref.param_values()), kStage2Bound);
    }
    EXPECT_TRUE(test::same_on_every_rank(z.param_bytes()));
    // Growth is bounded by the buckets held at once (every bucket at most).
    const ReducerStats st = z.reducer->stats();
    EXPECT_LE(st.bucket_bytes, l.buckets * l.max_padded);
    EXPECT_EQ(z.zero->gradient_bytes(), l.shard_bytes + st.bucket_bytes);
    if (world()->rank() != 0) EXPECT_GE(st.pool_growths, 1);
  }
}

// The parameter all-gather: gather_buffers = 0 (or overlap_all_gather)
// keeps one W * S_b buffer per bucket, i.e. one more model copy; a pool of
// n keeps n of the largest.  With a pool of 1 every bucket's all-gather is
// finished before the next bucket updates; the parameters are the same bits
// as with one buffer per bucket, in both stages.
TEST(ZeroMemory, AllGatherUsesPooledBuffers) {
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    ZeroConfig c;
    c.hyper = test::test_hyper(optim::Kind::kAdamW);
    c.stage = stage;
    c.gather_buffers = 0;
    ZeroModel whole(world(), c);
    const Layout l = layout_of(whole);
    EXPECT_EQ(whole.zero->gather_bytes(), l.padded_bytes);
    c.overlap_all_gather = true;
    c.gather_buffers = 1;  // ignored: every all-gather is in flight at once
    ZeroModel overlap(world(), c);
    EXPECT_EQ(overlap.zero->gather_bytes(), l.padded_bytes);
    c.overlap_all_gather = false;
    c.gather_buffers = 3;  // no smaller than one per bucket: not pooled
    ZeroModel three(world(), c);
    EXPECT_EQ(three.zero->gather_bytes(), l.padded_bytes);
    train(whole, 2);
    for (int n : {1, 2}) {
      SCOPED_TRACE("gather_buffers " + std::to_string(n));
      c.gather_buffers = n;
      ZeroModel z(world(), c);
      EXPECT_EQ(z.zero->gather_bytes(), n * l.max_padded);
      train(z, 2);
      EXPECT_EQ(z.zero->gather_bytes(), n * l.max_padded);
      EXPECT_EQ(z.param_bytes(), whole.param_bytes());
    }
  }
}

}  // namespace
}  // namespace tutti
