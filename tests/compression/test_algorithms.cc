// Algorithm-specific behaviour at 1-4 ranks: closed-form cases (top-k with
// ratio 1, PowerSGD on rank-1 gradients and before its start step, 1-bit
// on constant gradients), auto's agreement, options and error messages.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "common/test_util.h"
#include "compression/compression_test_util.h"
#include "tutti/config.h"

namespace tutti {
namespace {

using test::HostBucket;

CompressContext context(int64_t step) {
  CompressContext ctx;
  ctx.comm = world().get();
  ctx.step = step;
  return ctx;
}

TEST(Topk, RatioOneIsTheRankOrderedSumAndLeavesNoResidual) {
  auto w = world();
  CompressorOptions o;
  o.topk_ratio = 1.0;
  auto c = make_compressor("topk", o);
  const int64_t n = 777;
  c->setup(test::make_layout(0, DType::kFloat32, n, {Shape{n}}));
  for (int64_t step = 0; step < 2; ++step) {
    HostBucket b(DType::kFloat32, n);
    b.set(test::gradient_values(n, DType::kFloat32, 3, w->rank(), step));
    c->allreduce(0, b.tensor(), context(step));
    const auto out = b.get();
    for (int64_t i = 0; i < n; ++i) {
      float s = 0.0f;
      for (int r = 0; r < w->size(); ++r)
        s += static_cast<float>(test::gradient_values(n, DType::kFloat32, 3, r, step)[i]);
      ASSERT_EQ(out[i], static_cast<double>(s / w->size())) << "element " << i;
    }
    for (double r : test::state_values(*c, "compressor/topk/bucket0/residual"))
      ASSERT_EQ(r, 0.0);
  }
}

TEST(PowerSgd, BeforeStartStepItIsThePlainAverage) {
  auto w = world();
  CompressorOptions o;
  o.powersgd_start_step = 2;
  auto c = make_compressor("powersgd", o);
  auto plain = make_compressor("none");
  const BucketLayout l = test::test_layout(0, DType::kFloat32, 1000);
  c->setup(l);
  plain->setup(l);
  for (int64_t step = 0; step < 3; ++step) {
    HostBucket a(DType::kFloat32, 1000), b(DType::kFloat32, 1000);
    a.set(test::gradient_values(1000, DType::kFloat32, 4, w->rank(), step));
    b.bytes = a.bytes;
    c->allreduce(0, a.tensor(), context(step));
    plain->allreduce(0, b.tensor(), context(step));
    if (step < 2) {
      EXPECT_TRUE(a.bytes == b.bytes) << "step " << step << " is uncompressed";
      for (double r : test::state_values(*c, "compressor/powersgd/bucket0/residual"))
        ASSERT_EQ(r, 0.0);
    } else {
      EXPECT_FALSE(a.bytes == b.bytes) << "step 2 is compressed";
    }
  }
}

// Every rank's gradient is a multiple of one rank-1 matrix u v^T, so the
// average is rank 1 and a rank-4 PowerSGD step reconstructs it; the 1-D
// slot and the gap go uncompressed and are exact (small integers).
TEST(PowerSgd, ReconstructsLowRankAverageAndSendsSmallTensorsExactly) {
  auto w = world();
  const int64_t m = 64, n = 48;
  const BucketLayout l =
      test::make_layout(0, DType::kFloat32, m * n + 10 + 5, {Shape{m, n}, Shape{10}});
  auto c = make_compressor("powersgd");
  c->setup(l);
  for (int64_t step = 0; step < 2; ++step) {
    HostBucket b(DType::kFloat32, l.numel);
    std::vector<double> g(l.numel);
    std::vector<double> avg(l.numel, 0.0);
    for (int r = 0; r < w->size(); ++r)
      for (int64_t i = 0; i < l.numel; ++i) {
        double v;
        if (i < m * n) {
          const double u = std::sin(0.1 * (i / n) + step), vv = std::cos(0.07 * (i % n));
          v = (1.0 + r) * u * vv;
        } else {
          v = test::rank_value(r, i);
        }
        if (r == w->rank()) g[i] = v;
        avg[i] += v / w->size();
      }
    b.set(g);
    c->allreduce(0, b.tensor(), context(step));
    const auto out = b.get();
    double scale = 0;
    for (int64_t i = 0; i < m * n; ++i) scale = std::max(scale, std::fabs(avg[i]));
    for (int64_t i = 0; i < m * n; ++i)
      ASSERT_NEAR(out[i], avg[i], 2e-5 * scale) << "step " << step << " matrix element " << i;
    for (int64_t i = m * n; i < l.numel; ++i)
      ASSERT_EQ(out[i], static_cast<double>(static_cast<float>(avg[i])))
          << "uncompressed element " << i;
  }
}

TEST(Onebit, ConstantGradientsAverageExactly) {
  auto w = world();
  auto c = make_compressor("onebit");
  const int64_t n = 5000;
  c->setup(test::make_layout(0, DType::kFloat32, n, {Shape{n}}));
  HostBucket b(DType::kFloat32, n);
  const double mine = w->rank() % 2 ? -0.25 * (w->rank() + 1) : 0.5 * (w->rank() + 1);
  b.set(std::vector<double>(n, mine));
  c->allreduce(0, b.tensor(), context(0));
  double avg = 0;
  for (int r = 0; r < w->size(); ++r)
    avg += (r % 2 ? -0.25 * (r + 1) : 0.5 * (r + 1)) / w->size();
  for (double x : b.get()) ASSERT_NEAR(x, avg, 1e-6);
  for (double r : test::state_values(*c, "compressor/onebit/bucket0/residual"))
    ASSERT_EQ(r, 0.0) << "signs times the mean carry a constant exactly";
}

TEST(Auto, ProbesThenEveryRankChoosesTheSame) {
  auto w = world();
  CompressorOptions o;
  o.auto_probe_steps = 3;
  auto c = make_compressor("auto", o);
  const BucketLayout l = test::test_layout(0, DType::kFloat32, 1 << 18);
  c->setup(l);
  for (int64_t step = 0; step < 5; ++step) {
    HostBucket b(DType::kFloat32, l.numel);
    const auto g = test::gradient_values(l.numel, DType::kFloat32, 5, w->rank(), step);
    b.set(g);
    c->allreduce(0, b.tensor(), context(step));
    const double choice = test::state_values(*c, "compressor/auto/bucket0/choice").at(0);
    if (step < 2) {
      EXPECT_EQ(choice, -1.0) << "still probing at step " << step;
    } else {
      EXPECT_GE(choice, 0.0);
      EXPECT_LE(choice, 2.0);
    }
    auto all = test::gather_all(&choice, sizeof(choice));
    for (auto& a : all) EXPECT_TRUE(a == all[0]) << "ranks disagree on the choice";
    if (w->size() == 1) EXPECT_LE(choice, 0.0) << "one rank: nothing to save";
  }
  const auto meas = test::state_values(*c, "compressor/auto/bucket0/measurements");
  ASSERT_EQ(meas.size(), 4u);
  EXPECT_GE(meas[0], 0.0) << "probe time measured";
  EXPECT_GE(meas[1], 0.0) << "bucket time measured";
}

TEST(Options, FromEnvironmentAndFactoryNames) {
  setenv("TUTTI_TOPK_RATIO", "0.25", 1);
  setenv("TUTTI_ONEBIT_CHUNK", "96", 1);
  setenv("TUTTI_POWERSGD_RANK", "2", 1);
  config::reload();
  const CompressorOptions o = CompressorOptions::from_env();
  EXPECT_EQ(o.topk_ratio, 0.25);
  EXPECT_EQ(o.onebit_chunk, 96);
  EXPECT_EQ(o.powersgd_rank, 2);
  unsetenv("TUTTI_TOPK_RATIO");
  unsetenv("TUTTI_ONEBIT_CHUNK");
  unsetenv("TUTTI_POWERSGD_RANK");
  config::reload();
  for (const char* name : {"none", "fp16", "bf16", "topk", "powersgd", "onebit", "auto"})
    EXPECT_EQ(make_compressor(name)->name(), name);
}

template <typename F>
std::string error_of(F f, ErrorCode* code = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

TEST(Errors, NameTheProblem) {
  ErrorCode code{};
  EXPECT_NE(error_of([] { make_compressor("zip"); }, &code).find("unknown compressor 'zip'"),
            std::string::npos);
  EXPECT_EQ(code, ErrorCode::kInvalidArgument);
  CompressorOptions o;
  o.topk_ratio = 0;
  EXPECT_NE(error_of([&] { make_compressor("topk", o); }).find("ratio 0"), std::string::npos);
  o = CompressorOptions();
  o.onebit_chunk = 48;
  EXPECT_NE(error_of([&] { make_compressor("onebit", o); }).find("multiple of 32"),
            std::string::npos);
  o = CompressorOptions();
  o.powersgd_rank = 0;
  EXPECT_NE(error_of([&] { make_compressor("powersgd", o); }).find("rank 0"), std::string::npos);
  o = CompressorOptions();
  o.auto_probe_steps = 0;
  EXPECT_NE(error_of([&] { make_compressor("auto", o); }).find("probe steps"), std::string::npos);

  auto c = make_compressor("topk");
  EXPECT_NE(error_of([&] { c->setup(test::make_layout(1, DType::kInt32, 4, {})); })
                .find("holds int32"),
            std::string::npos);
  c->setup(test::make_layout(1, DType::kFloat32, 8, {Shape{8}}));
  EXPECT_NE(error_of([&] { c->setup(test::make_layout(1, DType::kFloat32, 8, {})); })
                .find("already set up"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              c->setup(test::make_layout(2, DType::kFloat32, 8, {Shape{6}, Shape{6}}));
            }).find("overlaps"),
            std::string::npos);
  HostBucket wrong(DType::kFloat16, 8);
  EXPECT_NE(error_of([&] { c->allreduce(1, wrong.tensor(), context(0)); })
                .find("bucket 1 is float16[8]"),
            std::string::npos);
  HostBucket right(DType::kFloat32, 8);
  EXPECT_NE(error_of([&] { c->allreduce(9, right.tensor(), context(0)); })
                .find("bucket 9 was never set up"),
            std::string::npos);
  CompressContext no_comm;
  EXPECT_NE(error_of([&] { c->allreduce(1, right.tensor(), no_comm); }).find("comm is null"),
            std::string::npos);
}

TEST(None, AveragesAnyDType) {
  auto w = world();
  auto c = make_compressor("none");
  c->setup(test::make_layout(0, DType::kInt32, 5, {}));
  std::vector<int32_t> v(5, 10 * (w->rank() + 1));
  c->allreduce(0, Tensor::of(v), context(0));
  int32_t expect = 0;
  for (int r = 0; r < w->size(); ++r) expect += 10 * (r + 1);
  for (int32_t x : v) EXPECT_EQ(x, expect / w->size());
}

}  // namespace
}  // namespace tutti
