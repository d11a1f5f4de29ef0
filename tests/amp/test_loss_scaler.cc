// DynamicLossScaler trajectories for scripted overflow patterns, written out
// by hand from the documented rules (torch.cuda.amp.GradScaler; Megatron
// and DeepSpeed hysteresis), plus bounds, policies and the state dict.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "amp_test_util.h"

namespace tutti {
namespace amp {
namespace {

// Feeds a pattern ('.' clean, 'x' overflow) and returns the scale after
// each update().
std::vector<float> run(DynamicLossScaler* s, const std::string& pattern) {
  std::vector<float> out;
  for (char c : pattern) {
    NonFiniteReport r;
    r.found = c == 'x';
    if (r.found) r.tensors = {0};
    s->agree(r);
    s->update();
    out.push_back(s->scale());
  }
  return out;
}

LossScalerOptions small(float init, int64_t interval, int64_t hysteresis = 1) {
  LossScalerOptions o;
  o.init_scale = init;
  o.growth_interval = interval;
  o.hysteresis = hysteresis;
  return o;
}

TEST(LossScaler, GradScalerDefaults) {
  DynamicLossScaler s;
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.inv_scale(), 1.0f / 65536);
  // 1999 clean steps: no growth yet; the 2000th doubles the scale.
  std::vector<float> t = run(&s, std::string(1999, '.'));
  EXPECT_EQ(t.back(), 65536.0f);
  EXPECT_EQ(s.growth_tracker(), 1999);
  t = run(&s, ".");
  EXPECT_EQ(t.back(), 131072.0f);
  EXPECT_EQ(s.growth_tracker(), 0);
  // An overflow halves it and restarts the interval.
  t = run(&s, std::string(1000, '.') + "x");
  EXPECT_EQ(t.back(), 65536.0f);
  EXPECT_EQ(s.growth_tracker(), 0);
  t = run(&s, std::string(1999, '.'));
  EXPECT_EQ(t.back(), 65536.0f);
  t = run(&s, ".");
  EXPECT_EQ(t.back(), 131072.0f);
  EXPECT_EQ(s.steps(), 5001);
  EXPECT_EQ(s.skipped_steps(), 1);
  EXPECT_EQ(s.last_overflow_step(), 3000);
}

TEST(LossScaler, GrowthAndBackoffTrajectory) {
  DynamicLossScaler s(small(8, 3));
  EXPECT_EQ(run(&s, "...x....xx..."),
            (std::vector<float>{8, 8, 16, 8, 8, 8, 16, 16, 8, 4, 4, 4, 8}));
  EXPECT_EQ(s.skipped_steps(), 3);
  EXPECT_EQ(s.last_overflow_step(), 9);
}

TEST(LossScaler, HysteresisRestoredOnlyOnGrowth) {
  // Megatron / DeepSpeed default: the budget of 2 is spent across
  // non-consecutive overflows until the scale grows.
  DynamicLossScaler s(small(8, 3, 2));
  EXPECT_EQ(run(&s, ".x.x...xxx"),
            (std::vector<float>{8, 8, 8, 4, 4, 4, 8, 8, 4, 2}));
  EXPECT_EQ(s.hysteresis_tracker(), 0);
  EXPECT_EQ(s.skipped_steps(), 5);
}

TEST(LossScaler, ConsecutiveHysteresis) {
  // DeepSpeed consecutive_hysteresis: a clean step restores the budget, so
  // isolated overflows never back off.
  LossScalerOptions o = small(8, 3, 2);
  o.consecutive_hysteresis = true;
  DynamicLossScaler s(o);
  EXPECT_EQ(run(&s, ".x.x...xxx"),
            (std::vector<float>{8, 8, 8, 8, 8, 8, 16, 16, 8, 4}));
}

TEST(LossScaler, HysteresisThree) {
  DynamicLossScaler s(small(64, 2, 3));
  // Overflows 1 and 2 are absorbed, the 3rd backs off, the 4th too (budget
  // spent); growth after 2 clean steps restores the budget.
  EXPECT_EQ(run(&s, "xxxx..xx.x"),
            (std::vector<float>{64, 64, 32, 16, 16, 32, 32, 32, 32, 16}));
}

TEST(LossScaler, MaxScaleAndFloatRangeBoundGrowth) {
  LossScalerOptions o = small(8, 1);
  o.max_scale = 20;
  DynamicLossScaler s(o);
  EXPECT_EQ(run(&s, "...."), (std::vector<float>{16, 20, 20, 20}));
  // Like GradScaler: no growth when the next scale would be Inf.
  DynamicLossScaler big(small(std::ldexp(1.0f, 127), 1));
  EXPECT_EQ(run(&big, ".."), (std::vector<float>{std::ldexp(1.0f, 127), std::ldexp(1.0f, 127)}));
}

TEST(LossScaler, BackoffStopsAtMinScaleThenPolicyError) {
  LossScalerOptions o = small(4, 100);
  o.min_scale = 1;
  DynamicLossScaler s(o);
  EXPECT_EQ(run(&s, "xx"), (std::vector<float>{2, 1}));
  // At the minimum, the next overflow cannot back off: an error that names
  // the step and the overflowing tensors; the step still counts as skipped.
  std::vector<float> g = {1, 2, std::numeric_limits<float>::infinity()};
  std::vector<float> h = {std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> ok = {1};
  StepCheckOptions c;
  c.names = {"fc1.weight", "fc1.bias", "fc2.weight"};
  EXPECT_TRUE(s.unscale_and_check({Tensor::of(g), Tensor::of(ok), Tensor::of(h)}, c));
  try {
    s.update();
    FAIL() << "no error at the minimum scale";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(m.find("step 2"), std::string::npos) << m;
    EXPECT_NE(m.find("minimum 1"), std::string::npos) << m;
    EXPECT_NE(m.find("'fc1.weight', 'fc2.weight'"), std::string::npos) << m;
    EXPECT_EQ(m.find("fc1.bias"), std::string::npos) << m;
  }
  EXPECT_EQ(s.scale(), 1.0f);
  EXPECT_EQ(s.skipped_steps(), 3);
  EXPECT_EQ(s.steps(), 3);
  // The scaler stays usable.
  EXPECT_EQ(run(&s, "."), (std::vector<float>{1}));
}

TEST(LossScaler, PolicyWarnKeepsSkipping) {
  LossScalerOptions o = small(2, 100);
  o.min_scale = 1;
  o.at_min_scale = MinScalePolicy::kWarn;
  DynamicLossScaler s(o);
  EXPECT_EQ(run(&s, "xxxx."), (std::vector<float>{1, 1, 1, 1, 1}));
  EXPECT_EQ(s.skipped_steps(), 4);
  EXPECT_EQ(s.consecutive_skips(), 0);
}

TEST(LossScaler, NoLowerBoundStopsWhereTheReciprocalOverflows) {
  // min_scale 0 (GradScaler): the smallest usable scale is the smallest one
  // whose reciprocal is a finite float (2^-127; 1/2^-128 = 2^128 overflows).
  // Backing off below it would unscale by Inf: the min-scale policy applies
  // there instead (it raised "scale inf" from the unscale before).
  LossScalerOptions o = small(std::ldexp(1.0f, -126), 100);
  o.min_scale = 0;
  DynamicLossScaler s(o);
  EXPECT_EQ(run(&s, "x"), (std::vector<float>{std::ldexp(1.0f, -127)}));
  EXPECT_TRUE(std::isfinite(s.inv_scale()));
  try {
    run(&s, "x");
    FAIL() << "no min-scale policy below 2^-127";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("minimum"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.scale(), std::ldexp(1.0f, -127));
  // The unscale at the smallest scale still works (finite inverse).
  std::vector<float> g = {std::ldexp(1.0f, -127)};
  EXPECT_FALSE(s.unscale_and_check({Tensor::of(g)}));
  EXPECT_EQ(g[0], 1.0f);
  // kWarn keeps skipping at that scale.
  o.at_min_scale = MinScalePolicy::kWarn;
  o.init_scale = std::ldexp(1.0f, -127);
  DynamicLossScaler w(o);
  EXPECT_EQ(run(&w, "xx"), (std::vector<float>{std::ldexp(1.0f, -127),
                                              std::ldexp(1.0f, -127)}));
  // A scale whose reciprocal overflows is refused up front.
  o.init_scale = std::ldexp(1.0f, -129);
  EXPECT_THROW(DynamicLossScaler bad(o), Error);
}

TEST(LossScaler, MaxConsecutiveSkips) {
  LossScalerOptions o;
  o.precision = DType::kBFloat16;
  o.max_consecutive_skips = 3;
  DynamicLossScaler s(o);
  EXPECT_EQ(run(&s, "xx.xx"), (std::vector<float>{1, 1, 1, 1, 1}));
  EXPECT_THROW(run(&s, "x"), Error);
  EXPECT_EQ(s.consecutive_skips(), 3);
}

TEST(LossScaler, BFloat16ModeOnlyChecks) {
  LossScalerOptions o;
  o.precision = DType::kBFloat16;
  DynamicLossScaler s(o);
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(s.scale(), 1.0f);
  test::HostTensor g(DType::kBFloat16, 100);
  for (int64_t i = 0; i < 100; ++i) g.set(i, 3.0f * i);
  const std::vector<unsigned char> before = g.bytes;
  EXPECT_FALSE(s.unscale_and_check({g.tensor()}));
  EXPECT_EQ(g.bytes, before);
  EXPECT_FALSE(s.update().skipped);
  g.set(50, std::numeric_limits<float>::infinity());
  EXPECT_TRUE(s.unscale_and_check({g.tensor()}));
  const ScaleUpdate u = s.update();
  EXPECT_TRUE(u.skipped);
  EXPECT_FALSE(u.backed_off);
  EXPECT_EQ(s.scale(), 1.0f);
  EXPECT_EQ(run(&s, std::string(5000, '.')).back(), 1.0f);
  EXPECT_EQ(s.skipped_steps(), 1);
}

TEST(LossScaler, UnscalesGradientsOfEveryDType) {
  DynamicLossScaler s(small(1024, 10));
  test::HostTensor a(DType::kFloat32, 9), b(DType::kFloat16, 9), c(DType::kBFloat16, 9);
  for (int64_t i = 0; i < 9; ++i) {
    a.set(i, 1024.0f * i);
    b.set(i, 512.0f * i);
    c.set(i, -2048.0f * i);
  }
  EXPECT_FALSE(s.unscale_and_check({a.tensor(), b.tensor(), c.tensor()}));
  for (int64_t i = 0; i < 9; ++i) {
    EXPECT_EQ(a.get(i), static_cast<float>(i));
    EXPECT_EQ(b.get(i), 0.5f * i);
    EXPECT_EQ(c.get(i), -2.0f * i);
  }
  // Unscaling the same gradient twice in a step is refused.
  StepCheckOptions named;
  named.names = {"w"};
  EXPECT_THROW(s.unscale_and_check({b.tensor()}, named), Error);
  EXPECT_EQ(b.get(2), 1.0f) << "the refused call must not touch the gradient";
  // Other gradients may be unscaled in a second call; results are OR-ed.
  test::HostTensor d(DType::kFloat32, 1);
  d.set(0, std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(s.unscale_and_check({d.tensor()}));
  EXPECT_TRUE(s.found_non_finite());
  EXPECT_TRUE(s.update().skipped);
  // A refused list (float64) is not remembered as unscaled.
  std::vector<double> f64(3, 1.0);
  test::HostTensor e(DType::kFloat32, 4);
  EXPECT_THROW(s.unscale_and_check({e.tensor(), Tensor::of(f64)}), Error);
  EXPECT_FALSE(s.unscale_and_check({e.tensor()}));
  // A new step may unscale them again.
  EXPECT_FALSE(s.unscale_and_check({a.tensor()}));
  s.update();
}

TEST(LossScaler, UpdateWithoutCheckIsAnError) {
  DynamicLossScaler s;
  EXPECT_THROW(s.update(), Error);
  run(&s, ".");
  EXPECT_THROW(s.update(), Error);
}

TEST(LossScaler, RejectsBadOptions) {
  auto bad = [](auto edit) {
    LossScalerOptions o;
    edit(o);
    EXPECT_THROW(DynamicLossScaler s(o), Error);
  };
  bad([](LossScalerOptions& o) { o.growth_factor = 1; });
  bad([](LossScalerOptions& o) { o.backoff_factor = 1; });
  bad([](LossScalerOptions& o) { o.backoff_factor = 0; });
  bad([](LossScalerOptions& o) { o.growth_interval = 0; });
  bad([](LossScalerOptions& o) { o.hysteresis = 0; });
  bad([](LossScalerOptions& o) { o.init_scale = -1; });
  bad([](LossScalerOptions& o) { o.init_scale = std::numeric_limits<float>::infinity(); });
  bad([](LossScalerOptions& o) { o.min_scale = 1e6f; });
  bad([](LossScalerOptions& o) { o.max_scale = 10; });
  bad([](LossScalerOptions& o) { o.precision = DType::kInt8; });
  bad([](LossScalerOptions& o) { o.max_consecutive_skips = -1; });
}

// ---- state ---------------------------------------------------------------------

void copy_state(DynamicLossScaler* from, DynamicLossScaler* to) {
  StateDict a = from->state_dict(), b = to->state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].name, b[i].name);
    ASSERT_EQ(a[i].tensor.nbytes(), b[i].tensor.nbytes());
    std::memcpy(b[i].tensor.data(), a[i].tensor.data(), a[i].tensor.nbytes());
  }
  to->on_state_loaded();
}

TEST(LossScalerState, NamesAndTypes) {
  DynamicLossScaler s;
  const StateDict d = s.state_dict();
  const std::vector<std::string> names = {
      "amp/loss_scaler/scale", "amp/loss_scaler/growth_tracker",
      "amp/loss_scaler/hysteresis_tracker", "amp/loss_scaler/steps",
      "amp/loss_scaler/skipped_steps", "amp/loss_scaler/consecutive_skips",
      "amp/loss_scaler/last_overflow_step"};
  ASSERT_EQ(d.size(), names.size());
  for (size_t i = 0; i < d.size(); ++i) {
    EXPECT_EQ(d[i].name, names[i]);
    EXPECT_EQ(d[i].tensor.numel(), 1);
    EXPECT_EQ(d[i].tensor.dtype(), i == 0 ? DType::kFloat32 : DType::kInt64);
    EXPECT_FALSE(d[i].shard.sharded());
  }
  EXPECT_EQ(*d[0].tensor.data_as<float>(), 65536.0f);
}

TEST(LossScalerState, RestoreResumesTheSameTrajectory) {
  LossScalerOptions o = small(1024, 4, 2);
  DynamicLossScaler a(o), b(o);
  run(&a, "..x..x.....xx.x...");
  copy_state(&a, &b);
  EXPECT_EQ(test::state_bytes(&a), test::state_bytes(&b));
  const std::string rest = "....x...xxx......x";
  EXPECT_EQ(run(&a, rest), run(&b, rest));
  EXPECT_EQ(test::state_bytes(&a), test::state_bytes(&b));
  EXPECT_EQ(b.steps(), 36);
}

TEST(LossScalerState, CorruptValuesAreRejected) {
  DynamicLossScaler s;
  StateDict d = s.state_dict();
  *d[0].tensor.data_as<float>() = std::numeric_limits<float>::quiet_NaN();
  try {
    s.on_state_loaded();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
    EXPECT_NE(std::string(e.what()).find("amp/loss_scaler/scale"), std::string::npos);
  }
  *d[0].tensor.data_as<float>() = 8;
  *d[1].tensor.data_as<int64_t>() = -1;
  EXPECT_THROW(s.on_state_loaded(), Error);
  *d[1].tensor.data_as<int64_t>() = 0;
  *d[4].tensor.data_as<int64_t>() = 5;  // skipped > steps
  EXPECT_THROW(s.on_state_loaded(), Error);
  *d[4].tensor.data_as<int64_t>() = 0;
  s.on_state_loaded();
  EXPECT_EQ(s.scale(), 8.0f);
}

TEST(LossScalerState, FixedScaleModeResetsALoadedScale) {
  LossScalerOptions o;
  o.precision = DType::kBFloat16;
  DynamicLossScaler fp16, bf16(o);
  run(&fp16, "x");
  copy_state(&fp16, &bf16);
  EXPECT_EQ(bf16.scale(), 1.0f);
  EXPECT_EQ(bf16.skipped_steps(), 1);
}

}  // namespace
}  // namespace amp
}  // namespace tutti
