// Conversions against an independent reference: the nearest representable
// value found by searching the sorted list of every finite 16-bit value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/fast_convert.h"
#include "tutti/dtype.h"
#include "tutti/error.h"

namespace tutti {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Every non-negative finite value of a 16-bit format, ascending, as doubles
// paired with their bit patterns; plus the overflow threshold.
struct Format {
  std::vector<std::pair<double, uint16_t>> values;
  double max_finite;
  double overflow_at;  // |x| >= this rounds to Inf (halfway past max)
  uint16_t inf_bits;
};

Format make_format(bool half) {
  Format f;
  for (uint32_t b = 0; b < 0x8000u; ++b) {
    double v;
    if (half) {
      if (((b >> 10) & 0x1f) == 0x1f) continue;  // Inf/NaN
      v = half_to_float(static_cast<uint16_t>(b));
    } else {
      if (((b >> 7) & 0xff) == 0xff) continue;
      v = bfloat16_to_float(static_cast<uint16_t>(b));
    }
    f.values.emplace_back(v, static_cast<uint16_t>(b));
  }
  std::sort(f.values.begin(), f.values.end());
  f.max_finite = f.values.back().first;
  const double ulp = f.max_finite - f.values[f.values.size() - 2].first;
  f.overflow_at = f.max_finite + ulp / 2;
  f.inf_bits = half ? 0x7c00 : 0x7f80;
  return f;
}

// Correct round-to-nearest-even of a finite double.
uint16_t reference_round(const Format& f, double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= f.overflow_at) return sign | f.inf_bits;
  auto it = std::lower_bound(f.values.begin(), f.values.end(),
                             std::make_pair(a, uint16_t{0}));
  if (it == f.values.end()) return sign | f.values.back().second;
  if (it->first == a) return sign | it->second;
  const auto hi = *it, lo = *(it - 1);
  const double dlo = a - lo.first, dhi = hi.first - a;
  if (dlo < dhi) return sign | lo.second;
  if (dhi < dlo) return sign | hi.second;
  return sign | ((lo.second & 1) ? hi.second : lo.second);  // tie: even
}

std::vector<float> interesting_floats() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f,
                          65520.0f, 65536.0f, 1e-8f, 5.96e-8f, 2.98e-8f,
                          2.9802322e-8f, 6.1035156e-5f, 6.1e-5f,
                          3.3895314e38f, 3.4e38f,
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::min()};
  std::mt19937 rng(42);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    float f = float_of(any(rng));
    if (std::isfinite(f)) v.push_back(f);
  }
  // Exact halfway points between neighbouring halves (ties), and one float
  // ulp either side of them.
  for (uint32_t b = 0; b < 0x7bff; b += 7) {
    const double lo = half_to_float(static_cast<uint16_t>(b));
    const double hi = half_to_float(static_cast<uint16_t>(b + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    v.push_back(mid);
    v.push_back(std::nextafter(mid, 0.0f));
    v.push_back(std::nextafter(mid, 1e9f));
    v.push_back(-mid);
  }
  // Random values in each format's normal and subnormal ranges.
  std::uniform_real_distribution<float> small(-7e-5f, 7e-5f), mid(-70000.f, 70000.f);
  for (int i = 0; i < 100000; ++i) {
    v.push_back(small(rng));
    v.push_back(mid(rng));
  }
  return v;
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kFloat32), 4u);
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kInt64), 8u);
  EXPECT_STREQ(dtype_name(DType::kBFloat16), "bfloat16");
  EXPECT_STREQ(dtype_safetensors_name(DType::kFloat16), "F16");
  for (int d = 0; d < kNumDTypes; ++d) {
    const DType t = static_cast<DType>(d);
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
    EXPECT_EQ(dtype_from_name(dtype_safetensors_name(t)), t);
  }
  EXPECT_THROW(dtype_from_name("float8"), Error);
}

TEST(DType, HalfRoundTripsEveryBitPattern) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = half_to_float(h);
    const uint16_t back = float_to_half(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(half_to_float(back))) << std::hex << b;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << "NaN sign kept";
    } else {
      ASSERT_EQ(back, h) << std::hex << b;
    }
  }
}

TEST(DType, BFloat16RoundTripsEveryBitPattern) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = bfloat16_to_float(h);
    const uint16_t back = float_to_bfloat16(f);
    if (std::isnan(f))
      ASSERT_TRUE(std::isnan(bfloat16_to_float(back))) << std::hex << b;
    else
      ASSERT_EQ(back, h) << std::hex << b;
  }
}

TEST(DType, FloatToHalfMatchesReferenceRounding) {
  const Format f = make_format(true);
  for (float x : interesting_floats())
    ASSERT_EQ(float_to_half(x), reference_round(f, x))
        << "x=" << x << " bits=" << std::hex << bits_of(x);
}

TEST(DType, FloatToBFloat16MatchesReferenceRounding) {
  const Format f = make_format(false);
  for (float x : interesting_floats())
    ASSERT_EQ(float_to_bfloat16(x), reference_round(f, x))
        << "x=" << x << " bits=" << std::hex << bits_of(x);
}

TEST(DType, NaNAndInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(float_to_half(inf), 0x7c00);
  EXPECT_EQ(float_to_half(-inf), 0xfc00);
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(nan))));
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(-nan))));
  // A signalling NaN whose payload lives only in the low bits must not
  // become Inf.
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(float_of(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(float_of(0x7f800001u)))));
  EXPECT_EQ(float_to_bfloat16(inf), 0x7f80);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00) << "halfway past max rounds to Inf";
  EXPECT_EQ(float_to_half(65519.996f), 0x7bff);
}

TEST(DType, BulkConversionsAreBitIdentical) {
  std::vector<float> xs = interesting_floats();
  xs.push_back(std::numeric_limits<float>::infinity());
  xs.push_back(-std::numeric_limits<float>::infinity());
  xs.push_back(float_of(0x7fc00123u));
  xs.push_back(float_of(0xff800001u));
  std::vector<uint16_t> h(xs.size()), b(xs.size());
  f32_to_f16(xs.data(), h.data(), xs.size());
  f32_to_bf16(xs.data(), b.data(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(h[i], float_to_half(xs[i])) << i << " x=" << xs[i];
    ASSERT_EQ(b[i], float_to_bfloat16(xs[i])) << i << " x=" << xs[i];
  }
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> back(65536);
  f16_to_f32(all.data(), back.data(), all.size());
  for (uint32_t i = 0; i < 65536; ++i)
    ASSERT_EQ(bits_of(back[i]), bits_of(half_to_float(all[i]))) << std::hex << i;
  bf16_to_f32(all.data(), back.data(), all.size());
  for (uint32_t i = 0; i < 65536; ++i)
    ASSERT_EQ(bits_of(back[i]), bits_of(bfloat16_to_float(all[i])));
}

TEST(DType, DoubleToHalfIsOneCorrectRounding) {
  // 1 + 2^-11 + 2^-40 lies just above the midpoint between 1 and 1 + 2^-10.
  // Rounding to float first would land exactly on the midpoint and then tie
  // to even (1.0): a double rounding error.  The correct answer rounds up.
  const double x = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  uint16_t h;
  convert(&x, DType::kFloat64, &h, DType::kFloat16, 1);
  EXPECT_EQ(h, float_to_half(1.0f + 1.0f / 1024));
  const double y = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  uint16_t b;
  convert(&y, DType::kFloat64, &b, DType::kBFloat16, 1);
  EXPECT_EQ(b, float_to_bfloat16(1.0f + 1.0f / 128));
  // Random doubles against the reference.
  const Format f = make_format(true);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> d(-70000.0, 70000.0);
  for (int i = 0; i < 100000; ++i) {
    const double v = d(rng);
    convert(&v, DType::kFloat64, &h, DType::kFloat16, 1);
    ASSERT_EQ(h, reference_round(f, v)) << v;
  }
}

TEST(DType, IntegerConversionsSaturate) {
  const float fs[] = {1e10f, -1e10f, 3.9f, -3.9f,
                      std::numeric_limits<float>::quiet_NaN(), 127.5f, -0.5f};
  int8_t i8[7];
  convert(fs, DType::kFloat32, i8, DType::kInt8, 7);
  EXPECT_EQ(i8[0], 127);
  EXPECT_EQ(i8[1], -128);
  EXPECT_EQ(i8[2], 3);
  EXPECT_EQ(i8[3], -3);
  EXPECT_EQ(i8[4], 0) << "NaN -> 0";
  EXPECT_EQ(i8[5], 127);
  EXPECT_EQ(i8[6], 0);
  uint8_t u8[7];
  convert(fs, DType::kFloat32, u8, DType::kUInt8, 7);
  EXPECT_EQ(u8[1], 0);
  EXPECT_EQ(u8[0], 255);
  const int64_t big[] = {std::numeric_limits<int64_t>::max(), -5, 300};
  int32_t i32[3];
  convert(big, DType::kInt64, i32, DType::kInt32, 3);
  EXPECT_EQ(i32[0], std::numeric_limits<int32_t>::max());
  EXPECT_EQ(i32[1], -5);
  uint8_t u[3];
  convert(big, DType::kInt64, u, DType::kUInt8, 3);
  EXPECT_EQ(u[2], 255);
  EXPECT_EQ(u[1], 0);
  // int64 -> float16 beyond the range is Inf; exact small ints stay exact.
  uint16_t h[3];
  convert(big, DType::kInt64, h, DType::kFloat16, 3);
  EXPECT_EQ(h[0], 0x7c00);
  EXPECT_EQ(half_to_float(h[1]), -5.0f);
  EXPECT_EQ(half_to_float(h[2]), 300.0f);
}

TEST(DType, EveryPairConverts) {
  const double vals[] = {0, 1, -2, 3.5, 100, -100};
  for (int s = 0; s < kNumDTypes; ++s)
    for (int d = 0; d < kNumDTypes; ++d) {
      const DType sd = static_cast<DType>(s), dd = static_cast<DType>(d);
      for (double v : vals) {
        unsigned char src[8], dst[8];
        store_from_double(src, sd, 0, v);
        const double stored = load_as_double(src, sd, 0);
        convert(src, sd, dst, dd, 1);
        double expect = stored;
        if (!dtype_is_floating(dd)) {
          expect = std::trunc(stored);
          if (dd == DType::kUInt8 && expect < 0) expect = 0;
        }
        EXPECT_EQ(load_as_double(dst, dd, 0), expect)
            << dtype_name(sd) << " -> " << dtype_name(dd) << " of " << v;
      }
    }
}

}  // namespace
}  // namespace tutti
