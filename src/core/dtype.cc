// DType facts and the CPU reference conversions.
//
// Rounding rules (the contract kernels are tested against):
//  * float -> 16-bit float: round to nearest, ties to even; NaN stays a quiet
//    NaN with its sign; values that round past the largest finite value
//    become +-Inf; subnormal results are exact-rounded.
//  * double -> 16-bit float: via float with round-to-odd, which makes the
//    two-step conversion a single correct rounding (float keeps >= 2 extra
//    bits beyond half/bfloat16 precision).
//  * float -> integer: truncate toward zero, saturate, NaN -> 0.
//  * integer -> integer: saturate.
#include "tutti/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "core/fast_convert.h"

namespace tutti {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kFloat64: return 8;
    case DType::kInt8: return 1;
    case DType::kUInt8: return 1;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
  }
  TUTTI_THROW(kInvalidArgument, "unknown dtype code ", static_cast<int>(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat64: return "float64";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
  }
  return "invalid";
}

const char* dtype_safetensors_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "F32";
    case DType::kFloat16: return "F16";
    case DType::kBFloat16: return "BF16";
    case DType::kFloat64: return "F64";
    case DType::kInt8: return "I8";
    case DType::kUInt8: return "U8";
    case DType::kInt32: return "I32";
    case DType::kInt64: return "I64";
  }
  return "invalid";
}

DType dtype_from_name(const std::string& name) {
  static const struct {
    const char* name;
    DType dtype;
  } kNames[] = {
      {"float32", DType::kFloat32}, {"F32", DType::kFloat32},
      {"float", DType::kFloat32},   {"fp32", DType::kFloat32},
      {"float16", DType::kFloat16}, {"F16", DType::kFloat16},
      {"half", DType::kFloat16},    {"fp16", DType::kFloat16},
      {"bfloat16", DType::kBFloat16}, {"BF16", DType::kBFloat16},
      {"bf16", DType::kBFloat16},   {"float64", DType::kFloat64},
      {"F64", DType::kFloat64},     {"double", DType::kFloat64},
      {"int8", DType::kInt8},       {"I8", DType::kInt8},
      {"uint8", DType::kUInt8},     {"U8", DType::kUInt8},
      {"int32", DType::kInt32},     {"I32", DType::kInt32},
      {"int64", DType::kInt64},     {"I64", DType::kInt64},
  };
  for (const auto& n : kNames)
    if (name == n.name) return n.dtype;
  TUTTI_THROW(kInvalidArgument, "unknown dtype '", name,
              "' (expected float32, float16, bfloat16, float64, int8, uint8, "
              "int32 or int64)");
}

bool dtype_is_floating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16 || dtype == DType::kFloat64;
}

// ---- 16-bit floats ---------------------------------------------------------

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      // Subnormal: mant * 2^-24, exact in float.
      float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
      std::memcpy(&bits, &f, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    // Inf, or NaN keeping its payload and quieted (as F16C hardware does).
    bits = sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

uint16_t float_to_half(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint32_t out;
  if (x >= 0x47800000u) {  // |v| >= 65536, Inf or NaN
    if (x > 0x7f800000u)
      out = 0x7e00u | ((x >> 13) & 0x3ffu);  // quiet NaN, payload kept
    else
      out = 0x7c00u;
  } else if (x < 0x38800000u) {  // |v| < 2^-14: subnormal or zero
    // Adding 0.5 shifts the value so the FPU's own round-to-nearest-even
    // produces the subnormal mantissa in the low bits.
    float f;
    std::memcpy(&f, &x, 4);
    f += 0.5f;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    out = u - 0x3f000000u;
  } else {
    const uint32_t mant_odd = (x >> 13) & 1u;
    x += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23), round RNE
    out = x >> 13;                // a carry into the exponent gives Inf
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

uint16_t float_to_bfloat16(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  const uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

namespace {

// Rounding to odd into float: truncate toward zero, then set the last bit if
// anything was lost.  A later round-to-nearest-even to a format with at least
// two fewer bits is then a single correct rounding of the wide value.  W is
// double, or long double (exact for every int64 on x86-64).
template <typename W>
float to_float_round_odd(W d) {
  float f = static_cast<float>(d);
  if (!std::isfinite(f) || static_cast<W>(f) == d) return f;
  if (std::fabs(static_cast<W>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u |= 1u;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename I, typename F>
I float_to_int_sat(F v) {
  if (std::isnan(v)) return 0;
  const F lo = static_cast<F>(std::numeric_limits<I>::min());
  // max() may round up when converted to F; compare with >= on that value.
  const F hi = static_cast<F>(std::numeric_limits<I>::max());
  if (v <= lo) return std::numeric_limits<I>::min();
  if (v >= hi) return std::numeric_limits<I>::max();
  return static_cast<I>(v);  // truncates toward zero
}

template <typename I>
I int_to_int_sat(int64_t v) {
  if (v < static_cast<int64_t>(std::numeric_limits<I>::min()))
    return std::numeric_limits<I>::min();
  if (v > static_cast<int64_t>(std::numeric_limits<I>::max()))
    return std::numeric_limits<I>::max();
  return static_cast<I>(v);
}

// Widened value of a source element: float for 32-bit-and-narrower floats,
// double for float64, int64 for integers.  All three widenings are exact.
template <typename S> struct Wide;
template <> struct Wide<float> { static float get(float v) { return v; } };
template <> struct Wide<Half> { static float get(Half v) { return half_to_float(v.bits); } };
template <> struct Wide<BFloat16> { static float get(BFloat16 v) { return bfloat16_to_float(v.bits); } };
template <> struct Wide<double> { static double get(double v) { return v; } };
template <> struct Wide<int8_t> { static int64_t get(int8_t v) { return v; } };
template <> struct Wide<uint8_t> { static int64_t get(uint8_t v) { return v; } };
template <> struct Wide<int32_t> { static int64_t get(int32_t v) { return v; } };
template <> struct Wide<int64_t> { static int64_t get(int64_t v) { return v; } };

template <typename D> D from_wide(float v);
template <typename D> D from_wide(double v);
template <typename D> D from_wide(int64_t v);

template <> float from_wide<float>(float v) { return v; }
template <> double from_wide<double>(float v) { return v; }
template <> Half from_wide<Half>(float v) { return Half::from_bits(float_to_half(v)); }
template <> BFloat16 from_wide<BFloat16>(float v) { return BFloat16::from_bits(float_to_bfloat16(v)); }
template <> int8_t from_wide<int8_t>(float v) { return float_to_int_sat<int8_t>(v); }
template <> uint8_t from_wide<uint8_t>(float v) { return float_to_int_sat<uint8_t>(v); }
template <> int32_t from_wide<int32_t>(float v) { return float_to_int_sat<int32_t>(v); }
template <> int64_t from_wide<int64_t>(float v) { return float_to_int_sat<int64_t>(v); }

template <> float from_wide<float>(double v) { return static_cast<float>(v); }
template <> double from_wide<double>(double v) { return v; }
template <> Half from_wide<Half>(double v) { return Half::from_bits(float_to_half(to_float_round_odd(v))); }
template <> BFloat16 from_wide<BFloat16>(double v) { return BFloat16::from_bits(float_to_bfloat16(to_float_round_odd(v))); }
template <> int8_t from_wide<int8_t>(double v) { return float_to_int_sat<int8_t>(v); }
template <> uint8_t from_wide<uint8_t>(double v) { return float_to_int_sat<uint8_t>(v); }
template <> int32_t from_wide<int32_t>(double v) { return float_to_int_sat<int32_t>(v); }
template <> int64_t from_wide<int64_t>(double v) { return float_to_int_sat<int64_t>(v); }

template <> float from_wide<float>(int64_t v) { return static_cast<float>(v); }
template <> double from_wide<double>(int64_t v) { return static_cast<double>(v); }
template <> Half from_wide<Half>(int64_t v) { return Half::from_bits(float_to_half(to_float_round_odd(static_cast<long double>(v)))); }
template <> BFloat16 from_wide<BFloat16>(int64_t v) { return BFloat16::from_bits(float_to_bfloat16(to_float_round_odd(static_cast<long double>(v)))); }
template <> int8_t from_wide<int8_t>(int64_t v) { return int_to_int_sat<int8_t>(v); }
template <> uint8_t from_wide<uint8_t>(int64_t v) { return int_to_int_sat<uint8_t>(v); }
template <> int32_t from_wide<int32_t>(int64_t v) { return int_to_int_sat<int32_t>(v); }
template <> int64_t from_wide<int64_t>(int64_t v) { return v; }

template <typename S, typename D>
void convert_loop(const void* src, void* dst, size_t n) {
  const S* s = static_cast<const S*>(src);
  D* d = static_cast<D*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = from_wide<D>(Wide<S>::get(s[i]));
}

template <typename S>
void convert_from(const void* src, void* dst, DType dst_dtype, size_t n) {
  switch (dst_dtype) {
    case DType::kFloat32: return convert_loop<S, float>(src, dst, n);
    case DType::kFloat16: return convert_loop<S, Half>(src, dst, n);
    case DType::kBFloat16: return convert_loop<S, BFloat16>(src, dst, n);
    case DType::kFloat64: return convert_loop<S, double>(src, dst, n);
    case DType::kInt8: return convert_loop<S, int8_t>(src, dst, n);
    case DType::kUInt8: return convert_loop<S, uint8_t>(src, dst, n);
    case DType::kInt32: return convert_loop<S, int32_t>(src, dst, n);
    case DType::kInt64: return convert_loop<S, int64_t>(src, dst, n);
  }
}

}  // namespace

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype,
             size_t n) {
  if (n == 0) return;
  if (src_dtype == dst_dtype) {
    if (src != dst) std::memmove(dst, src, n * dtype_size(src_dtype));
    return;
  }
  // Bulk fast paths (bit-identical to the scalar loops below).
  const bool f32_src = src_dtype == DType::kFloat32;
  const bool f32_dst = dst_dtype == DType::kFloat32;
  if (f32_src && dst_dtype == DType::kFloat16 && src != dst)
    return f32_to_f16(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
  if (f32_src && dst_dtype == DType::kBFloat16 && src != dst)
    return f32_to_bf16(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
  if (f32_dst && src_dtype == DType::kFloat16 && src != dst)
    return f16_to_f32(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
  if (f32_dst && src_dtype == DType::kBFloat16 && src != dst)
    return bf16_to_f32(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
  TUTTI_ARG_CHECK(src != dst || dtype_size(src_dtype) == dtype_size(dst_dtype),
                  "convert ", dtype_name(src_dtype), " -> ",
                  dtype_name(dst_dtype),
                  ": in-place conversion needs equal element sizes");
  switch (src_dtype) {
    case DType::kFloat32: return convert_from<float>(src, dst, dst_dtype, n);
    case DType::kFloat16: return convert_from<Half>(src, dst, dst_dtype, n);
    case DType::kBFloat16: return convert_from<BFloat16>(src, dst, dst_dtype, n);
    case DType::kFloat64: return convert_from<double>(src, dst, dst_dtype, n);
    case DType::kInt8: return convert_from<int8_t>(src, dst, dst_dtype, n);
    case DType::kUInt8: return convert_from<uint8_t>(src, dst, dst_dtype, n);
    case DType::kInt32: return convert_from<int32_t>(src, dst, dst_dtype, n);
    case DType::kInt64: return convert_from<int64_t>(src, dst, dst_dtype, n);
  }
}

double load_as_double(const void* data, DType dtype, size_t i) {
  double out;
  convert(static_cast<const char*>(data) + i * dtype_size(dtype), dtype, &out,
          DType::kFloat64, 1);
  return out;
}

void store_from_double(void* data, DType dtype, size_t i, double v) {
  convert(&v, DType::kFloat64, static_cast<char*>(data) + i * dtype_size(dtype),
          dtype, 1);
}

}  // namespace tutti
