#include "amp/cuda_multi_tensor.h"

#include <cstring>

#include "core/check.h"
#include "core/cuda_utils.h"

#if TUTTI_WITH_CUDA
#include "kernels/amp_norm.h"
#include "kernels/amp_scale_copy.h"
#endif

namespace tutti {
namespace amp {

#if TUTTI_WITH_CUDA
namespace {

// Stream-ordered scratch memory (cudaMallocAsync draws from the device's
// pool, so a step does not pay for cudaMalloc), freed in stream order.
// Devices without memory pools fall back to cudaMalloc/cudaFree (cudaFree
// synchronises, and every caller waits for the stream anyway).
class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes == 0) return;
    const cudaError_t e = cudaMallocAsync(&ptr_, bytes, stream);
    if (e == cudaErrorNotSupported) {
      cudaGetLastError();
      async_ = false;
      TUTTI_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
    } else {
      TUTTI_CUDA_CHECK(e);
    }
  }
  ~StreamScratch() {
    if (!ptr_) return;
    if (async_)
      cudaFreeAsync(ptr_, stream_);
    else
      cudaFree(ptr_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
  bool async_ = true;
};

}  // namespace

NonFiniteReport cuda_scale_copy(const std::vector<MtaEntry>& entries,
                                int device, float scale, void* stream) {
  NonFiniteReport report;
  if (entries.empty()) return report;
  cuda::DeviceGuard guard(device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const size_t bytes = entries.size() * sizeof(int32_t);
  StreamScratch flags(bytes, s);
  TUTTI_CUDA_CHECK(cudaMemsetAsync(flags.as<int32_t>(), 0, bytes, s));
  MtaPlanner planner(entries);
  MtaTable table;
  while (planner.next(&table))
    launch_amp_scale_copy(table, scale, flags.as<int32_t>(), s);
  std::vector<int32_t> host(entries.size());
  TUTTI_CUDA_CHECK(cudaMemcpyAsync(host.data(), flags.as<int32_t>(), bytes,
                                   cudaMemcpyDeviceToHost, s));
  TUTTI_CUDA_CHECK(cudaStreamSynchronize(s));
  for (size_t i = 0; i < host.size(); ++i)
    if (host[i]) report.tensors.push_back(static_cast<int>(i));
  report.found = !report.tensors.empty();
  return report;
}

void cuda_norms(const std::vector<MtaEntry>& entries, int device, void* stream,
                std::vector<double>* sum_squares, std::vector<double>* max_abs) {
  sum_squares->assign(entries.size(), 0.0);
  max_abs->assign(entries.size(), 0.0);
  MtaPlanner planner(entries);
  const int64_t chunks = planner.total_chunks();
  if (chunks == 0) return;
  cuda::DeviceGuard guard(device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  StreamScratch partials(static_cast<size_t>(chunks) * sizeof(float2), s);
  MtaTable table;
  while (planner.next(&table))
    launch_amp_norm_partials(table, partials.as<float2>(), s);
  std::vector<float2> host(static_cast<size_t>(chunks));
  TUTTI_CUDA_CHECK(cudaMemcpyAsync(host.data(), partials.as<float2>(),
                                   host.size() * sizeof(float2),
                                   cudaMemcpyDeviceToHost, s));
  TUTTI_CUDA_CHECK(cudaStreamSynchronize(s));
  // Partials are dense in list order: tensor i owns mta_chunks(numel_i)
  // consecutive entries.
  size_t g = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    double sum = 0;
    uint32_t max_bits = 0;
    for (int64_t c = 0; c < mta_chunks(entries[i].numel); ++c, ++g) {
      sum += host[g].x;
      uint32_t b;
      std::memcpy(&b, &host[g].y, 4);
      max_bits = b > max_bits ? b : max_bits;
    }
    float m;
    std::memcpy(&m, &max_bits, 4);
    (*sum_squares)[i] = sum;
    (*max_abs)[i] = m;
  }
}

#else  // !TUTTI_WITH_CUDA

NonFiniteReport cuda_scale_copy(const std::vector<MtaEntry>&, int, float,
                                void*) {
  TUTTI_THROW(kUnsupported, "amp: CUDA tensors in a build without CUDA");
}

void cuda_norms(const std::vector<MtaEntry>&, int, void*, std::vector<double>*,
                std::vector<double>*) {
  TUTTI_THROW(kUnsupported, "amp: CUDA tensors in a build without CUDA");
}

#endif  // TUTTI_WITH_CUDA

}  // namespace amp
}  // namespace tutti
