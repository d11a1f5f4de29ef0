// Mixed precision with the sharded optimizer at -np 2 and 4: float16 and
// bfloat16 models with float32 master weights in the shards, the loss
// scaler's overflow check over the gradient shards agreed across ranks (an
// Inf on one rank skips the step everywhere), and clipping by the global
// norm over the shards (each element counted once), against the unsharded
// reference doing the same over whole gradients.
//
// Bit-identity as in test_zero.cc: stage 1 always; stage 2 at W = 2 (norms
// then within 1e-6 relative: float64 partial sums added in another order).
// At W = 4 stage 2's reduce-scatter adds the half-precision gradients in
// another order than the all-reduce, so an averaged gradient may differ by
// an ulp of its dtype: the norms agree within 2 ulps (relative) and the
// parameters within kStage2Ulps ulps of the model dtype (relative to
// |p| + 1e-3; measured 1.6 for float16, 1.0 for bfloat16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "data_parallel/test_zero_util.h"
#include "tutti/amp.h"
#include "tutti/mesh.h"

namespace tutti {
namespace {

using test::ZeroConfig;
using test::ZeroModel;

constexpr int64_t kSteps = 4, kOverflowStep = 2;
constexpr double kMaxNorm = 0.05;  // below the gradients' norm: clipping acts
constexpr double kStage2Ulps = 4;  // see the header comment

struct Trace {
  std::vector<double> params;
  std::vector<double> norms;
  int64_t skipped = 0;
  float final_scale = 0;
};

// kSteps AMP steps: scaled backward, agreed non-finite check, global norm,
// step with grad_scale = inv_scale * clip_coef unless skipped, update.
// With a mesh the optimizer runs over its DP group, and each TP rank trains
// a different shard of the model (ZeroConfig::variant).
Trace run(const ZeroConfig& c, std::vector<unsigned char>* bytes,
          const ProcessMesh* mesh = nullptr) {
  ZeroModel m(mesh ? mesh->dp_group() : world(), c);
  amp::LossScalerOptions so;
  so.init_scale = 1024.f;
  so.growth_interval = 2;
  amp::DynamicLossScaler scaler(so);
  Trace tr;
  for (int64_t t = 1; t <= kSteps; ++t) {
    const std::vector<unsigned char> before = m.param_bytes();
    EXPECT_TRUE(m.backward(t, scaler.scale()));
    amp::StepCheckOptions check;
    check.groups = {world().get()};  // DP (and TP): one decision everywhere
    const bool skip = scaler.check(m.check_tensors(), check);
    EXPECT_EQ(skip, t == kOverflowStep) << "step " << t;
    if (!skip) {
      amp::ClipOptions clip;
      // Shards: disjoint across DP ranks (and TP shards across TP ranks),
      // summed over the world.  Reference: every DP rank holds every
      // (identical) gradient, so only TP shards are summed.
      if (m.zero) clip.group = world().get();
      else if (mesh) clip.group = mesh->tp_group().get();
      const double norm = amp::grad_norm(m.check_tensors(), clip) * scaler.inv_scale();
      tr.norms.push_back(norm);
      const double coef = std::min(1.0, kMaxNorm / (norm + 1e-6));
      m.step(static_cast<float>(scaler.inv_scale() * coef));
    } else {
      EXPECT_EQ(m.param_bytes(), before) << "a skipped step changed the parameters";
    }
    scaler.update();
  }
  tr.params = m.param_values();
  tr.skipped = scaler.skipped_steps();
  tr.final_scale = scaler.scale();
  if (bytes) *bytes = m.param_bytes();
  if (m.zero) EXPECT_EQ(m.zero->steps(), kSteps - 1);
  return tr;
}

TEST(ZeroAmp, OverflowSkipAndGlobalNormClipping) {
  const int w = world()->size();
  for (DType dtype : {DType::kFloat16, DType::kBFloat16})
    for (int stage : {1, 2}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " stage " + std::to_string(stage));
      ZeroConfig c;
      c.dtype = dtype;
      c.hyper = test::test_hyper(optim::Kind::kAdamW);
      c.overflow_step = kOverflowStep;
      c.overflow_rank = w - 1;  // one rank only: the check must be agreed
      c.stage = stage;
      ZeroConfig rc = c;
      rc.stage = 0;
      std::vector<unsigned char> zb, rb;
      const Trace z = run(c, &zb), ref = run(rc, &rb);
      EXPECT_EQ(z.skipped, 1);
      EXPECT_EQ(z.final_scale, ref.final_scale);
      ASSERT_EQ(z.norms.size(), ref.norms.size());
      const bool exact = stage == 1 || w <= 2;
      // Half-precision gradients summed in another order differ by about
      // an ulp of their dtype (2^-10 float16, 2^-7 bfloat16, relative).
      const double half_ulp = dtype == DType::kFloat16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
      const double norm_bound = exact ? 1e-6 : 2 * half_ulp;
      for (size_t i = 0; i < z.norms.size(); ++i)
        EXPECT_NEAR(z.norms[i], ref.norms[i], norm_bound * ref.norms[i]) << "norm " << i;
      EXPECT_GT(ref.norms[0], kMaxNorm) << "clipping never acted";
      if (exact) {
        EXPECT_EQ(zb, rb) << "parameters not bit-identical";
      } else {
        double worst = 0;
        for (size_t i = 0; i < z.params.size(); ++i)
          worst = std::max(worst, std::fabs(z.params[i] - ref.params[i]) /
                                      (half_ulp * (std::fabs(ref.params[i]) + 1e-3)));
        EXPECT_LE(worst, kStage2Ulps);
        if (world()->rank() == 0)
          std::printf("%s stage 2 at W=%d: parameters within %.2f ulps of the reference\n",
                      dtype_name(dtype), w, worst);
      }
    }
}

// TP x DP: a mesh of TP size 2 (np 2: DP 1; np 4: DP 2), every parameter
// TP-sharded (different on the two TP ranks), the sharded optimizer over
// the DP group: the global norm over the world counts each element once,
// the overflow on one DP rank skips the step on every rank, and with DP <= 2
// the parameters are bit-identical to the unsharded optimizer's.
TEST(ZeroAmp, TensorTimesDataParallel) {
  ProcessMesh mesh(world(), 2);
  ZeroConfig c;
  c.dtype = DType::kFloat16;
  c.hyper = test::test_hyper(optim::Kind::kAdam);
  c.overflow_step = kOverflowStep;
  c.overflow_rank = mesh.dp_size() - 1;
  c.variant = mesh.tp_rank();
  c.stage = 2;
  ZeroConfig rc = c;
  rc.stage = 0;
  std::vector<unsigned char> zb, rb;
  const Trace z = run(c, &zb, &mesh), ref = run(rc, &rb, &mesh);
  EXPECT_EQ(z.skipped, 1);
  ASSERT_EQ(z.norms.size(), ref.norms.size());
  for (size_t i = 0; i < z.norms.size(); ++i)
    EXPECT_NEAR(z.norms[i], ref.norms[i], 1e-6 * ref.norms[i]) << "norm " << i;
  EXPECT_EQ(zb, rb) << "parameters not bit-identical";
  // The two TP ranks really hold different shards.
  std::vector<double> mine = {z.params[0]}, other(2);
  mesh.tp_group()->allgather(Tensor::of(mine), Tensor::of(other));
  EXPECT_NE(other[0], other[1]);
}

}  // namespace
}  // namespace tutti
