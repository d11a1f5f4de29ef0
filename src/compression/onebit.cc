// 1-bit sign compressor with error feedback.  See onebit.h.
#include "compression/onebit.h"

#include <cmath>
#include <cstring>

#include "core/check.h"

#if TUTTI_WITH_CUDA
#include "kernels/compression_onebit.h"
#endif

namespace tutti {
namespace compression {

int64_t onebit_chunks(int64_t n, int64_t chunk) {
  return n <= 0 ? 0 : (n + chunk - 1) / chunk;
}

int64_t onebit_block_words(int64_t n, int64_t chunk) {
  return n <= 0 ? 0 : onebit_chunks(n, chunk) + (n + 31) / 32;
}

// Written for the auto-vectoriser: fixed 32-element words, independent
// accumulators, branch-free selects.  The results do not depend on the
// instruction set (no reassociation, no fused multiply-add), so every
// clone gives the same bits.
__attribute__((target_clones("avx2", "default")))
void onebit_encode_cpu(float* x, int64_t n, int64_t chunk, uint32_t* block) {
  const int64_t nchunks = onebit_chunks(n, chunk);
  uint32_t* words = block + nchunks;
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t begin = c * chunk, end = std::min(n, begin + chunk);
    // Four partial sums (a fixed order), then combined.
    double s4[4] = {0, 0, 0, 0};
    int64_t i = begin;
    for (; i + 4 <= end; i += 4)
      for (int k = 0; k < 4; ++k) s4[k] += std::fabs(static_cast<double>(x[i + k]));
    for (; i < end; ++i) s4[0] += std::fabs(static_cast<double>(x[i]));
    const double sum = (s4[0] + s4[1]) + (s4[2] + s4[3]);
    const float scale = static_cast<float>(sum / static_cast<double>(end - begin));
    std::memcpy(block + c, &scale, 4);
    // chunk is a multiple of 32: words never straddle chunks.
    for (int64_t w0 = begin; w0 < end; w0 += 32) {
      uint32_t word = 0;
      float* xw = x + w0;
      if (end - w0 >= 32) {
        for (int b = 0; b < 32; ++b) word |= static_cast<uint32_t>(!(xw[b] < 0.0f)) << b;
        for (int b = 0; b < 32; ++b) xw[b] = xw[b] - (xw[b] < 0.0f ? -scale : scale);
      } else {
        const int m = static_cast<int>(end - w0);
        for (int b = 0; b < m; ++b) {
          const bool pos = !(xw[b] < 0.0f);
          word |= static_cast<uint32_t>(pos) << b;
          xw[b] = xw[b] - (pos ? scale : -scale);
        }
      }
      words[w0 / 32] = word;
    }
  }
}

__attribute__((target_clones("avx2", "default")))
void onebit_decode_sum_cpu(const uint32_t* blocks, int world, int64_t n,
                           int64_t chunk, float divisor, void* out,
                           DType dtype) {
  const int64_t nchunks = onebit_chunks(n, chunk);
  const int64_t bw = onebit_block_words(n, chunk);
  const size_t es = dtype_size(dtype);
  constexpr int64_t kGroup = 1024;  // elements decoded per pass over ranks
  alignas(64) float acc[kGroup];
  for (int64_t g0 = 0; g0 < n; g0 += kGroup) {
    const int64_t m = std::min(kGroup, n - g0);
    for (int64_t i = 0; i < m; ++i) acc[i] = 0.0f;
    for (int r = 0; r < world; ++r) {
      const uint32_t* blk = blocks + static_cast<int64_t>(r) * bw;
      const uint32_t* words = blk + nchunks;
      for (int64_t w0 = 0; w0 < m; w0 += 32) {
        const int64_t e0 = g0 + w0;
        float s;
        std::memcpy(&s, blk + e0 / chunk, 4);
        const uint32_t word = words[e0 / 32];
        float* a = acc + w0;
        if (m - w0 >= 32) {
          for (int b = 0; b < 32; ++b) a[b] = a[b] + ((word & (1u << b)) ? s : -s);
        } else {
          for (int64_t b = 0; b < m - w0; ++b) a[b] = a[b] + ((word & (1u << b)) ? s : -s);
        }
      }
    }
    cpu::store_f32(acc, divisor, static_cast<char*>(out) + g0 * es, dtype, m);
  }
}

namespace {

class OnebitCompressor final : public BucketCompressor {
 public:
  explicit OnebitCompressor(int64_t chunk)
      : BucketCompressor("onebit", "compressor/onebit", /*floating_only=*/true),
        chunk_(chunk) {}

  Payload payload(int id, int64_t) const override {
    Payload p;
    p.allgather_bytes =
        static_cast<uint64_t>(onebit_block_words(layout(id).numel, chunk_)) * 4;
    return p;
  }

 protected:
  struct State {
    DeviceArray residual;  // float32[numel]
    GatherExchange signs;  // scales + sign words
  };

  void on_setup(const BucketLayout& l) override {
    State s;
    s.residual = DeviceArray(l.device, static_cast<size_t>(l.numel) * 4);
    s.signs = GatherExchange(l.device, onebit_block_words(l.numel, chunk_));
    states_.emplace(l.id, std::move(s));
  }

  const DeviceArray* residual(int id) const override {
    return &states_.at(id).residual;
  }

  void run(int id, const Tensor& bucket, const CompressContext& ctx,
           PhaseClock& clock) override {
    State& s = states_.at(id);
    const Device dev = bucket.device();
    const int64_t n = bucket.numel();
    const int world = ctx.comm->size();
    accumulate_f32(dev, bucket.data(), bucket.dtype(), s.residual.as<float>(), n,
                   ctx.stream);
    if (dev.is_cpu()) {
      onebit_encode_cpu(s.residual.as<float>(), n, chunk_, s.signs.send());
    } else {
#if TUTTI_WITH_CUDA
      kernels::launch_onebit_encode(s.residual.as<float>(), n, chunk_,
                                    s.signs.send(),
                                    static_cast<cudaStream_t>(ctx.stream));
#endif
    }
    clock.encode();
    const uint32_t* blocks =
        s.signs.exchange(ctx.comm, op_options(id, "signs", ctx));
    clock.comm();
    if (dev.is_cpu()) {
      onebit_decode_sum_cpu(blocks, world, n, chunk_,
                            static_cast<float>(world), bucket.data(),
                            bucket.dtype());
    } else {
#if TUTTI_WITH_CUDA
      kernels::launch_onebit_decode_sum(blocks, world, n,
                                        chunk_, static_cast<float>(world),
                                        bucket.data(), bucket.dtype(),
                                        static_cast<cudaStream_t>(ctx.stream));
#endif
    }
    clock.decode();
  }

 private:
  int64_t chunk_;
  std::map<int, State> states_;
};

}  // namespace

std::shared_ptr<BucketCompressor> make_onebit_compressor(int64_t chunk) {
  TUTTI_ARG_CHECK(chunk > 0 && chunk % 32 == 0, "onebit compressor: chunk ",
                  chunk, " must be a positive multiple of 32 (32 signs per word)");
  return std::make_shared<OnebitCompressor>(chunk);
}

}  // namespace compression
}  // namespace tutti
