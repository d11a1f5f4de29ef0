// Error-feedback compressors under AMP (1-4 ranks):
//  * a bucket with Inf/NaN on ONE rank becomes NaN on EVERY rank (so the
//    loss scaler skips the step everywhere), the compressor's state stays
//    bit-identical, and the next step continues exactly as if the overflow
//    step had never happened;
//  * a change of gradient scale (CompressContext::grad_scale, the loss
//    scale) rescales the residuals: training at scale 4 after three steps
//    at scale 1 gives 4x the results of staying at scale 1.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "compression/compression_test_util.h"

namespace tutti {
namespace {

using test::HostBucket;

CompressorOptions options() {
  CompressorOptions o;
  o.topk_ratio = 0.05;
  o.powersgd_rank = 2;
  o.onebit_chunk = 64;
  o.seed = 11;
  return o;
}

using Param = std::tuple<std::string, DType>;

class ErrorFeedback : public ::testing::TestWithParam<Param> {
 protected:
  std::string algo() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
  static constexpr int64_t kN = 1500;
  ProcessGroupPtr w = world();
  int rank = w->rank(), size = w->size();

  std::shared_ptr<Compressor> make() const {
    auto c = make_compressor(algo(), options());
    c->setup(test::test_layout(0, dtype(), kN));
    return c;
  }
  // One step; `scale` multiplies the gradient and is the context's scale.
  std::vector<double> step(Compressor& c, int64_t s, float scale = 1.0f,
                           int poison_rank = -1, double poison = 0) {
    std::vector<double> g = test::gradient_values(kN, dtype(), 5, rank, s, scale);
    if (rank == poison_rank) g[kN / 3] = poison;
    HostBucket b(dtype(), kN);
    b.set(g);
    CompressContext ctx;
    ctx.comm = w.get();
    ctx.step = s;
    ctx.grad_scale = scale;
    c.allreduce(0, b.tensor(), ctx);
    return b.get();
  }
};

TEST_P(ErrorFeedback, OverflowOnOneRankIsNaNEverywhereAndLeavesStateAlone) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double poison : {inf, -inf, nan}) {
    auto a = make();
    auto ref = make();
    for (int64_t s = 0; s < 2; ++s) {
      step(*a, s);
      step(*ref, s);
    }
    const auto before = test::save_state(*a);
    const std::vector<double> out = step(*a, 2, 1.0f, size - 1, poison);
    for (int64_t i = 0; i < kN; ++i)
      ASSERT_TRUE(std::isnan(out[i]))
          << algo() << ": element " << i << " = " << out[i] << " on rank " << rank
          << " after rank " << size - 1 << " sent " << poison
          << " (every element of an overflowed bucket must be NaN)";
    EXPECT_TRUE(test::save_state(*a) == before)
        << algo() << ": the overflow step changed the compressor's state";
    EXPECT_EQ(a->stats().nonfinite_steps, 1u);
    // The next step is what it would have been without the overflow step.
    const std::vector<double> next = step(*a, 3);
    const std::vector<double> expect = step(*ref, 3);
    for (int64_t i = 0; i < kN; ++i)
      ASSERT_EQ(next[i], expect[i]) << algo() << ": element " << i
                                    << " after the skipped step";
  }
}

TEST_P(ErrorFeedback, GradientScaleChangeRescalesResiduals) {
  auto scaled = make();
  auto plain = make();
  for (int64_t s = 0; s < 3; ++s) {
    step(*scaled, s);
    step(*plain, s);
  }
  for (int64_t s = 3; s < 6; ++s) {
    const std::vector<double> got = step(*scaled, s, 4.0f);
    const std::vector<double> ref = step(*plain, s, 1.0f);
    for (int64_t i = 0; i < kN; ++i) {
      // Power-of-two scaling is exact in every step of top-k and 1-bit;
      // PowerSGD's orthogonalisation takes square roots: a few ulps.
      const double tol = algo() == "powersgd" ? 1e-5 * (std::fabs(ref[i]) * 4 + 1e-3) : 0;
      ASSERT_NEAR(got[i], 4 * ref[i], tol)
          << algo() << ": step " << s << " element " << i
          << " at gradient scale 4 is not 4x the scale-1 result";
    }
  }
  const auto gs = test::state_values(*scaled, "compressor/" + algo() + "/bucket0/grad_scale");
  ASSERT_EQ(gs.size(), 1u);
  EXPECT_EQ(gs[0], 4.0);
}

TEST_P(ErrorFeedback, BadGradientScaleIsAnError) {
  auto c = make();
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    HostBucket b(dtype(), kN);
    b.set(test::gradient_values(kN, dtype(), 5, rank, 0));
    CompressContext ctx;
    ctx.comm = w.get();
    ctx.grad_scale = bad;
    try {
      c->allreduce(0, b.tensor(), ctx);
      ADD_FAILURE() << "gradient scale " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("gradient scale"), std::string::npos) << e.what();
    }
  }
}

// A loaded gradient scale that is not finite and positive is bad state from
// the file: kCorrupt, as the loss scaler reports its own.
TEST_P(ErrorFeedback, LoadedBadGradientScaleIsCorrupt) {
  auto c = make();
  step(*c, 0);
  const std::string name = "compressor/" + algo() + "/bucket0/grad_scale";
  for (float bad : {0.0f, -2.0f, std::numeric_limits<float>::quiet_NaN()}) {
    for (const NamedTensor& nt : c->state_dict())
      if (nt.name == name) *static_cast<float*>(nt.tensor.data()) = bad;
    try {
      c->on_state_loaded();
      ADD_FAILURE() << "loaded gradient scale " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

std::string name(const ::testing::TestParamInfo<Param>& p) {
  return std::get<0>(p.param) + "_" + dtype_name(std::get<1>(p.param));
}

INSTANTIATE_TEST_SUITE_P(
    Compressors, ErrorFeedback,
    ::testing::Combine(::testing::Values("topk", "powersgd", "onebit"),
                       ::testing::Values(DType::kFloat32, DType::kBFloat16,
                                         DType::kFloat64)),
    name);

}  // namespace
}  // namespace tutti
