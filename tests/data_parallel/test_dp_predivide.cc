// gradient_predivide_factor f (Horovod's): the bucket is divided by f before
// the sum and the sum by W / f after it.  Dyadic gradients make every result
// exact for f in {1, 2, W} at W = 2 and 4; f = 3 (W / f not a whole number)
// takes the separate post-division; fp16 gradients of ~1e-5 show dividing
// first loses accuracy; bad factors are refused.  The same with the
// compressors that take a factor (none, fp16, bf16: divided by f before the
// cast, by W / f after it), and the fp16 cast's accuracy on tiny float32
// gradients as a function of f.  Run at -np 2 and 4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>

#include "data_parallel/dp_test_util.h"

namespace tutti {
namespace {

using test::expect_contains;
using test::expect_error;
using test::ParamDecl;
using test::TestParam;

const std::vector<ParamDecl> kFloats = {
    {"a", DType::kFloat32, Shape{37}},
    {"b", DType::kFloat16, Shape{5, 3}},
    {"c", DType::kBFloat16, Shape{9}},
    {"d", DType::kFloat32, Shape{64}},
};

// Rank r's gradient: small multiples of 1/8, so x / 2^k and sums over <= 4
// ranks are exact in float32, float16 and bfloat16.
double dyadic(int rank, int param, int64_t i) {
  return static_cast<double>((rank + 1) * 3 + (i % 5) - 2 * param) / 8.0;
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  convert(t.data(), t.dtype(), v.data(), DType::kFloat64, v.size());
  return v;
}

// kNone, kFp16, kBf16: the flat reducer with that compressor.
enum class Mode { kFlat, kView, kHierarchical, kNone, kFp16, kBf16 };

ReducerOptions opts(double f, Mode mode) {
  ReducerOptions o;
  if (mode == Mode::kNone) o.compressor = make_compressor("none");
  if (mode == Mode::kFp16) o.compressor = make_compressor("fp16");
  if (mode == Mode::kBf16) o.compressor = make_compressor("bf16");
  o.bucket_cap_mb = 256.0 / (1 << 20);  // several buckets
  o.first_bucket_cap_mb = 0;
  o.gradient_predivide_factor = f;
  o.gradient_as_bucket_view = mode == Mode::kView;
  o.hierarchical = mode == Mode::kHierarchical;
  o.hierarchical_node_size = 2;
  o.learn_bucket_order = false;
  return o;
}

// Runs two steps with factor f and returns the max |result - expected|,
// where expected(p, i) is computed from the exact per-rank gradients.
double run_steps(double f, Mode mode, const std::function<double(double, int)>& expected) {
  const int rank = world()->rank(), w = world()->size();
  auto params = test::make_params(kFloats);
  Reducer reducer(world(), opts(f, mode));
  test::register_all(reducer, params);
  reducer.build();
  double worst = 0;
  for (int step = 0; step < 2; ++step) {
    for (int p = 0; p < reducer.num_parameters(); ++p) {
      Tensor g = reducer.gradient(p);
      std::vector<double> v(static_cast<size_t>(g.numel()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = dyadic(rank, p + step, static_cast<int64_t>(i));
      convert(v.data(), DType::kFloat64, g.data(), g.dtype(), v.size());
    }
    for (int p = reducer.num_parameters() - 1; p >= 0; --p) reducer.grad_ready(p);
    EXPECT_TRUE(reducer.synchronize());
    for (int p = 0; p < reducer.num_parameters(); ++p) {
      const std::vector<double> got = values(reducer.gradient(p));
      for (size_t i = 0; i < got.size(); ++i) {
        double sum = 0;
        for (int r = 0; r < w; ++r) sum += dyadic(r, p + step, static_cast<int64_t>(i));
        worst = std::max(worst, std::abs(got[i] - expected(sum, w)));
      }
    }
  }
  return worst;
}

class Predivide : public ::testing::TestWithParam<Mode> {};

TEST_P(Predivide, DyadicAverageIsExactForOneTwoAndW) {
  const int w = world()->size();
  for (double f : {1.0, 2.0, static_cast<double>(w)}) {
    const double err = run_steps(f, GetParam(), [](double sum, int n) { return sum / n; });
    EXPECT_EQ(err, 0.0) << "f = " << f << " at W = " << w;
  }
}

TEST_P(Predivide, FactorThreeDividesTheBucketAfterTheSum) {
  // W / 3 is not a whole number: the sum is divided by float(W / 3) in the
  // bucket's dtype (one rounding), the pre-division by 3 rounds once more.
  // float16/bfloat16 keep 11/8 significant bits: relative error <= ~3 ulp.
  // The cast compressors round g / 3 to the wire type, sum there (W - 1
  // roundings of partial sums, exact here) and divide by W / 3 in float32:
  // within the same bound.
  const double err = run_steps(3.0, GetParam(), [](double sum, int n) { return sum / n; });
  EXPECT_LE(err, 3 * std::ldexp(1.0, -8) * 16) << "values are below 16 in magnitude";
  EXPECT_GT(err, 0.0) << "dividing by 3 before the sum is not exact in 16 bits";
}

INSTANTIATE_TEST_SUITE_P(Modes, Predivide,
                         ::testing::Values(Mode::kFlat, Mode::kView, Mode::kHierarchical,
                                           Mode::kNone, Mode::kFp16, Mode::kBf16));

// The relative RMS error of the average of W ranks' gradients of ~1e-5
// (N(0, 1e-5) rounded to `dtype`, rank r's from seed + r), reduced with
// factor f through `compressor` ("" for none).
double tiny_gradients_rel_rms(DType dtype, const char* compressor, double f, int seed) {
  const int rank = world()->rank(), w = world()->size();
  const int64_t n = 1 << 14;
  std::vector<std::vector<double>> all(static_cast<size_t>(w));
  for (int r = 0; r < w; ++r) {
    std::mt19937 rng(seed + r);
    std::normal_distribution<double> dist(0.0, 1e-5);
    for (int64_t i = 0; i < n; ++i)
      all[static_cast<size_t>(r)].push_back(test::stored(dtype, dist(rng)));
  }
  test::Buffer param(dtype, n), grad(dtype, n);
  convert(all[static_cast<size_t>(rank)].data(), DType::kFloat64, grad.bytes.data(), dtype,
          static_cast<size_t>(n));
  ReducerOptions o;
  if (*compressor) o.compressor = make_compressor(compressor);
  o.gradient_predivide_factor = f;
  Reducer reducer(world(), o);
  reducer.add_parameter("g", param.tensor(), grad.tensor());
  reducer.build();
  reducer.grad_ready(0);
  EXPECT_TRUE(reducer.synchronize());
  const std::vector<double> got = grad.values();
  double err2 = 0, ref2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    double avg = 0;
    for (int r = 0; r < w; ++r) avg += all[static_cast<size_t>(r)][static_cast<size_t>(i)];
    avg /= w;
    err2 += (got[static_cast<size_t>(i)] - avg) * (got[static_cast<size_t>(i)] - avg);
    ref2 += avg * avg;
  }
  return std::sqrt(err2 / ref2);
}

// float32 gradients of ~1e-5 through the fp16 cast: g / f is rounded to
// fp16, where values below 6.1e-5 are subnormal (a fixed spacing of 2^-24),
// and the sums of such values are exact, so the error is the first
// rounding: per rank at most 2^-25 in units of g / f, i.e. f * 2^-25 in g,
// RMS f * 2^-24 / sqrt(12).  The average of W ranks then has a relative RMS
// error of about f * 2^-24 / sqrt(12) / 1e-5 = f * 0.17%, whatever W: f = W
// (the compressor's own split, what f = 1 selects) is the least accurate
// here, f = 0.5 (scale up before the cast) the most.  As with fp16
// gradients on the uncompressed path (PredivideFp16 below), dividing first
// protects only against overflow.
double fp16_cast_rel_rms(double f) {
  return tiny_gradients_rel_rms(DType::kFloat32, "fp16", f, 7);
}

TEST(PredivideFp16Cast, FactorSetsTheRoundingOfTinyGradients) {
  const double w = world()->size();
  const double model = std::ldexp(1.0, -24) / std::sqrt(12.0) / 1e-5;  // per unit of f
  std::map<double, double> err;
  for (double f : {0.5, 2.0, w}) {
    err[f] = fp16_cast_rel_rms(f);
    std::printf("rank %d: fp16 cast, float32 gradients ~1e-5, W = %g, f = %g: "
                "relative RMS error %.4f%% (model %.4f%%)\n",
                world()->rank(), w, f, 100 * err[f], 100 * f * model);
    EXPECT_LT(err[f], 1.5 * f * model) << "f = " << f;
    EXPECT_GT(err[f], 0.5 * f * model) << "f = " << f << ": the rounding is where modelled";
  }
  // f = 1 is the compressor's own split, f = W: the same bits.
  EXPECT_EQ(fp16_cast_rel_rms(1.0), err[w]);
  EXPECT_LT(err[0.5] * 3, err[w]) << "scaling up before the cast keeps digits";
}

// fp16 gradients of ~1e-5 (normal, as in the emulation): dividing
// by W before the sum pushes them deeper into fp16's subnormal range
// (spacing 2^-24 ~ 6e-8), so f = W is less accurate than f = 1.
double fp16_rel_rms(double f) { return tiny_gradients_rel_rms(DType::kFloat16, "", f, 42); }

TEST(PredivideFp16, DividingFirstLosesTinyGradients) {
  const int w = world()->size();
  const double after = fp16_rel_rms(1.0), first = fp16_rel_rms(w);
  // numpy emulation (docs/data_parallel.md): W = 2: 0.30% vs 0.42%, W = 4:
  // 0.37% vs 0.74%; the reducer's all-reduce rounds the same way or better.
  EXPECT_LT(after, 0.006) << "f = 1";
  EXPECT_GT(first, after * 1.2) << "f = " << w << ": " << first << " vs f = 1: " << after;
  EXPECT_LT(first, 0.02) << "f = " << w << ": still the average, only less accurate";
  std::printf("rank %d: fp16 relative RMS error f = 1: %.4f%%, f = %d: %.4f%%\n",
              world()->rank(), 100 * after, w, 100 * first);
}

TEST(PredivideErrors, BadFactorsAreRefused) {
  for (double f : {0.0, -2.0, std::nan(""), HUGE_VAL}) {
    ReducerOptions o;
    o.gradient_predivide_factor = f;
    expect_contains(expect_error([&] { Reducer r(world(), o); }, ErrorCode::kInvalidArgument),
                    "gradient_predivide_factor");
  }
  ReducerOptions sum;
  sum.op = ReduceOp::kSum;
  sum.gradient_predivide_factor = 2;
  expect_contains(expect_error([&] { Reducer r(world(), sum); }, ErrorCode::kInvalidArgument),
                  "op must be avg");
  // The compressors that average in float32 themselves refuse a factor;
  // none, fp16 and bf16 take it.
  for (const char* name : {"topk", "powersgd", "onebit", "auto"}) {
    ReducerOptions comp;
    comp.compressor = make_compressor(name);
    comp.gradient_predivide_factor = 2;
    expect_contains(
        expect_error([&] { Reducer r(world(), comp); }, ErrorCode::kInvalidArgument),
        std::string("compressor '") + name + "'");
  }
  for (const char* name : {"none", "fp16", "bf16"}) {
    ReducerOptions comp;
    comp.compressor = make_compressor(name);
    comp.gradient_predivide_factor = 2;
    EXPECT_NO_THROW(Reducer r(world(), comp)) << name;
  }
  // Driven directly: the factor reaches the compressor through the context.
  {
    auto topk = make_compressor("topk");
    BucketLayout l;
    l.numel = 8;
    l.slots.push_back({"x", 0, Shape{8}});
    topk->setup(l);
    std::vector<float> x(8, 1.0f);
    CompressContext ctx;
    ctx.comm = world().get();
    ctx.predivide_factor = 2;
    expect_contains(expect_error([&] { topk->allreduce(0, Tensor::of(x), ctx); },
                                 ErrorCode::kInvalidArgument),
                    "only none, fp16 and bf16 take a factor");
    auto fp16 = make_compressor("fp16");
    fp16->setup(l);
    ctx.predivide_factor = -1;
    expect_contains(expect_error([&] { fp16->allreduce(0, Tensor::of(x), ctx); },
                                 ErrorCode::kInvalidArgument),
                    "must be finite and > 0");
  }
  ReducerOptions ints;
  ints.gradient_predivide_factor = 2;
  Reducer r(world(), ints);
  test::Buffer p(DType::kInt32, 4), g(DType::kInt32, 4);
  expect_contains(expect_error([&] { r.add_parameter("n", p.tensor(), g.tensor()); },
                               ErrorCode::kInvalidArgument),
                  "this one is int32");
}

}  // namespace
}  // namespace tutti
