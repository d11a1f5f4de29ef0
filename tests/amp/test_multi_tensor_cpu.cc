// Host multi-tensor scale/cast/check and norms against scalar references:
// every dtype pair, sizes 0/1/odd/vector-boundary/large, planted NaN, Inf,
// subnormals and values near the type's maximum; outputs poisoned first.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "amp_test_util.h"

namespace tutti {
namespace amp {
namespace {

using test::HostTensor;

const int64_t kSizes[] = {0, 1, 7, 8, 15, 16, 17, 33, 1000, 65537, (1 << 20) + 3};
const float kScales[] = {1.0f, 1.0f / 65536, 0.3f, 4.0f};

class ScaleCopy : public ::testing::TestWithParam<std::tuple<DType, DType>> {
 protected:
  DType src_dtype() const { return std::get<0>(GetParam()); }
  DType dst_dtype() const { return std::get<1>(GetParam()); }
};

TEST_P(ScaleCopy, MatchesScalarReferenceOutOfPlace) {
  std::mt19937 rng(11);
  for (int64_t n : kSizes) {
    for (float scale : kScales) {
      for (bool specials : {false, true}) {
        HostTensor src(src_dtype(), n), dst(dst_dtype(), n), ref(dst_dtype(), n);
        test::fill_random(&src, &rng, 100.0f, specials);
        const HostTensor before = src;
        dst.poison();
        const bool ref_found = test::reference_scale_copy(src, &ref, scale);
        const NonFiniteReport r = scale_copy({src.tensor()}, {dst.tensor()}, scale);
        ASSERT_TRUE(test::same_values(dst, ref)) << "n " << n << " scale " << scale;
        EXPECT_EQ(r.found, ref_found) << "n " << n << " scale " << scale;
        EXPECT_EQ(r.tensors, ref_found ? std::vector<int>{0} : std::vector<int>{});
        EXPECT_EQ(src.bytes, before.bytes) << "source modified";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllPairs, ScaleCopy,
    ::testing::Combine(::testing::ValuesIn(test::kAmpDTypes),
                       ::testing::ValuesIn(test::kAmpDTypes)),
    [](const ::testing::TestParamInfo<ScaleCopy::ParamType>& p) {
      return std::string(dtype_name(std::get<0>(p.param))) + "_to_" +
             dtype_name(std::get<1>(p.param));
    });

// In place between dtypes of one element size (the same memory reread as
// another 16-bit type, or unscaled in place).
TEST(ScaleCopyInPlace, MatchesScalarReference) {
  std::mt19937 rng(12);
  for (DType sd : test::kAmpDTypes) {
    for (DType dd : test::kAmpDTypes) {
      if (dtype_size(sd) != dtype_size(dd)) continue;
      for (int64_t n : kSizes) {
        HostTensor t(sd, n), ref(dd, n);
        test::fill_random(&t, &rng, 1000.0f, true);
        const bool ref_found = test::reference_scale_copy(t, &ref, 0.125f);
        Tensor view(t.bytes.data(), dd, Shape{n});
        const NonFiniteReport r = scale_copy({t.tensor()}, {view}, 0.125f);
        HostTensor out(dd, n);
        out.bytes = t.bytes;
        EXPECT_TRUE(test::same_values(out, ref))
            << dtype_name(sd) << " -> " << dtype_name(dd) << " n " << n;
        EXPECT_EQ(r.found, ref_found);
      }
    }
  }
}

// One list of mixed dtypes and sizes; NaN planted in exactly the tensors of
// `bad`, at a different position in each (first, last, middle element).
TEST(UnscaleAndCheck, ReportsExactlyTheTensorsWithNonFiniteValues) {
  std::mt19937 rng(13);
  const int count = 37;
  std::vector<HostTensor> grads, refs;
  for (int i = 0; i < count; ++i) {
    const DType d = test::kAmpDTypes[i % 3];
    const int64_t n = (i * 977) % 5000 + (i % 4 == 0 ? 0 : 1);
    grads.emplace_back(d, n);
    test::fill_random(&grads.back(), &rng, 10.0f, false);
  }
  const std::vector<int> bad = {3, 17, 36};
  for (size_t k = 0; k < bad.size(); ++k) {
    HostTensor& g = grads[bad[k]];
    const int64_t pos = k == 0 ? 0 : k == 1 ? g.numel() - 1 : g.numel() / 2;
    g.set(pos, k == 1 ? std::numeric_limits<float>::quiet_NaN()
                      : -std::numeric_limits<float>::infinity());
  }
  std::vector<Tensor> views;
  for (auto& g : grads) {
    refs.emplace_back(g.dtype, g.numel());
    test::reference_scale_copy(g, &refs.back(), 1.0f / 1024);
    views.push_back(g.tensor());
  }
  const NonFiniteReport r = unscale_and_check(views, 1.0f / 1024);
  EXPECT_TRUE(r.found);
  EXPECT_EQ(r.tensors, bad);
  for (int i = 0; i < count; ++i) EXPECT_TRUE(test::same_values(grads[i], refs[i])) << i;
  EXPECT_EQ(r.describe({"a", "b", "c", "d"}), "'d', #17, #36");
  EXPECT_EQ(r.describe({}, 2), "#3, #17 and 1 more");
}

// Every NaN payload and sign, Inf, subnormals and both rounding directions
// of bfloat16 -> bfloat16 (which has its own vector loop), bit for bit
// against the scalar reference, NaN payloads included.
TEST(UnscaleAndCheck, BFloat16EveryBitPattern) {
  HostTensor src(DType::kBFloat16, 65536 + 7), ref(DType::kBFloat16, 65536 + 7);
  for (int64_t i = 0; i < src.numel(); ++i)
    reinterpret_cast<uint16_t*>(src.bytes.data())[i] = static_cast<uint16_t>(i * 40503u);
  for (float scale : {1.0f / 3, 0.5f, 3.0f}) {
    HostTensor dst(DType::kBFloat16, src.numel());
    dst.poison();
    const bool ref_found = test::reference_scale_copy(src, &ref, scale);
    EXPECT_EQ(scale_copy({src.tensor()}, {dst.tensor()}, scale).found, ref_found);
    EXPECT_EQ(dst.bytes, ref.bytes) << "scale " << scale;
    HostTensor inplace = src;
    unscale_and_check({inplace.tensor()}, scale);
    EXPECT_EQ(inplace.bytes, ref.bytes) << "in place, scale " << scale;
  }
}

TEST(UnscaleAndCheck, CleanListAndEmptyList) {
  EXPECT_FALSE(unscale_and_check({}, 0.5f).found);
  HostTensor a(DType::kFloat16, 100), b(DType::kBFloat16, 0);
  for (int64_t i = 0; i < 100; ++i) a.set(i, static_cast<float>(i));
  const NonFiniteReport r = unscale_and_check({a.tensor(), b.tensor()}, 0.5f);
  EXPECT_FALSE(r.found);
  EXPECT_TRUE(r.tensors.empty());
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(a.get(i), i * 0.5f);
}

// The rounding boundaries into float16 and bfloat16, in the vector body
// (element 3) and in the scalar tail (element 18) of a 19-element tensor.
TEST(UnscaleAndCheck, OverflowInTheDestinationIsNonFinite) {
  auto from_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  struct Case {
    DType dst;
    float value;
    bool overflows;
  };
  const Case cases[] = {
      {DType::kFloat16, 65519.0f, false},  // rounds to 65504
      {DType::kFloat16, std::nextafter(65520.0f, 0.0f), false},
      {DType::kFloat16, 65520.0f, true},   // ties to even: 65536 = Inf
      {DType::kFloat16, -70000.0f, true},
      {DType::kBFloat16, from_bits(0x7f7f7fffu), false},  // rounds to 0x7f7f
      {DType::kBFloat16, from_bits(0x7f7f8000u), true},   // ties to 0x7f80 = Inf
      {DType::kBFloat16, -from_bits(0x7f7fffffu), true},
      {DType::kFloat32, 3.4e38f, false},
  };
  for (const Case& c : cases) {
    for (int64_t pos : {3, 18}) {
      HostTensor master(DType::kFloat32, 19), model(c.dst, 19), ref(c.dst, 19);
      for (int64_t i = 0; i < 19; ++i) master.set(i, 1.0f);
      master.set(pos, c.value);
      const bool ref_found = test::reference_scale_copy(master, &ref, 1.0f);
      EXPECT_EQ(ref_found, c.overflows) << c.value;
      const NonFiniteReport r =
          scale_copy({master.tensor()}, {model.tensor()}, 1.0f);
      EXPECT_EQ(r.found, c.overflows) << dtype_name(c.dst) << " " << c.value << " at " << pos;
      EXPECT_TRUE(test::same_values(model, ref));
    }
  }
  // Scaling up can overflow in place, too.
  HostTensor g(DType::kFloat16, 17);
  for (int64_t i = 0; i < 17; ++i) g.set(i, 1.0f);
  g.set(5, 40000.0f);
  const NonFiniteReport r = unscale_and_check({g.tensor()}, 2.0f);
  EXPECT_TRUE(r.found);
  EXPECT_TRUE(std::isinf(g.get(5)));
  EXPECT_EQ(g.get(15), 2.0f);
}

TEST(UnscaleAndCheck, ScaleOneOnlyReads) {
  for (DType d : test::kAmpDTypes) {
    for (int64_t n : kSizes) {
      HostTensor t(d, n);
      std::mt19937 rng(static_cast<unsigned>(n));
      test::fill_random(&t, &rng, 5.0f, true);
      // Signalling-NaN-like payloads would change if written back through
      // a float32 round trip; a pure read keeps every bit.
      if (n > 2) {
        if (d == DType::kFloat32) {
          const uint32_t snan = 0x7f800001u;
          std::memcpy(t.bytes.data() + 4, &snan, 4);
        } else {
          const uint16_t snan = d == DType::kFloat16 ? 0x7c01 : 0x7f81;
          std::memcpy(t.bytes.data() + 2, &snan, 2);
        }
      }
      const std::vector<unsigned char> before = t.bytes;
      bool any = false;
      for (int64_t i = 0; i < n; ++i) any = any || test::non_finite_at(t.bytes.data(), d, i);
      EXPECT_EQ(check_finite({t.tensor()}).found, any) << dtype_name(d) << " n " << n;
      EXPECT_EQ(unscale_and_check({t.tensor()}, 1.0f).found, any);
      EXPECT_EQ(t.bytes, before) << dtype_name(d) << " n " << n;
    }
  }
}

TEST(MasterWeights, CopyAndGradsRoundTrip) {
  std::mt19937 rng(14);
  for (DType model : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<HostTensor> master, copy, grads, master_grads;
    std::vector<Tensor> mv, cv, gv, mgv;
    for (int64_t n : kSizes) {
      master.emplace_back(DType::kFloat32, n);
      test::fill_random(&master.back(), &rng, 3.0f, false);
      copy.emplace_back(model, n);
      copy.back().poison();
      grads.emplace_back(model, n);
      test::fill_random(&grads.back(), &rng, 30000.0f, false);
      master_grads.emplace_back(DType::kFloat32, n);
      master_grads.back().poison();
    }
    for (size_t i = 0; i < master.size(); ++i) {
      mv.push_back(master[i].tensor());
      cv.push_back(copy[i].tensor());
      gv.push_back(grads[i].tensor());
      mgv.push_back(master_grads[i].tensor());
    }
    EXPECT_FALSE(copy_master_to_model(mv, cv).found);
    EXPECT_FALSE(model_grads_to_master(gv, mgv, 1.0f / 32768).found);
    for (size_t i = 0; i < master.size(); ++i) {
      HostTensor ref(model, master[i].numel()), gref(DType::kFloat32, grads[i].numel());
      test::reference_scale_copy(master[i], &ref, 1.0f);
      test::reference_scale_copy(grads[i], &gref, 1.0f / 32768);
      EXPECT_TRUE(test::same_values(copy[i], ref)) << i;
      EXPECT_TRUE(test::same_values(master_grads[i], gref)) << i;
    }
  }
}

TEST(MultiTensorArgs, RejectsBadLists) {
  std::vector<float> a(8), b(9);
  std::vector<int32_t> ints(8);
  std::vector<uint16_t> h(8);
  auto expect_code = [](auto&& f, ErrorCode code) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
    }
  };
  expect_code([&] { scale_copy({Tensor::of(a)}, {Tensor::of(b)}, 1.0f); },
              ErrorCode::kInvalidArgument);
  expect_code([&] { scale_copy({Tensor::of(a)}, {}, 1.0f); }, ErrorCode::kInvalidArgument);
  expect_code([&] { unscale_and_check({Tensor::of(ints)}, 1.0f); },
              ErrorCode::kInvalidArgument);
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()})
    expect_code([&] { unscale_and_check({Tensor::of(a)}, bad); }, ErrorCode::kInvalidArgument);
  // Overlap that is not element-for-element.
  expect_code([&] {
    scale_copy({Tensor::of(a.data(), 4)}, {Tensor::of(a.data() + 2, 4)}, 1.0f);
  }, ErrorCode::kInvalidArgument);
  expect_code([&] {
    scale_copy({Tensor::of(a.data(), 4)},
               {Tensor(a.data(), DType::kFloat16, Shape{4})}, 1.0f);
  }, ErrorCode::kInvalidArgument);
  expect_code([&] {
    copy_master_to_model({Tensor(h.data(), DType::kFloat16, Shape{8})},
                         {Tensor(h.data(), DType::kFloat16, Shape{8})});
  }, ErrorCode::kInvalidArgument);
  float fake = 0;
  expect_code([&] {
    unscale_and_check({Tensor::of(a), Tensor(&fake, DType::kFloat32, Shape{1}, Device::cuda(0))},
                      0.5f);
  }, ErrorCode::kInvalidArgument);
}

// ---- norms ---------------------------------------------------------------------

double ref_sum_squares(const HostTensor& t, double* max_abs) {
  double s = 0, m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = t.get(i);
    s += v * v;
    m = std::isnan(v) || std::isnan(m) ? NAN : std::max(m, std::fabs(v));
  }
  *max_abs = m;
  return s;
}

TEST(Norms, MatchFloat64ReferenceOnRandomData) {
  std::mt19937 rng(15);
  for (DType d : test::kAmpDTypes) {
    std::vector<HostTensor> ts;
    std::vector<Tensor> views;
    for (int64_t n : kSizes) {
      ts.emplace_back(d, n);
      test::fill_random(&ts.back(), &rng, 2.0f, false);
    }
    for (auto& t : ts) views.push_back(t.tensor());
    const TensorNorms norms = multi_tensor_norms(views);
    ASSERT_EQ(norms.sum_squares.size(), ts.size());
    for (size_t i = 0; i < ts.size(); ++i) {
      double ref_max;
      const double ref = ref_sum_squares(ts[i], &ref_max);
      // float32 sums over at most one 64 Ki chunk: relative error well
      // below 1e-5 for positive terms.
      EXPECT_NEAR(norms.sum_squares[i], ref, 1e-5 * ref) << dtype_name(d) << " #" << i;
      EXPECT_EQ(norms.max_abs[i], ref_max) << dtype_name(d) << " #" << i;
    }
  }
}

TEST(Norms, ExactForSmallIntegerMultiples) {
  // Values k/4 with |k| <= 12: squares are multiples of 1/16 and every
  // partial sum stays exact in float32, so the result is exact.
  for (DType d : test::kAmpDTypes) {
    HostTensor t(d, 3 * 65536 + 5);
    double ref = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float v = static_cast<float>((i * 7) % 25 - 12) / 4.0f;
      t.set(i, v);
      ref += static_cast<double>(v) * v;
    }
    const TensorNorms n = multi_tensor_norms({t.tensor()});
    EXPECT_EQ(n.sum_squares[0], ref) << dtype_name(d);
    EXPECT_EQ(n.max_abs[0], 3.0);
  }
}

TEST(Norms, NaNAndInfPropagate) {
  for (DType d : test::kAmpDTypes) {
    HostTensor a(d, 1001), b(d, 1001), c(d, 5);
    for (int64_t i = 0; i < 1001; ++i) {
      a.set(i, 1.0f);
      b.set(i, 1.0f);
    }
    for (int64_t i = 0; i < 5; ++i) c.set(i, -2.0f);
    a.set(999, std::numeric_limits<float>::quiet_NaN());
    b.set(3, -std::numeric_limits<float>::infinity());
    const TensorNorms n = multi_tensor_norms({a.tensor(), b.tensor(), c.tensor()});
    EXPECT_TRUE(std::isnan(n.sum_squares[0]));
    EXPECT_TRUE(std::isnan(n.max_abs[0]));
    EXPECT_TRUE(std::isinf(n.sum_squares[1]));
    EXPECT_TRUE(std::isinf(n.max_abs[1]));
    EXPECT_EQ(n.sum_squares[2], 20.0);
    EXPECT_EQ(n.max_abs[2], 2.0);
  }
}

TEST(Norms, LargeFiniteValuesDoNotOverflow) {
  // 1e30^2 overflows float32; the prescaled second pass keeps it finite.
  HostTensor t(DType::kFloat32, 70000);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, i % 2 ? 1e30f : -3e29f);
  double ref_max;
  const double ref = ref_sum_squares(t, &ref_max);
  const TensorNorms n = multi_tensor_norms({t.tensor()});
  EXPECT_TRUE(std::isfinite(n.sum_squares[0]));
  EXPECT_NEAR(n.sum_squares[0], ref, 1e-5 * ref);
  EXPECT_EQ(n.max_abs[0], ref_max);
}

}  // namespace
}  // namespace amp
}  // namespace tutti
