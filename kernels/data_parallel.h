// Data-parallel kernels: the fused write-back of a reduced bucket.
//
// unflatten_scale copies every slot of a flat bucket back into its gradient
// tensor and divides by the group size in the same pass.  The bucket is cut
// into chunks of at most kUnflattenChunkElems elements, each inside one
// slot; one CUDA block handles one chunk (the multi-tensor-apply layout), so
// a bucket of any number of tensors is one launch.  The chunk table is built
// once per bucket at plan time and lives in device memory.
//
// Element semantics (shared with the CPU twin in
// src/data_parallel/unflatten.h, which tests compare against):
//  * float32 / float64: x / divisor, IEEE division in the element type;
//  * float16 / bfloat16: computed in float32, rounded once (nearest even);
//  * integers: C++ division (truncation toward zero);
//  * divisor 1 is a plain copy.
#pragma once

#include <cstdint>

#include "tutti/dtype.h"

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tutti {
namespace kernels {

struct UnflattenChunk {
  void* dst;           // first destination element of this chunk
  int64_t src_offset;  // element offset in the flat bucket
  int64_t numel;       // 1 .. kUnflattenChunkElems
};

constexpr int64_t kUnflattenChunkElems = int64_t{1} << 14;

#if TUTTI_WITH_CUDA
// `chunks` is a device array of `num_chunks` entries; `flat` and every dst
// are device memory of `dtype`.  Asynchronous on `stream`.
void launch_unflatten_scale(const void* flat, DType dtype,
                            const UnflattenChunk* chunks, int num_chunks,
                            int64_t divisor, cudaStream_t stream);
#endif

}  // namespace kernels
}  // namespace tutti
