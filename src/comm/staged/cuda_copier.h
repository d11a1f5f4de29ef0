// The staged transport's copies for CUDA tensors (copier.h): asynchronous
// cudaMemcpyAsync between the device and pinned staging memory on the
// communicator's own stream, ordered after the caller's stream by an event
// recorded at submission.  Every call sets the device first (a
// cuda::DeviceGuard), whichever thread makes it: the caller's at
// submission, the communicator's engine, a thread waiting for the op.
#pragma once

#include <memory>

#include "comm/staged/copier.h"

namespace tutti {
namespace staged {

// Error(kUnsupported) in a build without CUDA.
std::unique_ptr<Copier> make_cuda_copier(int device);

}  // namespace staged
}  // namespace tutti
