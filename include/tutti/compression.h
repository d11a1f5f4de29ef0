// Gradient compression: the hook the data-parallel reducer passes each
// bucket through, and the factory for tutti's compressors.
//
// A Compressor replaces the all-reduce of one fused gradient bucket.  The
// reducer calls setup() once per bucket when it builds its plan (so state
// such as error-feedback residuals and PowerSGD factors is allocated up
// front and visible to checkpoints from the start), then allreduce() for
// each step's bucket on its communication thread.  Contract:
//  * on return, `bucket` holds the AVERAGE over the group's ranks, in the
//    bucket's own dtype, bit-identical on every rank;
//  * calls on one bucket happen in step order; different buckets may be
//    interleaved but every rank issues its collectives in the same order;
//  * all persistent state is reported by state_dict() (names prefixed with
//    the bucket id), so a restart resumes error feedback exactly;
//  * compressors with error feedback (topk, powersgd, onebit) agree across
//    ranks whether any rank's bucket holds Inf/NaN (an AMP overflow step);
//    if so the bucket becomes NaN on every rank (so the loss scaler skips
//    the step) and residuals, factors and step counters stay untouched.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tutti/comm.h"
#include "tutti/export.h"
#include "tutti/state.h"
#include "tutti/tensor.h"

namespace tutti {

// One tensor's place inside a bucket's flat buffer.
struct BucketSlot {
  std::string name;     // parameter name
  int64_t offset = 0;   // element offset in the bucket
  Shape shape;          // the gradient's shape (PowerSGD views 2-D+ as matrices)
};

struct BucketLayout {
  int id = 0;
  DType dtype = DType::kFloat32;
  Device device = Device::cpu();
  int64_t numel = 0;
  std::vector<BucketSlot> slots;
};

struct CompressContext {
  Communicator* comm = nullptr;  // the data-parallel group
  int64_t step = 0;              // optimiser steps so far (0-based)
  void* stream = nullptr;        // CUDA: stream the bucket is ready on
  // The factor the bucket's gradients carry (the AMP loss scale; 1 without
  // loss scaling).  Error-feedback residuals are kept in these units and
  // rescaled when it changes, so a loss-scale backoff or growth does not
  // feed back stale, differently scaled error.  Finite and positive.
  float grad_scale = 1.0f;
  // Horovod's gradient_predivide_factor f (ReducerOptions): each rank's
  // bucket is divided by f before the sum and the sum by W / f after it (W:
  // the group's size), so the result is still the average.  0 (default):
  // the compressor's own split (the cast compressors divide by W before
  // the sum, `none` sums and then divides).  Finite and > 0 otherwise, and
  // only for compressors whose takes_predivide() is true (kInvalidArgument
  // for the others), on float32, float16 or bfloat16 buckets.
  double predivide_factor = 0;
};

struct CompressStats {
  uint64_t uncompressed_bytes = 0;  // what a plain all-reduce would send
  uint64_t wire_bytes = 0;          // what this compressor sent per rank
  double encode_seconds = 0;
  double comm_seconds = 0;
  double decode_seconds = 0;
  // Bucket steps that found Inf/NaN on some rank (error-feedback
  // compressors): the bucket was marked NaN and no state changed.
  uint64_t nonfinite_steps = 0;
};

class TUTTI_API Compressor : public Stateful {
 public:
  ~Compressor() override;
  // "none", "fp16", "bf16", "topk", "powersgd", "onebit", "auto".
  virtual std::string name() const = 0;
  virtual void setup(const BucketLayout& layout) = 0;
  // All-reduces `bucket` in place to the average over ctx.comm's ranks.
  virtual void allreduce(int bucket_id, const Tensor& bucket,
                         const CompressContext& ctx) = 0;
  // True when allreduce() honours CompressContext::predivide_factor: none,
  // fp16 and bf16, whose sum is a plain all-reduce (the cast compressors
  // divide by f before rounding to the wire type and by W / f after
  // converting back).  top-k, PowerSGD and 1-bit average in float32 with
  // error feedback, where a division before the sum changes nothing but
  // the residuals' units, and auto may pick PowerSGD: false.
  virtual bool takes_predivide() const { return false; }
  // Totals since construction (or since reset_stats()).
  virtual CompressStats stats() const = 0;
  virtual void reset_stats() = 0;
};

struct CompressorOptions {
  double topk_ratio = 0.01;        // TUTTI_TOPK_RATIO
  int powersgd_rank = 4;           // TUTTI_POWERSGD_RANK
  int64_t powersgd_start_step = 0; // TUTTI_POWERSGD_START_STEP
  // PowerSGD leaves a tensor uncompressed unless (m*n) / (r*(m+n)) is at
  // least this (compression would not pay).
  double powersgd_min_compression = 2.0;
  int64_t onebit_chunk = 2048;     // elements per scale for 1-bit sign
  int auto_probe_steps = 5;        // TUTTI_AUTO_PROBE_STEPS
  uint64_t seed = 0;               // PowerSGD's initial Q
  // Fills unset fields from the TUTTI_* settings.
  TUTTI_API static CompressorOptions from_env();
};

// Creates a compressor by name ("none", "fp16", "bf16", "topk", "powersgd",
// "onebit", "auto").  Error(kInvalidArgument) for an unknown name.
TUTTI_API std::shared_ptr<Compressor> make_compressor(
    const std::string& name, const CompressorOptions& options = CompressorOptions::from_env());

}  // namespace tutti
