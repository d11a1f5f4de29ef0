// "none": the uncompressed baseline, a plain all-reduce average of the
// bucket in its own dtype.  Exact (up to the all-reduce's own rounding) and
// the reference the lossy compressors are measured against.
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

 protected:
  void on_setup(const BucketLayout&) override {}
  void run(int id, const Tensor& bucket, const CompressContext& ctx,
           PhaseClock& clock) override {
    clock.encode();
    ctx.comm->allreduce(bucket, ReduceOp::kAvg, op_options(id, "grad", ctx));
    clock.comm();
  }
};

}  // namespace

std::shared_ptr<BucketCompressor> make_none_compressor(
    const std::string& state_prefix) {
  return std::make_shared<NoneCompressor>(state_prefix);
}

}  // namespace compression
}  // namespace tutti
