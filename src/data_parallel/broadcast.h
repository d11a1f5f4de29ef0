// Broadcast of many tensors (parameters, optimiser state) from one rank.
//
// Host tensors are packed, in list order, into runs of one dtype of at most
// `chunk_bytes` (pooled staging memory, so repeated calls do not allocate),
// and each run is one broadcast: a model of thousands of small tensors costs
// a few collectives instead of thousands.  A host tensor of chunk_bytes or
// more, a run of one tensor, and every CUDA tensor (NCCL, ordered on
// `stream`) are broadcast in place.  The runs depend only on the list's
// dtypes, sizes and devices, so ranks whose lists agree issue the same
// collectives.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/host_buffer.h"
#include "tutti/process_group.h"

namespace tutti {
namespace dp {

// Returns the number of broadcasts issued.
int broadcast_tensors(ProcessGroup& group, const std::vector<Tensor>& tensors,
                      const std::vector<std::string>& names, int root,
                      size_t chunk_bytes, HostBufferPool& pool,
                      const std::string& what, void* stream);

}  // namespace dp
}  // namespace tutti
