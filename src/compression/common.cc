#include "compression/common.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "compression/hash.h"
#include "core/fast_convert.h"
#include "tutti/log.h"

#if TUTTI_WITH_CUDA
#include "kernels/compression_common.h"
#endif

namespace tutti {
namespace compression {
namespace {

#if TUTTI_WITH_CUDA
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
#else
[[noreturn]] void no_cuda(const char* what) {
  TUTTI_THROW(kUnsupported, what,
              " on a CUDA tensor, but this build of tutti has no CUDA support");
}
#endif

}  // namespace

// ---- memory ----------------------------------------------------------------

DeviceArray::DeviceArray(Device device, size_t bytes)
    : device_(device), bytes_(bytes) {
  if (device.is_cpu()) {
    host_ = HostBuffer(bytes);
    if (bytes) std::memset(host_.data(), 0, bytes);
    return;
  }
#if TUTTI_WITH_CUDA
  dev_ = cuda::DeviceBuffer(device.index, bytes);
  if (bytes) {
    cuda::DeviceGuard g(device.index);
    TUTTI_CUDA_CHECK(cudaMemset(dev_.data(), 0, bytes));
  }
#else
  no_cuda("allocating compressor state");
#endif
}

void* DeviceArray::data() const {
#if TUTTI_WITH_CUDA
  if (device_.is_cuda()) return dev_.data();
#endif
  return host_.data();
}

Tensor DeviceArray::view(DType dtype, int64_t offset, Shape shape) const {
  const size_t es = dtype_size(dtype);
  TUTTI_CHECK_LE(static_cast<size_t>(offset + shape.numel()) * es, bytes_,
                 "view of ", shape.str(), " at ", offset);
  return Tensor(static_cast<char*>(data()) + offset * es, dtype, shape,
                device_);
}

Tensor DeviceArray::flat(DType dtype) const {
  return view(dtype, 0, Shape{static_cast<int64_t>(bytes_ / dtype_size(dtype))});
}

GatherExchange::GatherExchange(Device device, int64_t block_words)
    : device_(device), words_(block_words),
      send_(device, static_cast<size_t>(block_words) * 4) {}

const uint32_t* GatherExchange::exchange(Communicator* comm,
                                         const OpOptions& options) {
  const int world = comm->size();
  if (world != world_) {
    gathered_ = DeviceArray(device_, static_cast<size_t>(world) * words_ * 4);
    world_ = world;
  }
  comm->allgather(send_.flat(DType::kInt32), gathered_.flat(DType::kInt32),
                  options);
  return gathered_.as<uint32_t>();
}

void append_state_tensor(StateDict* out, const std::string& name,
                         const Tensor& tensor) {
  NamedTensor nt;
  nt.name = name;
  nt.tensor = tensor;
  out->push_back(std::move(nt));
}

void copy_bytes(Device device, void* dst, const void* src, size_t bytes,
                void* stream) {
  if (bytes == 0 || dst == src) return;
  if (device.is_cpu()) {
    std::memmove(dst, src, bytes);
    return;
  }
#if TUTTI_WITH_CUDA
  TUTTI_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                   as_stream(stream)));
#else
  no_cuda("copy");
#endif
}

void zero_bytes(Device device, void* dst, size_t bytes, void* stream) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    std::memset(dst, 0, bytes);
    return;
  }
#if TUTTI_WITH_CUDA
  TUTTI_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, as_stream(stream)));
#else
  no_cuda("fill");
#endif
}

void fill_nan_bytes(Device device, void* dst, size_t bytes, void* stream) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    std::memset(dst, 0xFF, bytes);
    return;
  }
#if TUTTI_WITH_CUDA
  TUTTI_CUDA_CHECK(cudaMemsetAsync(dst, 0xFF, bytes, as_stream(stream)));
#else
  no_cuda("fill");
#endif
}

namespace {
// Synchronous copy between host memory and `device` in either direction.
void host_transfer(Device device, void* dst, const void* src, size_t bytes,
                   void* stream, bool to_device) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    std::memmove(dst, src, bytes);
    return;
  }
#if TUTTI_WITH_CUDA
  TUTTI_CUDA_CHECK(cudaMemcpyAsync(
      dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
      as_stream(stream)));
  TUTTI_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
#else
  no_cuda("copy");
#endif
}
}  // namespace

void copy_from_host(Device device, void* dst, const void* host, size_t bytes,
                    void* stream) {
  host_transfer(device, dst, host, bytes, stream, true);
}

void copy_to_host(Device device, void* host, const void* src, size_t bytes,
                  void* stream) {
  host_transfer(device, host, src, bytes, stream, false);
}

void sync_stream(Device device, void* stream) {
  if (device.is_cpu()) return;
#if TUTTI_WITH_CUDA
  TUTTI_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
#else
  no_cuda("synchronize");
#endif
}

// ---- float32 staging -------------------------------------------------------

namespace cpu {
namespace {
constexpr int64_t kBlock = 1024;

// Calls f(block_ptr, offset, count) with float32 blocks of src.
template <typename F>
void for_f32_blocks(const void* src, DType dtype, int64_t n, F f) {
  float tmp[kBlock];
  for (int64_t off = 0; off < n; off += kBlock) {
    const int64_t m = n - off < kBlock ? n - off : kBlock;
    load_f32(static_cast<const char*>(src) + off * dtype_size(dtype), dtype,
             tmp, m);
    f(tmp, off, m);
  }
}
}  // namespace

void load_f32(const void* src, DType dtype, float* dst, int64_t n) {
  if (n <= 0) return;
  const size_t un = static_cast<size_t>(n);
  switch (dtype) {
    case DType::kFloat32:
      if (dst != src) std::memmove(dst, src, un * 4);
      return;
    case DType::kFloat16:
      f16_to_f32(static_cast<const uint16_t*>(src), dst, un);
      return;
    case DType::kBFloat16:
      bf16_to_f32(static_cast<const uint16_t*>(src), dst, un);
      return;
    case DType::kFloat64: {
      const double* s = static_cast<const double*>(src);
      for (size_t i = 0; i < un; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    default:
      TUTTI_THROW(kInvalidArgument, "compression needs a floating-point "
                  "gradient, got ", dtype_name(dtype));
  }
}

bool any_nonfinite(const void* src, DType dtype, int64_t n) {
  const size_t un = n > 0 ? static_cast<size_t>(n) : 0;
  bool bad = false;
  switch (dtype) {
    case DType::kFloat32: {
      const float* s = static_cast<const float*>(src);
      for (size_t i = 0; i < un; ++i) bad |= !std::isfinite(s[i]);
      return bad;
    }
    case DType::kFloat64: {
      const double* s = static_cast<const double*>(src);
      for (size_t i = 0; i < un; ++i) bad |= !std::isfinite(s[i]);
      return bad;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      // All-ones exponent: Inf or NaN.
      const uint16_t e = dtype == DType::kFloat16 ? 0x7c00u : 0x7f80u;
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < un; ++i) bad |= (s[i] & e) == e;
      return bad;
    }
    default:
      TUTTI_THROW(kInvalidArgument, "compression needs a floating-point "
                  "gradient, got ", dtype_name(dtype));
  }
}

void accumulate_f32(const void* src, DType dtype, float* acc, int64_t n) {
  if (dtype == DType::kFloat32) {
    const float* s = static_cast<const float*>(src);
    for (int64_t i = 0; i < n; ++i) acc[i] += s[i];
    return;
  }
  for_f32_blocks(src, dtype, n, [&](const float* b, int64_t off, int64_t m) {
    for (int64_t i = 0; i < m; ++i) acc[off + i] += b[i];
  });
}

void store_f32(const float* src, float divisor, void* dst, DType dtype,
               int64_t n) {
  if (n <= 0) return;
  const size_t un = static_cast<size_t>(n);
  switch (dtype) {
    case DType::kFloat32: {
      float* d = static_cast<float*>(dst);
      if (divisor == 1.0f) {
        if (d != src) std::memmove(d, src, un * 4);
      } else {
        for (size_t i = 0; i < un; ++i) d[i] = src[i] / divisor;
      }
      return;
    }
    case DType::kFloat64: {
      double* d = static_cast<double*>(dst);
      for (size_t i = 0; i < un; ++i) d[i] = static_cast<double>(src[i] / divisor);
      return;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      float tmp[kBlock];
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t off = 0; off < un; off += kBlock) {
        const size_t m = un - off < kBlock ? un - off : kBlock;
        for (size_t i = 0; i < m; ++i) tmp[i] = src[off + i] / divisor;
        if (dtype == DType::kFloat16)
          f32_to_f16(tmp, d + off, m);
        else
          f32_to_bf16(tmp, d + off, m);
      }
      return;
    }
    default:
      TUTTI_THROW(kInvalidArgument, "compression needs a floating-point "
                  "gradient, got ", dtype_name(dtype));
  }
}
}  // namespace cpu

void accumulate_f32(Device device, const void* src, DType dtype, float* acc,
                    int64_t n, void* stream) {
  if (n <= 0) return;
  if (device.is_cpu()) return cpu::accumulate_f32(src, dtype, acc, n);
#if TUTTI_WITH_CUDA
  kernels::launch_accumulate_f32(src, dtype, acc, n, as_stream(stream));
#else
  no_cuda("accumulate_f32");
#endif
}

void load_f32(Device device, const void* src, DType dtype, float* dst,
              int64_t n, void* stream) {
  if (n <= 0) return;
  if (device.is_cpu()) return cpu::load_f32(src, dtype, dst, n);
#if TUTTI_WITH_CUDA
  kernels::launch_load_f32(src, dtype, dst, n, as_stream(stream));
#else
  no_cuda("load_f32");
#endif
}

void store_f32(Device device, const float* src, float divisor, void* dst,
               DType dtype, int64_t n, void* stream) {
  if (n <= 0) return;
  if (device.is_cpu()) return cpu::store_f32(src, divisor, dst, dtype, n);
#if TUTTI_WITH_CUDA
  kernels::launch_store_f32(src, divisor, dst, dtype, n, as_stream(stream));
#else
  no_cuda("store_f32");
#endif
}

void nonfinite_flag(Device device, const void* src, DType dtype, int64_t n,
                    int32_t* flag, void* stream) {
  if (device.is_cpu()) {
    *flag = cpu::any_nonfinite(src, dtype, n) ? 1 : 0;
    return;
  }
#if TUTTI_WITH_CUDA
  kernels::launch_nonfinite_flag(src, dtype, n, flag, as_stream(stream));
#else
  no_cuda("nonfinite_flag");
#endif
}

float hash_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return hash_uniform_hd(seed, stream, index);
}

// ---- traffic ---------------------------------------------------------------

uint64_t wire_bytes(const Payload& p, int world) {
  if (world <= 1) return 0;
  const uint64_t w = static_cast<uint64_t>(world);
  return 2 * (w - 1) * p.allreduce_bytes / w + (w - 1) * p.allgather_bytes;
}

double now_seconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- BucketCompressor ------------------------------------------------------

BucketCompressor::BucketCompressor(std::string name, std::string state_prefix,
                                   bool floating_only)
    : name_(std::move(name)), prefix_(std::move(state_prefix)),
      floating_only_(floating_only) {}

void BucketCompressor::setup(const BucketLayout& layout) {
  TUTTI_ARG_CHECK(buckets_.count(layout.id) == 0, name_, " compressor: bucket ",
                  layout.id, " was already set up");
  TUTTI_ARG_CHECK(layout.numel >= 0, name_, " compressor: bucket ", layout.id,
                  " has a negative size ", layout.numel);
  TUTTI_ARG_CHECK(!floating_only_ || dtype_is_floating(layout.dtype), name_,
                  " compressor: bucket ", layout.id, " holds ",
                  dtype_name(layout.dtype),
                  "; gradient compression needs float32, float64, float16 or "
                  "bfloat16");
#if !TUTTI_WITH_CUDA
  if (layout.device.is_cuda())
    TUTTI_THROW(kUnsupported, name_, " compressor: bucket ", layout.id, " is on ",
                layout.device.str(), " but this build of tutti has no CUDA support");
#endif
  int64_t end = 0;
  for (const auto& s : layout.slots) {
    TUTTI_ARG_CHECK(s.offset >= end && s.offset + s.shape.numel() <= layout.numel,
                    name_, " compressor: bucket ", layout.id, " slot '", s.name,
                    "' ", s.shape.str(), " at offset ", s.offset,
                    " overlaps the previous slot or runs past the bucket's ",
                    layout.numel, " elements (slots must be ordered and disjoint)");
    end = s.offset + s.shape.numel();
  }
  cuda::OptionalDeviceGuard on_device(layout.device);
  on_setup(layout);
  Bucket b;
  b.layout = layout;
  if (residual(layout.id) != nullptr) b.flag = DeviceArray(layout.device, 4);
  buckets_.emplace(layout.id, std::move(b));
}

const BucketCompressor::Bucket& BucketCompressor::bucket(int id) const {
  auto it = buckets_.find(id);
  if (it == buckets_.end())
    TUTTI_THROW(kInvalidArgument, name_, " compressor: bucket ", id,
                " was never set up (call setup(layout) first)");
  return it->second;
}

const BucketLayout& BucketCompressor::layout(int id) const {
  return bucket(id).layout;
}

int64_t BucketCompressor::steps_done(int id) const { return bucket(id).steps; }

void BucketCompressor::step(int id, const Tensor& t, const CompressContext& ctx,
                            PhaseClock& clock) {
  bucket(id);  // throws for an unknown id
  Bucket& b = buckets_.find(id)->second;
  const BucketLayout& l = b.layout;
  TUTTI_ARG_CHECK(ctx.comm != nullptr, name_, " compressor: bucket ", id,
                  ": CompressContext::comm is null");
  TUTTI_ARG_CHECK(t.dtype() == l.dtype && t.numel() == l.numel &&
                      t.device() == l.device,
                  name_, " compressor: bucket ", id, " is ", t.str(),
                  " but setup() was given ", dtype_name(l.dtype), "[", l.numel,
                  "] ", l.device.str());
  TUTTI_ARG_CHECK(t.data() != nullptr || t.numel() == 0, name_,
                  " compressor: bucket ", id, " has no data");
  const double f = ctx.predivide_factor;
  if (f != 0) {
    TUTTI_ARG_CHECK(takes_predivide(), name_, " compressor: bucket ", id,
                    ": predivide_factor = ", f, " (gradient_predivide_factor): ",
                    name_, " averages in float32 itself, so there is no sum to "
                    "divide before; only none, fp16 and bf16 take a factor");
    TUTTI_ARG_CHECK(std::isfinite(f) && f > 0, name_, " compressor: bucket ", id,
                    ": predivide_factor = ", f, " must be finite and > 0 (0: ",
                    name_, "'s own split)");
    TUTTI_ARG_CHECK(l.dtype == DType::kFloat32 || l.dtype == DType::kFloat16 ||
                        l.dtype == DType::kBFloat16,
                    name_, " compressor: bucket ", id, ": predivide_factor = ", f,
                    " scales float32/float16/bfloat16 buckets, this one is ",
                    dtype_name(l.dtype));
  }
  b.world = ctx.comm->size();
  if (t.numel() == 0) {
    b.steps += 1;
    return;
  }
  // Every launch below (and in run()) goes to the bucket's device, whatever
  // thread calls: the reducer's bucket worker starts on device 0.
  cuda::OptionalDeviceGuard on_device(l.device);
  if (const DeviceArray* res = residual(id)) {
    TUTTI_ARG_CHECK(std::isfinite(ctx.grad_scale) && ctx.grad_scale > 0.0f,
                    name_, " compressor: bucket ", id, ": gradient scale ",
                    ctx.grad_scale, " must be finite and positive");
    if (any_rank_nonfinite(b, t, ctx)) {
      // An overflow step: the loss scaler will skip it.  Every rank marks
      // the whole bucket NaN (bit-identical) and keeps its state as it was.
      fill_nan_bytes(l.device, t.data(), t.nbytes(), ctx.stream);
      clock.decode();
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.nonfinite_steps += 1;
      return;
    }
    if (ctx.grad_scale != b.grad_scale) {
      // Residuals were accumulated at the old scale: bring them to the new
      // one (loss scales are powers of two, so this is exact).
      // In place, on the device, with no scratch and no sync: r / (old/new)
      // equals r * (new/old) exactly for power-of-two ratios.
      if (res->bytes() > 0) {
        float* r = res->as<float>();
        store_f32(l.device, r, b.grad_scale / ctx.grad_scale, r,
                  DType::kFloat32, static_cast<int64_t>(res->bytes() / 4),
                  ctx.stream);
      }
      b.grad_scale = ctx.grad_scale;
    }
    clock.encode();
  }
  run(id, t, ctx, clock);
  b.steps += 1;
}

// Host syncs of an error-feedback step: exactly one, here.  The flag is
// computed on the device into the bucket's persistent int32, all-reduced
// (MAX) on the device in stream order, and read back once: the host must
// know the agreed answer before it decides between run() and the NaN fill,
// because run() changes residuals and factors that an overflow step must
// leave untouched, and the collectives it issues must match on every rank.
bool BucketCompressor::any_rank_nonfinite(Bucket& b, const Tensor& t,
                                          const CompressContext& ctx) {
  int32_t* flag = b.flag.as<int32_t>();
  nonfinite_flag(t.device(), t.data(), t.dtype(), t.numel(), flag, ctx.stream);
  if (ctx.comm->size() > 1)
    ctx.comm->allreduce(b.flag.flat(DType::kInt32), ReduceOp::kMax,
                        op_options(b.layout.id, "nonfinite", ctx));
  if (t.device().is_cpu()) return *flag != 0;
  int32_t agreed = 0;
  copy_to_host(t.device(), &agreed, flag, sizeof(agreed), ctx.stream);
  return agreed != 0;
}

void BucketCompressor::allreduce(int id, const Tensor& t,
                                 const CompressContext& ctx) {
  // What this step sends, decided before run() changes any state.
  const Payload p = t.numel() > 0 ? payload(id, ctx.step) : Payload();
  StepTimes times;
  PhaseClock clock(&times);
  step(id, t, ctx, clock);
  Payload plain;
  plain.allreduce_bytes = t.nbytes();
  const int w = ctx.comm->size();
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.uncompressed_bytes += wire_bytes(plain, w);
  stats_.wire_bytes += wire_bytes(p, w);
  stats_.encode_seconds += times.encode;
  stats_.comm_seconds += times.comm;
  stats_.decode_seconds += times.decode;
}

StateDict BucketCompressor::state_dict() {
  StateDict out;
  for (auto& kv : buckets_) {
    append_state_tensor(&out, state_name(kv.first, "step"),
                        Tensor::of(&kv.second.steps, 1));
    if (const DeviceArray* res = residual(kv.first)) {
      append_state_tensor(&out, state_name(kv.first, "grad_scale"),
                          Tensor::of(&kv.second.grad_scale, 1));
      append_state_tensor(&out, state_name(kv.first, "world"),
                          Tensor::of(&kv.second.world, 1));
      // Per rank: each rank's error differs (saved as row <rank>); a load by
      // another number of ranks gives every rank the saved rows' mean.
      append_state_tensor(&out, state_name(kv.first, "residual"),
                          res->flat(DType::kFloat32));
      ShardInfo& s = out.back().shard;
      s.per_rank = true;
      s.group = "dp";
      const int id = kv.first;
      s.on_resize = [this, id](const PerRankResize& r) { resize_residual(id, r); };
    }
    append_state(kv.first, &out);
  }
  return out;
}

// The reducer averages C(g_r + e_r) over the W ranks, so what the ranks
// still owe the AVERAGE gradient is (1/W) * sum_r e_r: the mean residual.
// Giving each of the W' new ranks that mean keeps it, (1/W') * W' * mean;
// keeping rank r's own residual would change it by a factor W/W' and by
// whatever rows have no rank any more.  The mean is summed in float64 in
// row order and rounded once: the same bits on every rank.  The residuals
// stay in the saved grad_scale's units (replicated, loaded alongside).
void BucketCompressor::resize_residual(int id, const PerRankResize& r) {
  const DeviceArray* res = residual(id);
  bucket(id);  // throws for an unknown id
  Bucket& b = buckets_.find(id)->second;
  const int64_t n = static_cast<int64_t>(res->bytes() / 4);
  TUTTI_CHECK(r.saved.dtype() == DType::kFloat32 && r.saved_world > 0 &&
                  r.saved.numel() == static_cast<int64_t>(r.saved_world) * n,
              name_, " compressor: '", r.name, "' holds ", r.saved.str(), " for ",
              r.saved_world, " saved ranks; expected float32 rows of ", n, " elements");
  const float* rows = r.saved.data_as<float>();
  std::vector<float> mean(static_cast<size_t>(n));
  // `world` (replicated) was loaded before this hook runs.  Rows of a
  // checkpoint group larger than the compressor's (tensor parallelism
  // inside data parallelism) belong to different TP shards: their mean
  // would be wrong, so the residual restarts from zero, loudly.
  const bool one_group = b.world == 0 || b.world == r.saved_world;
  if (!one_group) {
    if (r.rank == 0)
      TUTTI_LOG(kWarn) << name_ << " compressor: '" << r.name << "' holds "
                       << r.saved_world << " ranks' residuals but the saved job ran the "
                       << "compressor on groups of " << b.world
                       << " (tensor parallelism?): residuals of different groups cannot "
                          "be averaged, so every rank's residual restarts from zero "
                          "(the error owed to the average gradient is dropped)";
    rows = nullptr;
  }
  for (int64_t i = 0; rows && i < n; ++i) {
    double sum = 0;
    for (int64_t w = 0; w < r.saved_world; ++w) sum += rows[w * n + i];
    mean[static_cast<size_t>(i)] = static_cast<float>(sum / r.saved_world);
  }
  cuda::OptionalDeviceGuard on_device(b.layout.device);
  copy_from_host(b.layout.device, res->data(), mean.data(), mean.size() * 4, nullptr);
  // The rows are now the new group's (or zero, which any group may share).
  b.world = one_group ? r.world : 0;
  if (r.rank == 0 && one_group)
    TUTTI_LOG(kInfo) << name_ << " compressor: '" << r.name << "' was saved by "
                     << r.saved_world << " ranks and is loaded by " << r.world
                     << ": every rank starts from the mean of the saved residuals "
                        "(the error owed to the averaged gradient is kept)";
}

void BucketCompressor::on_state_loaded() {
  // Bad loaded state is kCorrupt, as in the loss scaler's on_state_loaded.
  for (auto& kv : buckets_)
    if (!(std::isfinite(kv.second.grad_scale) && kv.second.grad_scale > 0.0f))
      TUTTI_THROW(kCorrupt, name_, " compressor: loaded state ",
                  state_name(kv.first, "grad_scale"), " = ", kv.second.grad_scale,
                  "; expected a finite positive gradient scale");
}

CompressStats BucketCompressor::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void BucketCompressor::reset_stats() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = CompressStats();
}

std::string BucketCompressor::state_name(int id, const char* what) const {
  return prefix_ + "/bucket" + std::to_string(id) + "/" + what;
}

OpOptions BucketCompressor::op_options(int id, const char* what,
                                       const CompressContext& ctx) const {
  OpOptions o;
  o.name = state_name(id, what);
  o.stream = ctx.stream;
  return o;
}

}  // namespace compression
}  // namespace tutti
