// Convergence: the same small model trained data-parallel with each
// compressor reaches a final loss within 5% of uncompressed training after
// the same number of steps.
//
// Model and data (tests/compression/mlp.h): an MLP 32-64-64-10 (ReLU,
// softmax cross-entropy, 6922 parameters in several gradient buckets),
// labels from a fixed random linear teacher on N(0, 1) inputs, 32 fresh
// samples per rank per step, 300 steps of SGD (lr 0.05, momentum 0.9),
// parameters seeded identically on every rank.  The final loss is measured
// on 2048 held-out samples, the same on every rank.  Compressor settings:
// top-k ratio 0.1, PowerSGD rank 4, 1-bit chunk 64, auto with 5 probe steps.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "compression/compression_test_util.h"
#include "compression/mlp.h"

namespace tutti {
namespace {

CompressorOptions options() {
  CompressorOptions o;
  o.topk_ratio = 0.1;
  o.powersgd_rank = 4;
  o.onebit_chunk = 64;
  o.auto_probe_steps = 5;
  o.seed = 3;
  return o;
}

const test::TrainResult& trained(const std::string& name) {
  static std::map<std::string, test::TrainResult> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  auto c = make_compressor(name, options());
  return cache[name] = test::train(c, world(), test::TrainOptions());
}

class Convergence : public ::testing::TestWithParam<std::string> {};

TEST_P(Convergence, FinalLossWithinFivePercentOfUncompressed) {
  const test::TrainResult& base = trained("none");
  const test::TrainResult& r = trained(GetParam());
  if (world()->rank() == 0)
    std::printf("  %-9s final eval loss %.4f (none %.4f, ratio %.3f); train loss "
                "step 0 %.3f, last %.4f\n",
                GetParam().c_str(), r.final_eval_loss, base.final_eval_loss,
                r.final_eval_loss / base.final_eval_loss, r.train_loss.front(),
                r.train_loss.back());
  EXPECT_LT(base.final_eval_loss, 0.5f * base.train_loss.front())
      << "the uncompressed run itself learns";
  EXPECT_LE(r.final_eval_loss, 1.05f * base.final_eval_loss) << GetParam();
  // Bit-identical averaged gradients keep the replicas identical.
  auto all = test::gather_all(r.final_params.data(), r.final_params.size() * 4);
  for (size_t k = 1; k < all.size(); ++k)
    EXPECT_TRUE(all[k] == all[0]) << "rank " << k << "'s parameters diverged";
}

INSTANTIATE_TEST_SUITE_P(Compressors, Convergence,
                         ::testing::Values("none", "fp16", "bf16", "topk",
                                           "powersgd", "onebit", "auto"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           return p.param;
                         });

}  // namespace
}  // namespace tutti
