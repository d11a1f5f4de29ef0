// CudaCopier: events and async copies on one stream per communicator.
#include "comm/staged/cuda_copier.h"

#include "core/check.h"

#if TUTTI_WITH_CUDA
#include <chrono>

#include "comm/backoff.h"
#include "core/cuda_utils.h"
#endif

namespace tutti {
namespace staged {

#if TUTTI_WITH_CUDA

namespace {

// Polls `ready` (device set by the caller) with the MPI waits' backoff;
// false once `timeout_s` (> 0) passed without it.
template <typename Ready>
bool poll(Ready ready, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(timeout_s > 0 ? timeout_s : 0));
  comm::Backoff backoff = comm::Backoff::from_settings();
  for (;;) {
    if (ready()) return true;
    const comm::Backoff::Step step = backoff.next_and_pause();
    if (timeout_s > 0 && step.check_clock && Clock::now() > deadline) return ready();
  }
}

class CudaCopies : public OpCopies {
 public:
  // On the caller's thread at submission: marks the caller's stream.
  CudaCopies(int device, std::shared_ptr<cuda::Stream> stream, cudaStream_t user)
      : device_(device), stream_(std::move(stream)), user_(user), ready_(device),
        staged_(device), done_(device) {
    ready_.record(user_);
  }

  void to_host(void* dst, const void* src, size_t bytes) override {
    cuda::DeviceGuard g(device_);
    order();
    if (bytes)
      TUTTI_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_->get()));
  }

  bool wait_host(double timeout_s) override {
    cuda::DeviceGuard g(device_);
    order();
    staged_.record(stream_->get());
    return poll([this] { return staged_.query(); }, timeout_s);
  }

  void to_device(void* dst, const void* src, size_t bytes) override {
    cuda::DeviceGuard g(device_);
    order();
    if (bytes)
      TUTTI_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_->get()));
  }

  void finish() override {
    cuda::DeviceGuard g(device_);
    order();
    done_.record(stream_->get());
  }

  void stream_wait() override {
    cuda::DeviceGuard g(device_);
    TUTTI_CUDA_CHECK(cudaStreamWaitEvent(user_, done_.get(), 0));
  }

  bool done() override { return done_.query(); }

 private:
  // The communication stream waits for the caller's stream as it was at
  // submission, once, before the op's first copy (device set).
  void order() {
    if (ordered_) return;
    TUTTI_CUDA_CHECK(cudaStreamWaitEvent(stream_->get(), ready_.get(), 0));
    ordered_ = true;
  }

  const int device_;
  std::shared_ptr<cuda::Stream> stream_;  // outlives the communicator if need be
  const cudaStream_t user_;
  cuda::Event ready_;   // the caller's stream at submission
  cuda::Event staged_;  // the device-to-host copies (and all before them)
  cuda::Event done_;    // the host-to-device copies
  bool ordered_ = false;
};

class CudaCopier : public Copier {
 public:
  explicit CudaCopier(int device)
      : device_(device), stream_(std::make_shared<cuda::Stream>(device)) {}
  Device device() const override { return Device::cuda(device_); }
  bool pinned() const override { return true; }
  std::unique_ptr<Copier> another() const override {
    return std::make_unique<CudaCopier>(device_);
  }
  std::unique_ptr<OpCopies> begin(void* stream) override {
    cuda::DeviceGuard g(device_);
    return std::make_unique<CudaCopies>(device_, stream_, static_cast<cudaStream_t>(stream));
  }
  bool quiesce(double timeout_s) override {
    cuda::DeviceGuard g(device_);
    return poll(
        [this] {
          const cudaError_t e = cudaStreamQuery(stream_->get());
          if (e == cudaErrorNotReady) return false;
          TUTTI_CUDA_CHECK(e);
          return true;
        },
        timeout_s);
  }

 private:
  const int device_;
  std::shared_ptr<cuda::Stream> stream_;
};

}  // namespace

std::unique_ptr<Copier> make_cuda_copier(int device) {
  return std::make_unique<CudaCopier>(device);
}

#else  // !TUTTI_WITH_CUDA

std::unique_ptr<Copier> make_cuda_copier(int device) {
  TUTTI_THROW(kUnsupported, "a tensor on cuda:", device,
              " needs CUDA, but this build of tutti has none (rebuild with "
              "-DTUTTI_WITH_CUDA=ON)");
}

#endif

}  // namespace staged
}  // namespace tutti
