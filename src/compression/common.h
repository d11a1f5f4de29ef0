// Pieces every compressor shares: memory on the bucket's device, the
// float32 staging ops (with their CUDA twins), traffic accounting and the
// per-bucket bookkeeping base class.
//
// Conventions of the compression layer:
//  * every algorithm computes in float32 whatever the gradient dtype
//    (float32, float64, float16, bfloat16) and writes the average back in
//    the gradient's dtype;
//  * error-feedback residuals and factors live on the bucket's device and are
//    allocated in setup(), so state_dict() has the same names and shapes
//    before and after the first step;
//  * every rank issues the same collectives in the same order: the sequence
//    depends only on the bucket layout and the step counter, never on data.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/cuda_utils.h"
#include "core/host_buffer.h"
#include "core/timeline.h"
#include "tutti/compression.h"

namespace tutti {
namespace compression {

// ---- memory --------------------------------------------------------------

// Owned, zero-initialised memory on the host or on one CUDA device.
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(Device device, size_t bytes);
  DeviceArray(DeviceArray&&) noexcept = default;
  DeviceArray& operator=(DeviceArray&&) noexcept = default;

  void* data() const;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data());
  }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  // A view of `numel` elements of `dtype` starting at element `offset`.
  Tensor view(DType dtype, int64_t offset, Shape shape) const;
  Tensor flat(DType dtype) const;

 private:
  Device device_ = Device::cpu();
  size_t bytes_ = 0;
  HostBuffer host_;
#if TUTTI_WITH_CUDA
  cuda::DeviceBuffer dev_;
#endif
};

// One rank's block of uint32 words and every rank's blocks after an
// all-gather (the exchange of top-k and 1-bit): the gathered buffer is sized
// on first use for the communicator's size.
class GatherExchange {
 public:
  GatherExchange() = default;
  GatherExchange(Device device, int64_t block_words);
  uint32_t* send() const { return send_.as<uint32_t>(); }
  int64_t block_words() const { return words_; }
  // All-gathers the blocks in rank order; returns world * block_words words.
  const uint32_t* exchange(Communicator* comm, const OpOptions& options);

 private:
  Device device_ = Device::cpu();
  int64_t words_ = 0;
  DeviceArray send_, gathered_;
  int world_ = 0;
};

// Appends {name, tensor} to a state dict.
void append_state_tensor(StateDict* out, const std::string& name,
                         const Tensor& tensor);

// Byte copies and fills on `device`; CUDA: asynchronous on `stream`.
void copy_bytes(Device device, void* dst, const void* src, size_t bytes,
                void* stream);
void zero_bytes(Device device, void* dst, size_t bytes, void* stream);
// Fills with all-one bytes: a NaN in every floating dtype (f32, f64, f16,
// bf16), how an overflowed bucket is marked on every rank.
void fill_nan_bytes(Device device, void* dst, size_t bytes, void* stream);
// Copies between host memory and memory on `device` (synchronous).
void copy_from_host(Device device, void* dst, const void* host, size_t bytes,
                    void* stream);
void copy_to_host(Device device, void* host, const void* src, size_t bytes,
                  void* stream);
// Blocks the host until `stream` finished (no-op on the CPU).
void sync_stream(Device device, void* stream);

// ---- float32 staging ops (CPU reference here, CUDA in
// kernels/compression_common.cu; dispatched on `device`) --------------------

// acc[i] += float(src[i]).
void accumulate_f32(Device device, const void* src, DType dtype, float* acc,
                    int64_t n, void* stream);
// dst[i] = float(src[i]).
void load_f32(Device device, const void* src, DType dtype, float* dst,
              int64_t n, void* stream);
// dst[i] = dtype(src[i] / divisor): the division in float32, one rounding.
void store_f32(Device device, const float* src, float divisor, void* dst,
               DType dtype, int64_t n, void* stream);

// *flag (int32 on `device`) := 1 if src holds an Inf or NaN, else 0; CUDA:
// asynchronous on `stream`, the flag stays on the device.
void nonfinite_flag(Device device, const void* src, DType dtype, int64_t n,
                    int32_t* flag, void* stream);

namespace cpu {
bool any_nonfinite(const void* src, DType dtype, int64_t n);
void accumulate_f32(const void* src, DType dtype, float* acc, int64_t n);
void load_f32(const void* src, DType dtype, float* dst, int64_t n);
void store_f32(const float* src, float divisor, void* dst, DType dtype,
               int64_t n);
}  // namespace cpu

// Deterministic pseudo-random values from integer hashing (splitmix64):
// the same on every rank, CPU and GPU, for PowerSGD's initial Q and for
// re-seeding degenerate columns.  Uniform in [-1, 1).
float hash_uniform(uint64_t seed, uint64_t stream, uint64_t index);

// ---- traffic -------------------------------------------------------------

// Bytes one step contributes to collectives on this rank.
struct Payload {
  uint64_t allreduce_bytes = 0;  // buffers all-reduced
  uint64_t allgather_bytes = 0;  // this rank's block of all-gathers
};

// Bytes a rank sends on the wire under the bandwidth-optimal (ring) model:
// an all-reduce of B bytes sends 2(W-1)/W * B, an all-gather of b bytes per
// rank sends (W-1) * b.  (docs/compression.md explains the choice.)
uint64_t wire_bytes(const Payload& p, int world);

// Monotonic seconds.
double now_seconds();

// ---- the per-bucket base class -------------------------------------------

// Times spent in one step, in seconds.
struct StepTimes {
  double encode = 0, comm = 0, decode = 0;
};

// Accumulates the time since the previous mark into one phase.
class PhaseClock {
 public:
  explicit PhaseClock(StepTimes* t) : t_(t), last_(now_seconds()) {}
  void encode() { t_->encode += traced_lap("encode"); }
  void comm() { t_->comm += lap(); }
  void decode() { t_->decode += traced_lap("decode"); }

 private:
  // lap(), also put on the timeline's compression track.
  double traced_lap(const char* phase) {
    const double d = lap();
    if (timeline::on()) {
      const int64_t end = timeline::now_ns();
      timeline::complete(timeline::kCompression, "compression", phase,
                         end - static_cast<int64_t>(d * 1e9), end);
    }
    return d;
  }
  double lap() {
    const double now = now_seconds();
    const double d = now - last_;
    last_ = now;
    return d;
  }
  StepTimes* t_;
  double last_;
};

// Bookkeeping every algorithm shares: the layouts given to setup(), a step
// counter per bucket (a 1-element int64 state tensor), argument checks,
// stats.  Algorithms implement on_setup(), run(), payload() and
// append_state().
class BucketCompressor : public Compressor {
 public:
  // `state_prefix`: state names are "<prefix>/bucket<id>/<what>", e.g.
  // "compressor/topk".
  BucketCompressor(std::string name, std::string state_prefix,
                   bool floating_only);

  std::string name() const override { return name_; }
  void setup(const BucketLayout& layout) final;
  void allreduce(int bucket_id, const Tensor& bucket,
                 const CompressContext& ctx) final;
  StateDict state_dict() final;
  void on_state_loaded() override;
  CompressStats stats() const override;
  void reset_stats() override;

  // allreduce() without the stats: one step of bucket `id` whose phase
  // times go to `clock` (how auto runs the compressor it chose).
  void step(int id, const Tensor& bucket, const CompressContext& ctx,
            PhaseClock& clock);

  // What one step of bucket `id` at optimiser step `step` contributes.
  virtual Payload payload(int id, int64_t step) const = 0;
  // Steps run on bucket `id` so far (restored by checkpoints).
  int64_t steps_done(int id) const;
  const BucketLayout& layout(int id) const;

 protected:
  virtual void on_setup(const BucketLayout& layout) = 0;
  // One step on a non-empty bucket; `clock` attributes time to phases.
  virtual void run(int id, const Tensor& bucket, const CompressContext& ctx,
                   PhaseClock& clock) = 0;
  virtual void append_state(int id, StateDict* out) {}
  // Bucket `id`'s error-feedback residual (float32), or null for
  // compressors without error feedback.  With one, step() checks the bucket
  // for Inf/NaN and agrees on it across ranks before run() (see
  // tutti/compression.h), rescales the residual when
  // CompressContext::grad_scale changes, and state_dict() reports it as
  // "<prefix>/bucket<id>/residual" (before append_state()'s entries), per
  // rank (ShardInfo::per_rank; a load by another number of ranks gives
  // every rank the mean of the saved residuals: docs/compression.md).
  virtual const DeviceArray* residual(int id) const { return nullptr; }
  std::string state_name(int id, const char* what) const;
  // OpOptions for a collective of this bucket ("compressor/topk/bucket3/P").
  OpOptions op_options(int id, const char* what,
                       const CompressContext& ctx) const;

 private:
  struct Bucket {
    BucketLayout layout;
    int64_t steps = 0;  // exposed as state "<prefix>/bucket<id>/step"
    // Error feedback only: the gradient scale the residuals are in (state
    // "<prefix>/bucket<id>/grad_scale"), and the agreement flag's int32 on
    // the bucket's device (allocated in setup(), so a step allocates
    // nothing).
    float grad_scale = 1.0f;
    // The size of the group the last step ran on (state
    // "<prefix>/bucket<id>/world"; 0 before the first step): a resize
    // averages saved residuals only when they are one group's.
    int64_t world = 0;
    DeviceArray flag;
  };
  // Error feedback: true when some rank's bucket holds Inf/NaN.  The one
  // host sync of an error-feedback step on CUDA (see the definition).
  bool any_rank_nonfinite(Bucket& b, const Tensor& t, const CompressContext& ctx);
  const Bucket& bucket(int id) const;
  // The on_resize hook of bucket `id`'s residual (ShardInfo::per_rank).
  void resize_residual(int id, const PerRankResize& r);

  std::string name_;
  std::string prefix_;
  bool floating_only_;
  std::map<int, Bucket> buckets_;
  mutable std::mutex stats_mu_;
  CompressStats stats_;
};

// The "none" compressor: a plain all-reduce average (the baseline).
std::shared_ptr<BucketCompressor> make_none_compressor(
    const std::string& state_prefix = "compressor/none");

}  // namespace compression
}  // namespace tutti
