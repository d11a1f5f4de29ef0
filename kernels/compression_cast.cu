// The cast compressor's conversion kernel (CPU reference:
// compression::cast_convert_cpu).
#include "kernels/compression_cast.h"

#include "kernels/compression_device.cuh"

namespace tutti {
namespace kernels {
namespace {

template <typename S, typename D>
__global__ void cast_convert_kernel(const S* src, D* dst, int64_t n,
                                    float divisor) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = dev::from_f32<D>(__fdiv_rn(dev::to_f32(src[i]), divisor));
}

}  // namespace

void launch_cast_convert(const void* src, DType src_dtype, void* dst,
                         DType dst_dtype, int64_t n, float divisor,
                         cudaStream_t stream) {
  TUTTI_ARG_CHECK(n >= 0, "cast_convert: negative element count ", n);
  TUTTI_ARG_CHECK(n == 0 || (src && dst), "cast_convert: null pointer for ", n,
                  " elements");
  TUTTI_ARG_CHECK(divisor > 0, "cast_convert: divisor ", divisor,
                  " must be > 0");
  TUTTI_ARG_CHECK(src != dst || dtype_size(src_dtype) == dtype_size(dst_dtype),
                  "cast_convert: in place needs equal element sizes, got ",
                  dtype_name(src_dtype), " -> ", dtype_name(dst_dtype));
  if (n == 0) return;
  dev::dispatch_float(src_dtype, "cast_convert", [&](auto s) {
    using S = decltype(s);
    dev::dispatch_float(dst_dtype, "cast_convert", [&](auto d) {
      using D = decltype(d);
      cast_convert_kernel<S, D><<<dev::grid_for(n), dev::kThreads, 0, stream>>>(
          static_cast<const S*>(src), static_cast<D*>(dst), n, divisor);
    });
  });
  TUTTI_LAUNCH_CHECK(stream);
}

}  // namespace kernels
}  // namespace tutti
