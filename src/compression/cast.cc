// fp16 / bf16 cast compressor.
//
// Each rank divides its gradient by the world size *before* rounding to the
// 16-bit type, so the sum the all-reduce forms is already the average and
// cannot overflow float16's 65504 where the gradient itself would not (a sum
// of W float16 values of up to 65504/W each).  The all-reduce sums in the
// 16-bit type (tutti's reductions widen to float32 and round once per
// element); MPI/NCCL all-reduce results are identical on every rank.
//
// With CompressContext::predivide_factor f (Horovod's
// gradient_predivide_factor) the division is split as Horovod splits it:
// by f before the cast (one rounding to the wire type), by W / f after the
// conversion back (in float32, one rounding to the gradient's dtype).  f = W
// is the default above, bit for bit.
#include "compression/cast.h"

#include "core/check.h"

#if TUTTI_WITH_CUDA
#include "kernels/compression_cast.h"
#endif

namespace tutti {
namespace compression {

void cast_convert_cpu(const void* src, DType src_dtype, void* dst,
                      DType dst_dtype, int64_t n, float divisor) {
  constexpr int64_t kBlock = 1024;
  float tmp[kBlock];
  const size_t ses = dtype_size(src_dtype), des = dtype_size(dst_dtype);
  for (int64_t off = 0; off < n; off += kBlock) {
    const int64_t m = n - off < kBlock ? n - off : kBlock;
    cpu::load_f32(static_cast<const char*>(src) + off * ses, src_dtype, tmp, m);
    cpu::store_f32(tmp, divisor, static_cast<char*>(dst) + off * des,
                   dst_dtype, m);
  }
}

void cast_convert(Device device, const void* src, DType sd, void* dst,
                  DType dd, int64_t n, float divisor, void* stream) {
  if (device.is_cpu()) return cast_convert_cpu(src, sd, dst, dd, n, divisor);
#if TUTTI_WITH_CUDA
  kernels::launch_cast_convert(src, sd, dst, dd, n, divisor,
                               static_cast<cudaStream_t>(stream));
#else
  TUTTI_THROW(kUnsupported, "cast compression of a CUDA tensor without CUDA");
#endif
}

namespace {

class CastCompressor final : public BucketCompressor {
 public:
  CastCompressor(DType wire, const std::string& prefix)
      : BucketCompressor(wire == DType::kFloat16 ? "fp16" : "bf16", prefix,
                         /*floating_only=*/true),
        wire_(wire) {}

  Payload payload(int id, int64_t) const override {
    Payload p;
    p.allreduce_bytes = static_cast<uint64_t>(layout(id).numel) * 2;
    return p;
  }
  bool takes_predivide() const override { return true; }

 protected:
  void on_setup(const BucketLayout& l) override {
    // A gradient already in the wire type converts in place.
    if (l.dtype != wire_)
      scratch_.emplace(l.id, DeviceArray(l.device, static_cast<size_t>(l.numel) * 2));
  }

  void run(int id, const Tensor& bucket, const CompressContext& ctx,
           PhaseClock& clock) override {
    const double world = ctx.comm->size();
    // Before the sum: f (default W); after it: W / f (default 1, no
    // division).  step() checked f.
    const double before = ctx.predivide_factor > 0 ? ctx.predivide_factor : world;
    const float after = before == world ? 1.0f : static_cast<float>(world / before);
    auto it = scratch_.find(id);
    Tensor wire = it == scratch_.end() ? bucket : it->second.flat(wire_);
    cast_convert(bucket.device(), bucket.data(), bucket.dtype(), wire.data(),
                 wire_, bucket.numel(), static_cast<float>(before), ctx.stream);
    clock.encode();
    ctx.comm->allreduce(wire, ReduceOp::kSum, op_options(id, "grad", ctx));
    clock.comm();
    cast_convert(bucket.device(), wire.data(), wire_, bucket.data(),
                 bucket.dtype(), bucket.numel(), after, ctx.stream);
    clock.decode();
  }

 private:
  DType wire_;
  std::map<int, DeviceArray> scratch_;
};

}  // namespace

std::shared_ptr<BucketCompressor> make_cast_compressor(
    DType wire, const std::string& state_prefix) {
  TUTTI_ARG_CHECK(wire == DType::kFloat16 || wire == DType::kBFloat16,
                  "cast compressor: wire dtype must be float16 or bfloat16, got ",
                  dtype_name(wire));
  const std::string prefix =
      !state_prefix.empty() ? state_prefix
      : wire == DType::kFloat16 ? "compressor/fp16" : "compressor/bf16";
  return std::make_shared<CastCompressor>(wire, prefix);
}

}  // namespace compression
}  // namespace tutti
