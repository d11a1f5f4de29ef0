// "none": the uncompressed baseline, a plain all-reduce average of the
// bucket in its own dtype.  Exact (up to the all-reduce's own rounding) and
// the reference the lossy compressors are measured against.  With
// CompressContext::predivide_factor f: divide by f in place, sum, divide by
// W / f (as the reducer's uncompressed path does).
#include "compression/cast.h"
#include "compression/common.h"

namespace tutti {
namespace compression {
namespace {

class NoneCompressor final : public BucketCompressor {
 public:
  explicit NoneCompressor(const std::string& prefix)
      : BucketCompressor("none", prefix, /*floating_only=*/false) {}

  Payload payload(int id, int64_t) const override {
    Payload p;
    p.allreduce_bytes = static_cast<uint64_t>(layout(id).numel) *
                        dtype_size(layout(id).dtype);
    return p;
  }
  bool takes_predivide() const override { return true; }

 protected:
  void on_setup(const BucketLayout&) override {}
  void run(int id, const Tensor& bucket, const CompressContext& ctx,
           PhaseClock& clock) override {
    const double f = ctx.predivide_factor;
    if (f <= 0) {
      clock.encode();
      ctx.comm->allreduce(bucket, ReduceOp::kAvg, op_options(id, "grad", ctx));
      clock.comm();
      return;
    }
    // In place, each division rounded once in the bucket's dtype (step()
    // allowed float32, float16 and bfloat16 only).
    const auto divide = [&](double by) {
      cast_convert(bucket.device(), bucket.data(), bucket.dtype(), bucket.data(),
                   bucket.dtype(), bucket.numel(), static_cast<float>(by), ctx.stream);
    };
    const double w = ctx.comm->size();
    if (f != 1) divide(f);
    clock.encode();
    ctx.comm->allreduce(bucket, ReduceOp::kSum, op_options(id, "grad", ctx));
    clock.comm();
    if (w / f != 1) divide(w / f);
    clock.decode();
  }
};

}  // namespace

std::shared_ptr<BucketCompressor> make_none_compressor(
    const std::string& state_prefix) {
  return std::make_shared<NoneCompressor>(state_prefix);
}

}  // namespace compression
}  // namespace tutti
