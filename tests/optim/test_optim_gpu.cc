// The CUDA optimizer step against its host twin, bit for bit (both run
// optim_math.h with correctly rounded operations): hundreds of parameters
// (several launches' worth of slots), sizes 0, 1, odd, at chunk boundaries
// and one parameter of more chunks than a launch holds; float32, float16
// and bfloat16 gradients and model copies mixed in one list; views at odd
// element offsets; every kind over three steps (SGD's first step
// initialises the buffer).  Model copies are poisoned first on both sides.
// Label gpu: skipped (exit 77) without a device.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/test_util.h"
#include "tutti/optim.h"

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/optim_step.h"
#include "optim_test_util.h"

namespace tutti {
namespace optim {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// Host bytes of n elements of a dtype.
struct HostBuf {
  DType dtype = DType::kFloat32;
  int64_t n = 0;
  std::vector<uint8_t> bytes;
  HostBuf(DType d, int64_t count) : dtype(d), n(count), bytes(count * dtype_size(d)) {}
  Tensor tensor() { return Tensor(n ? bytes.data() : nullptr, dtype, Shape{n}); }
};

// A device copy viewed at element `offset` (1: unaligned for vector access).
struct DevBuf {
  DType dtype;
  int64_t n, offset;
  void* base = nullptr;
  DevBuf(const HostBuf& h, int64_t off) : dtype(h.dtype), n(h.n), offset(off) {
    EXPECT_EQ(cudaMalloc(&base, (n + off) * dtype_size(dtype) + 1), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr(), h.bytes.data(), h.bytes.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    // Landed before a kernel on a non-blocking stream reads it.
    EXPECT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
  }
  ~DevBuf() { cudaFree(base); }
  DevBuf(const DevBuf&) = delete;
  void* ptr() const { return static_cast<char*>(base) + offset * dtype_size(dtype); }
  Tensor tensor() const { return Tensor(n ? ptr() : nullptr, dtype, Shape{n}, Device::cuda(0)); }
  std::vector<uint8_t> to_host() const {
    std::vector<uint8_t> out(n * dtype_size(dtype));
    EXPECT_EQ(cudaMemcpy(out.data(), ptr(), out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
};

void fill(HostBuf* b, std::mt19937* rng, float scale, bool positive = false) {
  std::normal_distribution<float> d(0.f, scale);
  for (int64_t i = 0; i < b->n; ++i) {
    float x = d(*rng);
    if (positive) x = x * x;
    if (b->dtype == DType::kFloat32)
      std::memcpy(b->bytes.data() + 4 * i, &x, 4);
    else {
      const uint16_t h = b->dtype == DType::kFloat16 ? float_to_half(x) : float_to_bfloat16(x);
      std::memcpy(b->bytes.data() + 2 * i, &h, 2);
    }
  }
}

struct Case {
  std::vector<HostBuf> p, g, s0, s1, c;
  std::vector<std::unique_ptr<DevBuf>> dp, dg, ds0, ds1, dc;
};

const DType kTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// Fills a case of the given sizes; copies poisoned with all-ones bytes (NaN).
void build(Case* k, const std::vector<int64_t>& sizes, std::mt19937* rng, bool copies) {
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    k->p.emplace_back(DType::kFloat32, n);
    k->g.emplace_back(kTypes[i % 3], n);
    k->s0.emplace_back(DType::kFloat32, n);
    k->s1.emplace_back(DType::kFloat32, n);
    k->c.emplace_back(kTypes[(i / 3) % 3], copies ? n : 0);
    fill(&k->p[i], rng, 1.f);
    fill(&k->g[i], rng, 2.f);
    fill(&k->s0[i], rng, 0.1f);
    fill(&k->s1[i], rng, 0.01f, true);
    std::fill(k->c[i].bytes.begin(), k->c[i].bytes.end(), 0xff);
    const int64_t off = i % 2;
    k->dp.emplace_back(new DevBuf(k->p[i], off));
    k->dg.emplace_back(new DevBuf(k->g[i], off));
    k->ds0.emplace_back(new DevBuf(k->s0[i], off));
    k->ds1.emplace_back(new DevBuf(k->s1[i], off));
    k->dc.emplace_back(new DevBuf(k->c[i], off));
  }
}

void step_both(Case* k, const Hyper& h, float grad_scale, bool copies, cudaStream_t stream) {
  std::vector<Tensor> hp, hg, hc, dp, dg, dc;
  std::vector<std::vector<Tensor>> hs, ds;
  const bool sgd = h.kind == Kind::kSgd;
  for (size_t i = 0; i < k->p.size(); ++i) {
    hp.push_back(k->p[i].tensor());
    hg.push_back(k->g[i].tensor());
    dp.push_back(k->dp[i]->tensor());
    dg.push_back(k->dg[i]->tensor());
    if (copies) {
      hc.push_back(k->c[i].tensor());
      dc.push_back(k->dc[i]->tensor());
    }
    if (sgd) {
      hs.push_back({k->s0[i].tensor()});
      ds.push_back({k->ds0[i]->tensor()});
    } else {
      hs.push_back({k->s0[i].tensor(), k->s1[i].tensor()});
      ds.push_back({k->ds0[i]->tensor(), k->ds1[i]->tensor()});
    }
  }
  step(hp, hg, hs, h, grad_scale, hc);
  step(dp, dg, ds, h, grad_scale, dc, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
}

void expect_same(const Case& k, const char* what) {
  for (size_t i = 0; i < k.p.size(); ++i) {
    ASSERT_EQ(k.dp[i]->to_host(), k.p[i].bytes)
        << what << ": parameter #" << i << " (" << k.p[i].n << ")";
    ASSERT_EQ(k.ds0[i]->to_host(), k.s0[i].bytes) << what << ": state 0 of #" << i;
    ASSERT_EQ(k.ds1[i]->to_host(), k.s1[i].bytes) << what << ": state 1 of #" << i;
    ASSERT_EQ(k.dc[i]->to_host(), k.c[i].bytes) << what << ": copy of #" << i;
  }
}

TEST(GpuOptim, ManyParametersMixedDtypesMatchHostBitForBit) {
  std::mt19937 rng(3);
  const int64_t c = OptTable::kChunk;
  std::vector<int64_t> sizes = {0, 1, 17, c - 1, c, c + 1, 3 * c + 5};
  while (sizes.size() < 150) sizes.push_back(rng() % 2000);  // > 3 launches of slots
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  for (const Hyper& base : test::hyper_grid()) {
    Case k;
    build(&k, sizes, &rng, true);
    for (int t = 1; t <= 3; ++t) {
      Hyper h = base;
      h.step = t;
      step_both(&k, h, t == 2 ? 0.25f : 1.f, true, stream);
      expect_same(k, kind_name(h.kind));
    }
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

// One parameter of more chunks than a launch holds (it continues in the
// next launch) and the default stream.
TEST(GpuOptim, ParameterSpanningLaunches) {
  std::mt19937 rng(4);
  const int64_t n = (OptTable::kMaxBlocks + 3) * OptTable::kChunk + 7;
  Case k;
  build(&k, {n}, &rng, false);
  Hyper h;
  h.kind = Kind::kAdamW;
  h.weight_decay = 0.1f;
  for (int t = 1; t <= 2; ++t) {
    h.step = t;
    step_both(&k, h, 1.f, false, nullptr);
    expect_same(k, "adamw, one large parameter");
  }
}

}  // namespace
}  // namespace optim
}  // namespace tutti

#else  // !TUTTI_WITH_CUDA

TEST(GpuOptim, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }

#endif  // TUTTI_WITH_CUDA
