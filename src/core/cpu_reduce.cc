#include "core/cpu_reduce.h"

#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "core/fast_convert.h"

namespace tutti {
namespace {

template <typename T>
struct SumOp {
  static T apply(T a, T b) { return a + b; }
};
template <typename T>
struct ProdOp {
  static T apply(T a, T b) { return a * b; }
};
template <typename T>
struct MinOp {
  static T apply(T a, T b) {
    if (std::isnan(static_cast<double>(a)) || std::isnan(static_cast<double>(b)))
      return std::isnan(static_cast<double>(a)) ? a : b;
    return b < a ? b : a;
  }
};
template <typename T>
struct MaxOp {
  static T apply(T a, T b) {
    if (std::isnan(static_cast<double>(a)) || std::isnan(static_cast<double>(b)))
      return std::isnan(static_cast<double>(a)) ? a : b;
    return b > a ? b : a;
  }
};
// Integer min/max/sum/prod without the NaN checks; sum/prod wrap.
template <typename T>
struct IntOps {
  using U = typename std::make_unsigned<T>::type;
  static T sum(T a, T b) { return static_cast<T>(static_cast<U>(a) + static_cast<U>(b)); }
  static T prod(T a, T b) { return static_cast<T>(static_cast<U>(a) * static_cast<U>(b)); }
};

template <typename T, typename Op>
void loop(const void* in, void* inout, size_t n) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (size_t i = 0; i < n; ++i) b[i] = Op::apply(b[i], a[i]);
}

template <typename T>
void float_reduce(ReduceOp op, const void* in, void* inout, size_t n) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return loop<T, SumOp<T>>(in, inout, n);
    case ReduceOp::kProd: return loop<T, ProdOp<T>>(in, inout, n);
    case ReduceOp::kMin: return loop<T, MinOp<T>>(in, inout, n);
    case ReduceOp::kMax: return loop<T, MaxOp<T>>(in, inout, n);
  }
}

template <typename T>
void int_reduce(ReduceOp op, const void* in, void* inout, size_t n) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < n; ++i) b[i] = IntOps<T>::sum(b[i], a[i]);
      return;
    case ReduceOp::kProd:
      for (size_t i = 0; i < n; ++i) b[i] = IntOps<T>::prod(b[i], a[i]);
      return;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) b[i] = a[i] < b[i] ? a[i] : b[i];
      return;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) b[i] = a[i] > b[i] ? a[i] : b[i];
      return;
  }
}

// 16-bit floats: widen a block to float32, reduce, round back.
void half_reduce(DType dtype, ReduceOp op, const void* in, void* inout,
                 size_t n) {
  constexpr size_t kBlock = 1024;
  float fa[kBlock], fb[kBlock];
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  const bool half = dtype == DType::kFloat16;
  for (size_t off = 0; off < n; off += kBlock) {
    const size_t m = n - off < kBlock ? n - off : kBlock;
    if (half) {
      f16_to_f32(a + off, fa, m);
      f16_to_f32(b + off, fb, m);
    } else {
      bf16_to_f32(a + off, fa, m);
      bf16_to_f32(b + off, fb, m);
    }
    float_reduce<float>(op, fa, fb, m);
    if (half)
      f32_to_f16(fb, b + off, m);
    else
      f32_to_bf16(fb, b + off, m);
  }
}

}  // namespace

void reduce_inplace(DType dtype, ReduceOp op, const void* in, void* inout,
                    size_t n) {
  if (n == 0) return;
  switch (dtype) {
    case DType::kFloat32: return float_reduce<float>(op, in, inout, n);
    case DType::kFloat64: return float_reduce<double>(op, in, inout, n);
    case DType::kFloat16:
    case DType::kBFloat16: return half_reduce(dtype, op, in, inout, n);
    case DType::kInt8: return int_reduce<int8_t>(op, in, inout, n);
    case DType::kUInt8: return int_reduce<uint8_t>(op, in, inout, n);
    case DType::kInt32: return int_reduce<int32_t>(op, in, inout, n);
    case DType::kInt64: return int_reduce<int64_t>(op, in, inout, n);
  }
}

void divide_inplace(DType dtype, void* x, size_t n, int64_t divisor) {
  TUTTI_CHECK(divisor > 0);
  if (divisor == 1 || n == 0) return;
  switch (dtype) {
    case DType::kFloat32: {
      float* p = static_cast<float*>(x);
      const float d = static_cast<float>(divisor);
      for (size_t i = 0; i < n; ++i) p[i] /= d;
      return;
    }
    case DType::kFloat64: {
      double* p = static_cast<double*>(x);
      const double d = static_cast<double>(divisor);
      for (size_t i = 0; i < n; ++i) p[i] /= d;
      return;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      constexpr size_t kBlock = 1024;
      float f[kBlock];
      uint16_t* p = static_cast<uint16_t*>(x);
      const float d = static_cast<float>(divisor);
      const bool half = dtype == DType::kFloat16;
      for (size_t off = 0; off < n; off += kBlock) {
        const size_t m = n - off < kBlock ? n - off : kBlock;
        half ? f16_to_f32(p + off, f, m) : bf16_to_f32(p + off, f, m);
        for (size_t i = 0; i < m; ++i) f[i] /= d;
        half ? f32_to_f16(f, p + off, m) : f32_to_bf16(f, p + off, m);
      }
      return;
    }
    case DType::kInt8: { auto* p = static_cast<int8_t*>(x); for (size_t i = 0; i < n; ++i) p[i] = static_cast<int8_t>(p[i] / divisor); return; }
    case DType::kUInt8: { auto* p = static_cast<uint8_t*>(x); for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(p[i] / divisor); return; }
    case DType::kInt32: { auto* p = static_cast<int32_t*>(x); for (size_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(p[i] / divisor); return; }
    case DType::kInt64: { auto* p = static_cast<int64_t*>(x); for (size_t i = 0; i < n; ++i) p[i] = p[i] / divisor; return; }
  }
}

}  // namespace tutti
