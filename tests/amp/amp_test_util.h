// Helpers shared by the amp tests: typed host buffers with planted special
// values, the scalar reference of scale_copy, and exact comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tutti/amp.h"
#include "tutti/tutti.h"

namespace tutti {
namespace amp {
namespace test {

const DType kAmpDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// Raw bits of element i (16 or 32 bits).
inline uint32_t bits_at(const void* p, DType d, int64_t i) {
  if (d == DType::kFloat32) {
    uint32_t u;
    std::memcpy(&u, static_cast<const float*>(p) + i, 4);
    return u;
  }
  return static_cast<const uint16_t*>(p)[i];
}

inline float value_at(const void* p, DType d, int64_t i) {
  const uint32_t b = bits_at(p, d, i);
  if (d == DType::kFloat32) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  return d == DType::kFloat16 ? half_to_float(static_cast<uint16_t>(b))
                              : bfloat16_to_float(static_cast<uint16_t>(b));
}

// Stores v rounded into d (the dtype.h reference conversions).
inline void store_at(void* p, DType d, int64_t i, float v) {
  if (d == DType::kFloat32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<uint16_t*>(p)[i] =
        d == DType::kFloat16 ? float_to_half(v) : float_to_bfloat16(v);
}

inline bool non_finite_at(const void* p, DType d, int64_t i) {
  const uint32_t b = bits_at(p, d, i);
  if (d == DType::kFloat32) return (b & 0x7fffffffu) >= 0x7f800000u;
  return (b & 0x7fffu) >= (d == DType::kFloat16 ? 0x7c00u : 0x7f80u);
}

// A host tensor with its own storage.
struct HostTensor {
  DType dtype;
  std::vector<unsigned char> bytes;
  HostTensor(DType d, int64_t n)
      : dtype(d), bytes(static_cast<size_t>(n) * dtype_size(d)) {}
  int64_t numel() const { return static_cast<int64_t>(bytes.size() / dtype_size(dtype)); }
  Tensor tensor() { return Tensor(bytes.data(), dtype, Shape{numel()}); }
  float get(int64_t i) const { return value_at(bytes.data(), dtype, i); }
  void set(int64_t i, float v) { store_at(bytes.data(), dtype, i, v); }
  uint32_t bits(int64_t i) const { return bits_at(bytes.data(), dtype, i); }
  // Every byte 0x7f: a NaN in float32, float16 and bfloat16 alike, so an
  // element a kernel forgot to write is noticed.
  void poison() { std::memset(bytes.data(), 0x7f, bytes.size()); }
};

// Random values with planted specials: about 1 in 64 elements is NaN,
// +-Inf, a subnormal of the type, or a value near the type's maximum
// (when `specials`), the rest uniform in [-range, range].
inline void fill_random(HostTensor* t, std::mt19937* rng, float range,
                        bool specials) {
  std::uniform_real_distribution<float> u(-range, range);
  std::uniform_int_distribution<int> pick(0, 63);
  const float big = t->dtype == DType::kFloat16 ? 60000.0f : 3.0e38f;
  const float tiny = t->dtype == DType::kFloat16 ? 3.0e-6f  // float16 subnormal
                     : t->dtype == DType::kBFloat16 ? 5.0e-39f
                                                    : 1.0e-40f;
  for (int64_t i = 0; i < t->numel(); ++i) {
    float v = u(*rng);
    if (specials) {
      switch (pick(*rng)) {
        case 0: v = std::numeric_limits<float>::quiet_NaN(); break;
        case 1: v = std::numeric_limits<float>::infinity(); break;
        case 2: v = -std::numeric_limits<float>::infinity(); break;
        case 3: v = tiny; break;
        case 4: v = -big; break;
        default: break;
      }
    }
    t->set(i, v);
  }
}

// The scalar reference of scale_copy for one pair: float32 multiply, one
// rounding into the destination; returns whether a stored value is
// non-finite.
inline bool reference_scale_copy(const HostTensor& src, HostTensor* dst,
                                 float scale) {
  bool found = false;
  for (int64_t i = 0; i < src.numel(); ++i) {
    dst->set(i, src.get(i) * scale);
    found = found || non_finite_at(dst->bytes.data(), dst->dtype, i);
  }
  return found;
}

// Exact comparison: bit-identical, except that any NaN matches any NaN
// (payloads differ between conversion units).
inline ::testing::AssertionResult same_values(const HostTensor& a,
                                              const HostTensor& b) {
  if (a.numel() != b.numel() || a.dtype != b.dtype)
    return ::testing::AssertionFailure() << "shape or dtype differ";
  for (int64_t i = 0; i < a.numel(); ++i) {
    const bool nan_a = std::isnan(a.get(i)), nan_b = std::isnan(b.get(i));
    if (nan_a && nan_b) continue;
    if (a.bits(i) != b.bits(i))
      return ::testing::AssertionFailure()
             << dtype_name(a.dtype) << "[" << a.numel() << "] element " << i
             << ": " << a.get(i) << " (0x" << std::hex << a.bits(i) << ") vs "
             << b.get(i) << " (0x" << b.bits(i) << std::dec << ")";
  }
  return ::testing::AssertionSuccess();
}

// The scaler's state tensors, concatenated.
inline std::vector<unsigned char> state_bytes(DynamicLossScaler* s) {
  std::vector<unsigned char> out;
  for (const NamedTensor& t : s->state_dict()) {
    const auto* p = static_cast<const unsigned char*>(t.tensor.data());
    out.insert(out.end(), p, p + t.tensor.nbytes());
  }
  return out;
}

}  // namespace test
}  // namespace amp
}  // namespace tutti
