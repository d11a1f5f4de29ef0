#include "data_parallel/unflatten.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/fast_convert.h"

namespace tutti {
namespace dp {
namespace {

template <typename T, typename A>
void divide_copy(const void* src, void* dst, int64_t n, int64_t divisor) {
  const T* s = static_cast<const T*>(src);
  T* d = static_cast<T*>(dst);
  const A div = static_cast<A>(divisor);
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<T>(static_cast<A>(s[i]) / div);
}

// 16-bit floats: widen a block to float32, divide, round back once.
void divide_copy_16(const uint16_t* s, uint16_t* d, int64_t n, int64_t divisor,
                    bool bf16) {
  constexpr int64_t kBlock = 1024;
  float tmp[kBlock];
  const float div = static_cast<float>(divisor);
  for (int64_t at = 0; at < n; at += kBlock) {
    const size_t m = static_cast<size_t>(std::min(kBlock, n - at));
    if (bf16)
      bf16_to_f32(s + at, tmp, m);
    else
      f16_to_f32(s + at, tmp, m);
    for (size_t i = 0; i < m; ++i) tmp[i] /= div;
    if (bf16)
      f32_to_bf16(tmp, d + at, m);
    else
      f32_to_f16(tmp, d + at, m);
  }
}

}  // namespace

std::vector<kernels::UnflattenChunk> make_unflatten_chunks(
    DType dtype, const std::vector<UnflattenSlot>& slots, int64_t chunk_elems) {
  TUTTI_CHECK(chunk_elems > 0);
  const size_t es = dtype_size(dtype);
  std::vector<kernels::UnflattenChunk> chunks;
  for (const auto& s : slots) {
    for (int64_t at = 0; at < s.numel; at += chunk_elems) {
      kernels::UnflattenChunk c;
      c.dst = static_cast<char*>(s.dst) + static_cast<size_t>(at) * es;
      c.src_offset = s.offset + at;
      c.numel = std::min(chunk_elems, s.numel - at);
      chunks.push_back(c);
    }
  }
  return chunks;
}

void unflatten_scale_cpu(const void* flat, DType dtype,
                         const kernels::UnflattenChunk* chunks,
                         size_t num_chunks, int64_t divisor) {
  TUTTI_ARG_CHECK(divisor >= 1, "unflatten_scale: divisor ", divisor,
                  " must be >= 1");
  const size_t es = dtype_size(dtype);
  for (size_t k = 0; k < num_chunks; ++k) {
    const kernels::UnflattenChunk& c = chunks[k];
    const void* src = static_cast<const char*>(flat) + static_cast<size_t>(c.src_offset) * es;
    if (divisor == 1) {
      std::memcpy(c.dst, src, static_cast<size_t>(c.numel) * es);
      continue;
    }
    switch (dtype) {
      case DType::kFloat32: divide_copy<float, float>(src, c.dst, c.numel, divisor); break;
      case DType::kFloat64: divide_copy<double, double>(src, c.dst, c.numel, divisor); break;
      case DType::kFloat16:
      case DType::kBFloat16:
        divide_copy_16(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(c.dst),
                       c.numel, divisor, dtype == DType::kBFloat16);
        break;
      case DType::kInt8: divide_copy<int8_t, int64_t>(src, c.dst, c.numel, divisor); break;
      case DType::kUInt8: divide_copy<uint8_t, int64_t>(src, c.dst, c.numel, divisor); break;
      case DType::kInt32: divide_copy<int32_t, int64_t>(src, c.dst, c.numel, divisor); break;
      case DType::kInt64: divide_copy<int64_t, int64_t>(src, c.dst, c.numel, divisor); break;
    }
  }
}

}  // namespace dp
}  // namespace tutti
