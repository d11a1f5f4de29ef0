// Resharding arithmetic: placements, runs and copy plans, checked against a
// brute-force model on every combination of small shapes and splits.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "checkpoint/shard_geometry.h"
#include "tutti/error.h"

namespace tutti {
namespace ckpt {
namespace {

// Global element index of each local element, the slow way.
std::vector<uint64_t> brute_globals(const Placement& p) {
  std::vector<uint64_t> out;
  const uint64_t gn = [&] {
    uint64_t n = 1;
    for (auto d : p.global_shape) n *= static_cast<uint64_t>(d);
    return n;
  }();
  if (p.flat) {
    uint64_t ln = 1;
    for (auto d : p.local_shape) ln *= static_cast<uint64_t>(d);
    for (uint64_t i = 0; i < ln; ++i) out.push_back(static_cast<uint64_t>(p.offset) + i);
    return out;
  }
  const size_t nd = p.global_shape.size();
  for (uint64_t g = 0; g < gn; ++g) {
    // Decompose g into coordinates and test membership.
    uint64_t rem = g;
    std::vector<int64_t> coord(nd);
    for (size_t k = nd; k-- > 0;) {
      coord[k] = static_cast<int64_t>(rem % static_cast<uint64_t>(p.global_shape[k]));
      rem /= static_cast<uint64_t>(p.global_shape[k]);
    }
    if (p.dim >= 0) {
      const int64_t c = coord[static_cast<size_t>(p.dim)];
      if (c < p.offset || c >= p.offset + p.local_shape[static_cast<size_t>(p.dim)]) continue;
    }
    out.push_back(g);  // row-major enumeration == local order
  }
  return out;
}

std::vector<Placement> placements_of(const std::vector<int64_t>& g) {
  std::vector<Placement> out;
  ShardInfo rep;
  out.push_back(make_placement(g, rep, ErrorCode::kInvalidArgument, "rep"));
  uint64_t n = 1;
  for (auto d : g) n *= static_cast<uint64_t>(d);
  for (size_t dim = 0; dim < g.size(); ++dim)
    for (int64_t off = 0; off <= g[dim]; ++off)
      for (int64_t len = 0; off + len <= g[dim]; ++len) {
        std::vector<int64_t> local = g;
        local[dim] = len;
        ShardInfo s;
        s.global_shape = g;
        s.dim = static_cast<int>(dim);
        s.offset = off;
        out.push_back(make_placement(local, s, ErrorCode::kInvalidArgument, "dim"));
      }
  for (uint64_t off = 0; off <= n; ++off)
    for (uint64_t len = 0; off + len <= n; len += 3) {
      ShardInfo s;
      s.global_shape = g;
      s.flat = true;
      s.offset = static_cast<int64_t>(off);
      out.push_back(make_placement({static_cast<int64_t>(len)}, s,
                                   ErrorCode::kInvalidArgument, "flat"));
    }
  return out;
}

TEST(Geometry, RunsMatchBruteForce) {
  for (const auto& g : std::vector<std::vector<int64_t>>{{5}, {3, 4}, {2, 3, 2}, {1, 0, 3}}) {
    for (const auto& p : placements_of(g)) {
      std::vector<uint64_t> fromRuns;
      for (const auto& r : placement_runs(p))
        for (uint64_t i = 0; i < r.len; ++i) fromRuns.push_back(r.begin + i);
      EXPECT_EQ(fromRuns, brute_globals(p)) << "dim " << p.dim << " off " << p.offset;
    }
  }
}

TEST(Geometry, CopyPlansDeliverEveryElementOnce) {
  std::mt19937 rng(7);
  for (const auto& g : std::vector<std::vector<int64_t>>{{7}, {3, 4}, {2, 3, 2}}) {
    const auto ps = placements_of(g);
    for (int trial = 0; trial < 400; ++trial) {
      const Placement& dst = ps[rng() % ps.size()];
      // 1 to 3 random sources; the destination is filled from whatever they
      // cover, the first source winning where they overlap.
      std::vector<const Placement*> srcs;
      const int ns = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < ns; ++k) srcs.push_back(&ps[rng() % ps.size()]);
      const auto dg = brute_globals(dst);
      std::vector<int64_t> got(dg.size(), -1);
      std::vector<int> writes(dg.size(), 0);
      IntervalSet covered;
      for (const Placement* s : srcs) {
        const auto sg = brute_globals(*s);
        for (const auto& c : plan_copies(placement_runs(*s), placement_runs(dst), covered))
          for (uint64_t i = 0; i < c.len; ++i) {
            ASSERT_LT(c.src + i, sg.size());
            ASSERT_LT(c.dst + i, dg.size());
            got[c.dst + i] = static_cast<int64_t>(sg[c.src + i]);
            ++writes[c.dst + i];
          }
      }
      uint64_t filled = 0;
      for (size_t i = 0; i < dg.size(); ++i) {
        EXPECT_LE(writes[i], 1) << "element written twice";
        if (got[i] >= 0) {
          EXPECT_EQ(static_cast<uint64_t>(got[i]), dg[i]) << "wrong element";
          ++filled;
        }
      }
      EXPECT_EQ(filled, covered.total()) << "covered counts elements delivered";
    }
  }
}

TEST(Geometry, IntervalSet) {
  IntervalSet s;
  auto f = s.add(10, 20);
  ASSERT_EQ(f.size(), 1u);
  f = s.add(5, 25);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].begin, 5u);
  EXPECT_EQ(f[0].len, 5u);
  EXPECT_EQ(f[1].begin, 20u);
  EXPECT_EQ(f[1].len, 5u);
  EXPECT_TRUE(s.add(7, 9).empty());
  s.add(30, 40);
  EXPECT_EQ(s.total(), 30u);
  const ckpt::Run gap = s.first_gap(50);
  EXPECT_EQ(gap.begin, 0u);
  EXPECT_EQ(gap.len, 5u);
}

TEST(Geometry, RejectsInconsistentShardInfo) {
  auto bad = [](std::vector<int64_t> local, ShardInfo s, const char* needle) {
    try {
      make_placement(local, s, ErrorCode::kInvalidArgument, "model/w");
      ADD_FAILURE() << "accepted " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("model/w"), std::string::npos) << e.what();
    }
  };
  ShardInfo s;
  s.global_shape = {4, 4};
  bad({4, 2}, s, "replicated tensor");
  s.dim = 1;
  s.offset = 3;
  bad({4, 2}, s, "outside the global shape");
  s.dim = 2;
  bad({4, 2}, s, "out of range");
  s.dim = 0;
  s.offset = 0;
  bad({2, 3}, s, "differ in dim 1");
  ShardInfo f;
  f.flat = true;
  f.global_shape = {10};
  f.offset = 8;
  bad({3}, f, "outside the global tensor");
}

}  // namespace
}  // namespace ckpt
}  // namespace tutti
