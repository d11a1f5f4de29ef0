// Every compressor x dtype x bucket size at 1-4 ranks: results identical on
// every rank, within the algorithm's error bound of the exact average, and
// the error-feedback invariant (what was transmitted + the new residual ==
// the gradient + the old residual) holds; plus algorithm-specific checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "compression/compression_test_util.h"

namespace tutti {
namespace {

using test::HostBucket;

CompressorOptions test_options() {
  CompressorOptions o;
  o.topk_ratio = 0.05;
  o.powersgd_rank = 4;
  o.powersgd_start_step = 0;
  o.onebit_chunk = 64;  // several chunks even in small buckets
  o.auto_probe_steps = 2;
  o.seed = 7;
  return o;
}

// Which bucket element each residual element belongs to (-1: none).
std::vector<int64_t> residual_positions(const std::string& algo,
                                        const BucketLayout& l) {
  std::vector<int64_t> pos;
  if (algo == "topk" || algo == "onebit") {
    for (int64_t i = 0; i < l.numel; ++i) pos.push_back(i);
  } else if (algo == "powersgd" || algo == "auto") {
    // The compressed slots, in order (the rule of powersgd.h).
    for (const BucketSlot& s : l.slots) {
      if (s.shape.ndim() < 2 || s.shape.numel() == 0) continue;
      const int64_t m = s.shape[0], n = s.shape.numel() / m;
      const int64_t r = std::min<int64_t>({4, m, n});
      if (double(m) * n / (double(r) * (m + n)) < 2.0) continue;
      for (int64_t i = 0; i < m * n; ++i) pos.push_back(s.offset + i);
    }
  }
  return pos;
}

std::string residual_name(const std::string& algo, int id) {
  const std::string b = "/bucket" + std::to_string(id) + "/residual";
  return algo == "auto" ? "compressor/auto/powersgd" + b : "compressor/" + algo + b;
}

// The residual laid out over the bucket (zeros where there is none).
std::vector<double> residual_in_bucket(Compressor& c, const std::string& algo,
                                       const BucketLayout& l) {
  std::vector<double> out(static_cast<size_t>(l.numel), 0.0);
  const std::vector<int64_t> pos = residual_positions(algo, l);
  const std::vector<double> res = test::state_values(c, residual_name(algo, l.id));
  if (res.empty()) return out;
  EXPECT_EQ(res.size(), pos.size()) << "residual size of " << algo;
  for (size_t i = 0; i < pos.size() && i < res.size(); ++i) out[pos[i]] = res[i];
  return out;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

using Param = std::tuple<std::string, DType, int64_t>;

class EveryCompressor : public ::testing::TestWithParam<Param> {
 protected:
  std::string algo() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
  int64_t n() const { return std::get<2>(GetParam()); }
  ProcessGroupPtr w = world();
  int rank = w->rank(), size = w->size();
};

TEST_P(EveryCompressor, IdenticalOnEveryRankWithinBoundAndErrorFeedback) {
  auto c = make_compressor(algo(), test_options());
  EXPECT_EQ(c->name(), algo());
  const BucketLayout l = test::test_layout(0, dtype(), n());
  c->setup(l);
  const size_t es = dtype_size(dtype());
  const double u32 = test::unit_roundoff(DType::kFloat32);
  const double ud = test::unit_roundoff(dtype());
  for (int64_t step = 0; step < 4; ++step) {
    const std::vector<double> old_res = residual_in_bucket(*c, algo(), l);
    const std::vector<double> g = test::gradient_values(n(), dtype(), 1, rank, step);
    HostBucket b(dtype(), n());
    b.set(g);
    CompressContext ctx;
    ctx.comm = w.get();
    ctx.step = step;
    c->allreduce(0, b.tensor(), ctx);
    const std::vector<double> out = b.get();
    const std::vector<double> new_res = residual_in_bucket(*c, algo(), l);

    // Bit-identical on every rank.
    auto all = test::gather_all(b.bytes.data(), static_cast<size_t>(n()) * es);
    for (int r = 1; r < size; ++r)
      ASSERT_TRUE(all[r] == all[0]) << algo() << " step " << step << ": rank " << r
                                    << "'s result differs from rank 0's";

    // transmitted_r = g_r + old_r - new_r; the result is their mean.
    std::vector<double> sent(static_cast<size_t>(n()));
    for (int64_t i = 0; i < n(); ++i) sent[i] = g[i] + old_res[i] - new_res[i];
    auto sent_all = test::gather_all(sent.data(), sent.size() * sizeof(double));
    std::vector<double> expect(static_cast<size_t>(n()), 0.0);
    double gmax = 0, rmax = 0;
    for (int r = 0; r < size; ++r) {
      const double* s = reinterpret_cast<const double*>(sent_all[r].data());
      for (int64_t i = 0; i < n(); ++i) expect[i] += s[i] / size;
    }
    for (int64_t i = 0; i < n(); ++i) {
      gmax = std::max(gmax, std::fabs(g[i] + old_res[i]));
      rmax = std::max(rmax, std::fabs(new_res[i]));
    }
    double gmax_all = gmax, rmax_all = rmax;
    w->allreduce(Tensor::of(&gmax_all, 1), ReduceOp::kMax);
    w->allreduce(Tensor::of(&rmax_all, 1), ReduceOp::kMax);
    const double omax = max_abs(out);
    // auto is bound by what it chose (-1 while probing: uncompressed).
    std::string effective = algo();
    if (algo() == "auto") {
      const auto choice = test::state_values(*c, "compressor/auto/bucket0/choice");
      ASSERT_EQ(choice.size(), 1u);
      effective = choice[0] == 1 ? "fp16" : choice[0] == 2 ? "powersgd" : "none";
    }
    double tol;
    if (effective == "none") {
      tol = (size + 1) * ud * gmax_all;
    } else if (effective == "fp16" || effective == "bf16") {
      const double uw = test::unit_roundoff(effective == "fp16" ? DType::kFloat16 : DType::kBFloat16);
      tol = (size + 1) * uw * gmax_all + ud * omax;
    } else {
      tol = 4.0 * (size + 2) * u32 * (gmax_all + rmax_all + omax) + 2 * ud * omax;
    }
    for (int64_t i = 0; i < n(); ++i)
      ASSERT_NEAR(out[i], expect[i], tol + 1e-30)
          << algo() << " " << dtype_name(dtype()) << " n=" << n() << " step " << step
          << " element " << i;
    if (algo() == "none" || algo() == "fp16" || algo() == "bf16") {
      EXPECT_EQ(max_abs(new_res), 0.0) << "no residual for " << algo();
    }
  }
  if (size > 1 && n() >= 1000 && algo() != "none" && algo() != "auto") {
    const CompressStats st = c->stats();
    EXPECT_GT(st.uncompressed_bytes, 0u);
    if ((algo() == "fp16" || algo() == "bf16") && dtype_size(dtype()) == 2)
      EXPECT_EQ(st.wire_bytes, st.uncompressed_bytes) << "a 16-bit cast of 16-bit gradients";
    else
      EXPECT_LT(st.wire_bytes, st.uncompressed_bytes) << algo() << " sends less";
  }
}

// A saved and restored state continues bit-identically to not stopping.
TEST_P(EveryCompressor, StateRoundTripIsBitIdentical) {
  if (n() == 0) GTEST_SKIP() << "nothing to carry";
  if (n() > 100000) GTEST_SKIP() << "covered by the smaller sizes (test time)";
  const int ids[] = {0, 3};
  auto make = [&] {
    auto c = make_compressor(algo(), test_options());
    for (int id : ids) c->setup(test::test_layout(id, dtype(), n() + id));
    return c;
  };
  auto step_all = [&](Compressor& c, int64_t step) {
    std::vector<std::vector<unsigned char>> outs;
    for (int id : ids) {
      HostBucket b(dtype(), n() + id);
      b.set(test::gradient_values(n() + id, dtype(), 2 + id, rank, step));
      CompressContext ctx;
      ctx.comm = w.get();
      ctx.step = step;
      c.allreduce(id, b.tensor(), ctx);
      outs.push_back(b.bytes);
    }
    return outs;
  };
  auto a = make();
  for (int64_t s = 0; s < 3; ++s) step_all(*a, s);
  const auto saved = test::save_state(*a);
  std::vector<std::vector<std::vector<unsigned char>>> expect;
  for (int64_t s = 3; s < 6; ++s) expect.push_back(step_all(*a, s));

  auto b = make();
  test::load_state(*b, saved);
  for (int64_t s = 3; s < 6; ++s)
    EXPECT_TRUE(step_all(*b, s) == expect[s - 3])
        << algo() << ": step " << s << " after restoring differs";
  EXPECT_TRUE(test::save_state(*a) == test::save_state(*b)) << "final state differs";
}

std::string param_name(const ::testing::TestParamInfo<Param>& p) {
  return std::get<0>(p.param) + "_" + dtype_name(std::get<1>(p.param)) + "_n" +
         std::to_string(std::get<2>(p.param));
}

INSTANTIATE_TEST_SUITE_P(
    AllAlgorithms, EveryCompressor,
    ::testing::Combine(::testing::Values("none", "fp16", "bf16", "topk",
                                         "powersgd", "onebit", "auto"),
                       ::testing::Values(DType::kFloat32, DType::kFloat16,
                                         DType::kBFloat16, DType::kFloat64),
                       ::testing::Values(0, 1, 7, 1000, 1001)),
    param_name);

INSTANTIATE_TEST_SUITE_P(
    Large, EveryCompressor,
    ::testing::Combine(::testing::Values("none", "fp16", "bf16", "topk",
                                         "powersgd", "onebit", "auto"),
                       ::testing::Values(DType::kFloat32, DType::kFloat16),
                       ::testing::Values(int64_t{1} << 17)),
    param_name);

}  // namespace
}  // namespace tutti
