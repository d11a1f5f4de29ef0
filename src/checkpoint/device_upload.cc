#include "checkpoint/device_upload.h"

#include "core/check.h"
#include "core/cuda_utils.h"

namespace tutti {
namespace ckpt {

#if TUTTI_WITH_CUDA

namespace {
cudaStream_t as_stream(void* p) { return static_cast<cudaStream_t>(p); }
cudaEvent_t as_event(void* p) { return static_cast<cudaEvent_t>(p); }
}  // namespace

void* DeviceUpload::stream(int device) {
  auto it = streams_.find(device);
  if (it != streams_.end()) return it->second;
  cuda::DeviceGuard g(device);
  cudaStream_t s = nullptr;
  // Blocking (not cudaStreamNonBlocking): ordered with the legacy stream.
  TUTTI_CUDA_CHECK(cudaStreamCreate(&s));
  streams_[device] = s;
  return s;
}

void DeviceUpload::wait_for(int b) {
  for (int d : pending_[b]) {
    cuda::DeviceGuard g(d);
    TUTTI_CUDA_CHECK(cudaEventSynchronize(as_event(events_[b].at(d))));
  }
  pending_[b].clear();
}

unsigned char* DeviceUpload::buffer() {
  wait_for(cur_);
  if (!buf_[cur_].data()) buf_[cur_] = pool_.acquire(static_cast<size_t>(kChunk));
  return buf_[cur_].as<unsigned char>();
}

void DeviceUpload::copy(const Tensor& dst, uint64_t dst_byte, const unsigned char* from,
                        size_t n) {
  if (n == 0) return;
  const int d = dst.device().index;
  cudaStream_t s = as_stream(stream(d));
  cuda::DeviceGuard g(d);
  TUTTI_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst.data()) + dst_byte, from, n,
                                   cudaMemcpyHostToDevice, s));
  used_.insert(d);
}

void DeviceUpload::flip() {
  for (int d : used_) {
    cuda::DeviceGuard g(d);
    void*& e = events_[cur_][d];
    if (!e) {
      cudaEvent_t ev = nullptr;
      TUTTI_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      e = ev;
    }
    TUTTI_CUDA_CHECK(cudaEventRecord(as_event(e), as_stream(stream(d))));
    pending_[cur_].insert(d);
  }
  used_.clear();
  cur_ ^= 1;
}

void DeviceUpload::finish() {
  flip();
  for (auto& kv : streams_) {
    cuda::DeviceGuard g(kv.first);
    TUTTI_CUDA_CHECK(cudaStreamSynchronize(as_stream(kv.second)));
  }
  pending_[0].clear();
  pending_[1].clear();
}

DeviceUpload::~DeviceUpload() {
  // A DMA must never read a buffer the pool hands out again.
  for (auto& kv : streams_) {
    try {
      cuda::DeviceGuard g(kv.first);
      cudaStreamSynchronize(as_stream(kv.second));
      cudaStreamDestroy(as_stream(kv.second));
    } catch (const Error&) {  // the device is gone: nothing left in flight
    }
  }
  for (auto& per : events_)
    for (auto& kv : per) {
      try {
        cuda::DeviceGuard g(kv.first);
        cudaEventDestroy(as_event(kv.second));
      } catch (const Error&) {
      }
    }
  for (auto& b : buf_)
    if (b.data()) pool_.release(std::move(b));
}

#else  // !TUTTI_WITH_CUDA

unsigned char* DeviceUpload::buffer() {
  if (!buf_[cur_].data()) buf_[cur_] = pool_.acquire(static_cast<size_t>(kChunk));
  return buf_[cur_].as<unsigned char>();
}

void DeviceUpload::copy(const Tensor& dst, uint64_t, const unsigned char*, size_t) {
  TUTTI_THROW(kUnsupported, "a checkpoint load reached a tensor on ", dst.device().str(),
              " in a build without CUDA support");
}

void DeviceUpload::flip() { cur_ ^= 1; }
void DeviceUpload::finish() {}
void* DeviceUpload::stream(int) { return nullptr; }
void DeviceUpload::wait_for(int) {}

DeviceUpload::~DeviceUpload() {
  for (auto& b : buf_)
    if (b.data()) pool_.release(std::move(b));
}

#endif  // TUTTI_WITH_CUDA

}  // namespace ckpt
}  // namespace tutti
