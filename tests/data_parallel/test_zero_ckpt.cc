// ShardedOptimizer checkpoints at -np 4 (groups of 2, 3 and 4 split from
// the world): each rank saves its flat shards; a load at another size
// re-splits them (4 -> 2, 2 -> 3) and training continues to the result of
// an unresized run; consolidate() gathers the whole master weights and
// state for export.
//
// Bound for the resized runs: the gradient average is the mean of the same
// 12 samples at every size (test_zero_util.h), so runs at different sizes
// differ only by the rounding of each rank's partial mean and of the sum
// (a few float32 ulps of a gradient, ~1e-8 absolute); over four Adam/SGD
// steps the parameters agree within kResizeBound (relative, |p| + 1e-3).
#include <gtest/gtest.h>

#include <cstring>

#include "checkpoint/ckpt_test_util.h"
#include "data_parallel/test_zero_util.h"

namespace tutti {
namespace {

using test::ZeroConfig;
using test::ZeroModel;

constexpr double kResizeBound = 1e-5;
constexpr int64_t kSaveAt = 2, kEnd = 4;

ZeroConfig config(optim::Kind kind) {
  ZeroConfig c;
  c.hyper = test::test_hyper(kind);
  c.stage = 2;
  return c;
}

ProcessGroupPtr first_ranks(int n, const char* name) {
  auto w = world();
  return w->split_group(w->rank() < n ? 0 : -1, w->rank(), name);
}

// Trains steps [from, to] on `group`; loads `load_dir` first and saves at
// kSaveAt into `save_dir` when given.  Returns the final parameters.
std::vector<double> train(const ProcessGroupPtr& group, const ZeroConfig& c, int64_t from,
                          int64_t to, const std::string& load_dir, const std::string& save_dir) {
  ZeroModel m(group, c);
  if (!load_dir.empty()) {
    CheckpointManager ckpt(group, test::zero_ckpt_options(load_dir));
    auto r = ckpt.load({{"optimizer", m.zero.get()}});
    EXPECT_TRUE(r.has_value());
    if (r) EXPECT_EQ(r->step, from - 1);
    EXPECT_EQ(m.zero->steps(), from - 1);
  }
  for (int64_t t = from; t <= to; ++t) {
    EXPECT_TRUE(m.backward(t));
    m.step();
    if (t == kSaveAt && !save_dir.empty()) {
      CheckpointManager ckpt(group, test::zero_ckpt_options(save_dir));
      ckpt.save(t, {{"optimizer", m.zero.get()}});
      ckpt.wait();
    }
  }
  return m.param_values();
}

void resize_case(int writers, int readers, optim::Kind kind) {
  SCOPED_TRACE(std::to_string(writers) + " -> " + std::to_string(readers) + ", " +
               optim::kind_name(kind));
  test::ScratchDir tmp(world());
  const ZeroConfig c = config(kind);
  // The unresized run, at the writers' size.
  std::vector<double> expected;
  if (auto g = first_ranks(writers, "unresized")) expected = train(g, c, 1, kEnd, "", "");
  // Steps 1..kSaveAt at the writers' size, saved; the rest at the readers'.
  if (auto g = first_ranks(writers, "writers")) train(g, c, 1, kSaveAt, "", tmp.sub("ckpt"));
  world()->barrier();
  bool ok = true;
  if (auto g = first_ranks(readers, "readers")) {
    const std::vector<double> got = train(g, c, kSaveAt + 1, kEnd, tmp.sub("ckpt"), "");
    if (!expected.empty()) {  // ranks that ran both
      const double d = test::max_rel_diff(got, expected);
      EXPECT_LE(d, kResizeBound);
      ok = d <= kResizeBound;
      if (world()->rank() == 0) std::printf("resumed vs unresized: max rel diff %.3g\n", d);
    }
  }
  EXPECT_TRUE(test::all_ranks_ok(ok));
}

TEST(ZeroCheckpoint, Resize4To2) {
  ASSERT_EQ(world()->size(), 4) << "run at -np 4";
  resize_case(4, 2, optim::Kind::kAdam);
}

TEST(ZeroCheckpoint, Resize2To3) {
  ASSERT_EQ(world()->size(), 4) << "run at -np 4";
  resize_case(2, 3, optim::Kind::kSgd);
}

// consolidate(): every parameter's master weights and states, whole and
// bit-identical to the unsharded optimizer's (stage 1: same arithmetic);
// saved through the checkpoint API (a safetensors file per rank holding
// them all) and read back by a single rank.
TEST(ZeroCheckpoint, ConsolidateMatchesUnsharded) {
  test::ScratchDir tmp(world());
  ZeroConfig c = config(optim::Kind::kAdamW);
  c.stage = 1;
  ZeroConfig rc = c;
  rc.stage = 0;
  ZeroModel z(world(), c), ref(world(), rc);
  for (int64_t t = 1; t <= 2; ++t) {
    z.backward(t);
    z.step();
    ref.backward(t);
    ref.step();
  }
  StateDict full = z.zero->consolidate();
  ASSERT_EQ(full.size(), 5 * 3 + 1);
  for (size_t p = 0; p < 5; ++p) {
    const std::string name = z.params[p].name;
    auto find = [&](const std::string& n) -> const NamedTensor* {
      for (const auto& t : full)
        if (t.name == n) return &t;
      return nullptr;
    };
    const NamedTensor* m = find(name);
    ASSERT_NE(m, nullptr) << name;
    EXPECT_EQ(m->tensor.shape(), z.params[p].shape);
    EXPECT_EQ(0, std::memcmp(m->tensor.data(), ref.master[p].data(), m->tensor.nbytes())) << name;
    const char* states[] = {"exp_avg", "exp_avg_sq"};
    for (int k = 0; k < 2; ++k) {
      const NamedTensor* s = find(name + "/" + states[k]);
      ASSERT_NE(s, nullptr) << name << "/" << states[k];
      EXPECT_EQ(0, std::memcmp(s->tensor.data(), ref.states[p][static_cast<size_t>(k)].data(),
                               s->tensor.nbytes()))
          << name << "/" << states[k];
    }
  }
  {
    CheckpointManager ckpt(world(), test::zero_ckpt_options(tmp.sub("export")));
    ckpt.save(2, full);
    ckpt.wait();
  }
  world()->barrier();
  if (auto one = first_ranks(1, "exporter")) {
    std::vector<std::vector<float>> back;
    back.reserve(full.size());  // the views below point into it
    StateDict read;
    for (const auto& t : full) {
      if (t.tensor.dtype() != DType::kFloat32) continue;
      back.emplace_back(static_cast<size_t>(t.tensor.numel()), -1.f);
      read.push_back({t.name, Tensor(back.back().data(), DType::kFloat32, t.tensor.shape()), {}});
    }
    CheckpointManager ckpt(one, test::zero_ckpt_options(tmp.sub("export")));
    LoadOptions lo;
    lo.resume = false;
    lo.optional = {"zero/"};
    ASSERT_TRUE(ckpt.load(read, lo).has_value());
    for (size_t i = 0; i < read.size(); ++i)
      EXPECT_EQ(0, std::memcmp(read[i].tensor.data(), full[i].tensor.data(),
                               read[i].tensor.nbytes()))
          << read[i].name;
  }
}

}  // namespace
}  // namespace tutti
