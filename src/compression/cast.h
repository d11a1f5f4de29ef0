// fp16 / bf16 cast compression: pre-divide by the world size, all-reduce in
// the 16-bit type, write back in the gradient's dtype.
#pragma once

#include <memory>
#include <string>

#include "compression/common.h"

namespace tutti {
namespace compression {

// dst[i] = dst_dtype(float(src[i]) / divisor), one rounding to nearest even
// (the CPU reference of kernels::launch_cast_convert).  src == dst allowed
// when the element sizes match.
void cast_convert_cpu(const void* src, DType src_dtype, void* dst,
                      DType dst_dtype, int64_t n, float divisor);

// cast_convert_cpu, or its CUDA twin for a CUDA `device` (on `stream`).
void cast_convert(Device device, const void* src, DType src_dtype, void* dst,
                  DType dst_dtype, int64_t n, float divisor, void* stream);

// wire: DType::kFloat16 ("fp16") or DType::kBFloat16 ("bf16").
// state_prefix: "" for the default "compressor/fp16" / "compressor/bf16".
std::shared_ptr<BucketCompressor> make_cast_compressor(
    DType wire, const std::string& state_prefix = "");

}  // namespace compression
}  // namespace tutti
