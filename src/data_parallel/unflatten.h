// The fused write-back of a reduced bucket on the host: the CPU twin of
// kernels/data_parallel.cu (same chunk table, same element semantics), and
// the builder of the chunk table both use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/data_parallel.h"

namespace tutti {
namespace dp {

// One destination tensor of a bucket.
struct UnflattenSlot {
  void* dst;       // the gradient's memory
  int64_t offset;  // element offset in the bucket
  int64_t numel;
};

// Cuts the slots into chunks of at most `chunk_elems` elements (empty slots
// produce no chunk).
std::vector<kernels::UnflattenChunk> make_unflatten_chunks(
    DType dtype, const std::vector<UnflattenSlot>& slots,
    int64_t chunk_elems = kernels::kUnflattenChunkElems);

// dst = flat[src_offset ..] / divisor for every chunk (see
// kernels/data_parallel.h for the rounding rules).  divisor >= 1.
void unflatten_scale_cpu(const void* flat, DType dtype,
                         const kernels::UnflattenChunk* chunks,
                         size_t num_chunks, int64_t divisor);

}  // namespace dp
}  // namespace tutti
