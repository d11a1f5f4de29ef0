// Element types and exact conversions between them.
//
// tutti moves raw bytes; a DType says how to interpret them.  The 16-bit
// float conversions below are the reference every kernel is tested against:
// round-to-nearest-even, NaN stays NaN (quiet, sign kept), overflow becomes
// +-Inf, subnormals are produced and consumed exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tutti/export.h"

namespace tutti {

enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat64 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kInt64 = 7,
};

constexpr int kNumDTypes = 8;

// Bytes per element.
TUTTI_API size_t dtype_size(DType dtype);
// Canonical lower-case name: "float32", "float16", "bfloat16", "float64",
// "int8", "uint8", "int32", "int64".
TUTTI_API const char* dtype_name(DType dtype);
// Short name used by safetensors: "F32", "F16", "BF16", "F64", "I8", "U8",
// "I32", "I64".
TUTTI_API const char* dtype_safetensors_name(DType dtype);
// Parses either naming (and "float", "half", "bf16", "fp16", "fp32", "double").
// Throws tutti::Error(kInvalidArgument) for an unknown name.
TUTTI_API DType dtype_from_name(const std::string& name);
TUTTI_API bool dtype_is_floating(DType dtype);

// ---- 16-bit floating point -------------------------------------------------

// IEEE 754 binary16 <-> binary32.
TUTTI_API float half_to_float(uint16_t bits);
TUTTI_API uint16_t float_to_half(float value);
// bfloat16 (the upper 16 bits of a binary32) <-> binary32.
inline float bfloat16_to_float(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof(f));
  return f;
}
TUTTI_API uint16_t float_to_bfloat16(float value);

// Storage types for the 16-bit formats.  They are plain 2-byte values so
// arrays of them alias the tensor memory the caller owns.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  explicit Half(float f) : bits(float_to_half(f)) {}
  static Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
  explicit operator float() const { return half_to_float(bits); }
};

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) : bits(float_to_bfloat16(f)) {}
  static BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
  explicit operator float() const { return bfloat16_to_float(bits); }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2, "16-bit storage");

// Maps a C++ element type to its DType (float, double, Half, BFloat16,
// int8_t, uint8_t, int32_t, int64_t).
template <typename T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kFloat32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kFloat64; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::kFloat16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::kBFloat16; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::kInt8; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kUInt8; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kInt64; };

// Converts n elements from src (of src_dtype) to dst (of dst_dtype) on the
// CPU.  Float -> float conversions round to nearest even and keep NaN/Inf.
// Float -> integer truncates toward zero, saturates at the integer range and
// maps NaN to 0.  Integer -> integer saturates.  src and dst may be the same
// pointer only when both dtypes have the same size.
TUTTI_API void convert(const void* src, DType src_dtype, void* dst,
                       DType dst_dtype, size_t n);

// Element i of a buffer as double / written from double, for tests and slow
// paths (the same rounding rules as convert()).
TUTTI_API double load_as_double(const void* data, DType dtype, size_t i);
TUTTI_API void store_from_double(void* data, DType dtype, size_t i, double v);

}  // namespace tutti
