// Shared pieces of the GPU benchmarks (bench/gpu/*.cc): device choice, a
// device buffer, CUDA-event timing with warm-ups and medians, and the row
// format every figure is printed in, each beside a device-to-device copy of
// the same bytes measured in the same process.
//
// Traffic is counted as bytes read + bytes written once (a D2D copy of b
// bytes moves 2b), so "ratio" = the operation's GB/s over the copy's GB/s is
// the fraction of the copy engine's / HBM's practical bandwidth the
// operation reaches.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tutti/tutti.h"

namespace gpubench {

// ctest / gpu_check.sh: "skipped" (no device).
constexpr int kSkipExitCode = 77;

inline void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(file) + ":" + std::to_string(line) +
                             ": " + what + ": " + cudaGetErrorString(e));
}
#define GB_CUDA(x) ::gpubench::check((x), #x, __FILE__, __LINE__)

// The device for this rank (local rank modulo the visible devices), set as
// current; -1 with a printed reason when there is none.
inline int pick_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device: skipped\n");
    return -1;
  }
  const int dev = tutti::local_rank() % n;
  GB_CUDA(cudaSetDevice(dev));
  return dev;
}

inline std::string device_name(int dev) {
  cudaDeviceProp p{};
  GB_CUDA(cudaGetDeviceProperties(&p, dev));
  return p.name;
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) GB_CUDA(cudaMalloc(&ptr_, bytes));
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  char* at(size_t byte) const { return static_cast<char*>(ptr_) + byte; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// n elements of `dtype` with values in [-100, 100) (a fixed pattern: finite,
// varied magnitudes and signs), copied to `dst`.
inline void fill(void* dst, tutti::DType dtype, int64_t n, int salt = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] =
        static_cast<float>(((i * 2654435761u + salt * 97u) % 20000u) / 100.0 - 100.0);
  std::vector<unsigned char> bytes(static_cast<size_t>(n) * tutti::dtype_size(dtype));
  tutti::convert(v.data(), tutti::DType::kFloat32, bytes.data(), dtype, v.size());
  GB_CUDA(cudaMemcpy(dst, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
}

// Median milliseconds per call of f over `reps` samples of `iters` calls,
// timed with CUDA events on `stream` after `warmup` calls.  f must enqueue
// its GPU work on `stream` (or wait for it itself).
inline double median_ms(cudaStream_t stream, int iters, int reps,
                        const std::function<void()>& f, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) f();
  GB_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  GB_CUDA(cudaEventCreate(&start));
  GB_CUDA(cudaEventCreate(&stop));
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    GB_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < iters; ++i) f();
    GB_CUDA(cudaEventRecord(stop, stream));
    GB_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    GB_CUDA(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(static_cast<double>(ms) / iters);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// The peer: a D2D copy of `bytes` bytes (traffic 2 x bytes) on `stream`.
inline double copy_ms(cudaStream_t stream, size_t bytes, int iters, int reps) {
  DeviceBuffer a(bytes), b(bytes);
  GB_CUDA(cudaMemset(a.get(), 1, bytes));
  return median_ms(stream, iters, reps, [&] {
    GB_CUDA(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream));
  });
}

inline double gbps(double traffic_bytes, double ms) { return traffic_bytes / (ms * 1e6); }

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A checkpoint's worth of CUDA state: `tensors` float32 tensors of equal
// size, about `mb` MiB in all, views into one device buffer filled with
// fill()'s pattern, named "model/t<i>" (bench_gpu_snapshot,
// bench_gpu_recovery).
class CudaState {
 public:
  CudaState(int dev, int64_t mb, int tensors)
      : per(static_cast<size_t>(mb) * (1 << 20) / tensors / 4 * 4),
        count(tensors),
        buffer(per * tensors) {
    refill();
    for (int i = 0; i < tensors; ++i)
      dict.push_back({"model/t" + std::to_string(i),
                      tutti::Tensor(buffer.at(i * per), tutti::DType::kFloat32,
                                    tutti::Shape{static_cast<int64_t>(per / 4)},
                                    tutti::Device::cuda(dev)),
                      tutti::ShardInfo{}});
  }
  size_t bytes() const { return per * count; }
  void refill() { fill(buffer.get(), tutti::DType::kFloat32, static_cast<int64_t>(bytes() / 4)); }

  const size_t per;  // bytes per tensor
  const int count;
  DeviceBuffer buffer;
  tutti::StateDict dict;
};

inline std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (bytes >= 1024 && u < 3) bytes /= 1024, ++u;
  char s[32];
  std::snprintf(s, sizeof s, "%.0f %s", bytes, units[u]);
  return s;
}

// Markdown table of operation vs D2D copy of the same traffic, plus an
// optional tab-separated copy for scripts (bench/gpu/torch_peers.py joins
// tutti's unscale rows with torch's).
class Table {
 public:
  explicit Table(FILE* tsv = nullptr) : tsv_(tsv) {}
  void header(const std::string& title) {
    std::printf("\n### %s\n\n", title.c_str());
    std::printf("| operation | elements | traffic | time µs | GB/s | D2D copy GB/s | ratio |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  }
  // traffic: bytes read + written by the operation; peer_ms: a D2D copy
  // of traffic / 2 bytes.
  void row(const std::string& op, int64_t elements, double traffic,
           double ms, double peer_ms) {
    const double g = gbps(traffic, ms), pg = gbps(traffic, peer_ms);
    std::printf("| %s | %lld | %s | %.1f | %.1f | %.1f | %.2f |\n", op.c_str(),
                static_cast<long long>(elements), human(traffic).c_str(),
                ms * 1e3, g, pg, g / pg);
    if (tsv_)
      std::fprintf(tsv_, "%s\t%lld\t%.3f\t%.3f\t%.3f\n", op.c_str(),
                   static_cast<long long>(elements), ms * 1e3, g, pg);
    std::fflush(stdout);
  }

 private:
  FILE* tsv_;
};

// A benchmark's main after argument parsing: initialises tutti, picks the
// device (77 without one), creates a non-blocking stream, runs body and
// turns an exception into exit status 1 with the message.
inline int run(const char* name,
               const std::function<void(int dev, const tutti::ProcessGroupPtr& world,
                                        cudaStream_t stream)>& body) {
  tutti::init();
  int rc = 0;
  try {
    const int dev = pick_device();
    if (dev < 0) {
      rc = kSkipExitCode;
    } else {
      cudaStream_t s;
      GB_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      body(dev, tutti::world(), s);
      GB_CUDA(cudaStreamSynchronize(s));
      cudaStreamDestroy(s);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    rc = 1;
  }
  tutti::shutdown();
  return rc;
}

// "1M,16M" -> {1<<20, 16<<20}; plain numbers are elements.
inline std::vector<int64_t> parse_sizes(const std::string& s) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(pos, end - pos);
    int64_t mult = 1;
    if (!item.empty() && (item.back() == 'K' || item.back() == 'M')) {
      mult = item.back() == 'K' ? 1024 : 1024 * 1024;
      item.pop_back();
    }
    out.push_back(std::stoll(item) * mult);
    pos = end + 1;
  }
  return out;
}

}  // namespace gpubench
