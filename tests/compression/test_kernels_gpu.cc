// CUDA kernels of the compressors against their CPU references, on fresh
// random inputs with poisoned outputs (labelled gpu: skipped without a
// device).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "compression/cast.h"
#include "compression/common.h"
#include "compression/onebit.h"
#include "compression/powersgd.h"
#include "compression/topk.h"

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/compression_cast.h"
#include "kernels/compression_common.h"
#include "kernels/compression_onebit.h"
#include "kernels/compression_powersgd.h"
#include "core/cuda_utils.h"
#include "kernels/compression_topk.h"
#endif

namespace tutti {
namespace compression {
namespace {

#if TUTTI_WITH_CUDA

void check(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// Device memory poisoned with 0xff bytes (NaN for floats).
class Dev {
 public:
  explicit Dev(size_t bytes) : bytes_(bytes) {
    if (bytes) {
      check(cudaMalloc(&p_, bytes));
      check(cudaMemset(p_, 0xff, bytes));
    }
  }
  ~Dev() {
    if (p_) cudaFree(p_);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  // Landed when it returns (a cudaMemcpy from pageable memory may return
  // before its DMA does, and kernels may run on non-blocking streams).
  void put(const void* host) {
    check(cudaMemcpy(p_, host, bytes_, cudaMemcpyHostToDevice));
    check(cudaStreamSynchronize(cudaStreamLegacy));
  }
  template <typename T>
  std::vector<T> get() const {
    std::vector<T> v(bytes_ / sizeof(T));
    check(cudaDeviceSynchronize());
    check(cudaMemcpy(v.data(), p_, bytes_, cudaMemcpyDeviceToHost));
    return v;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_;
};

std::vector<float> random_floats(int64_t n, uint64_t seed, bool ties) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  for (int64_t i = 0; ties && i < n; i += 5) v[i] = (i % 2) ? 0.75f : -0.75f;
  return v;
}

std::vector<unsigned char> as_dtype(const std::vector<float>& v, DType dt) {
  std::vector<unsigned char> out(v.size() * dtype_size(dt));
  convert(v.data(), DType::kFloat32, out.data(), dt, v.size());
  return out;
}

const DType kFloats[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
const int64_t kSizes[] = {1, 7, 4097, 100003};

class GpuKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    guard_.emplace(0);  // launches check that tutti set the thread's device
  }
  void TearDown() override { guard_.reset(); }

 private:
  std::optional<cuda::DeviceGuard> guard_;
};

TEST_F(GpuKernels, StagingOpsMatchCpuExactly) {
  for (DType dt : kFloats)
    for (int64_t n : kSizes) {
      const auto src = as_dtype(random_floats(n, n, false), dt);
      const auto acc0 = random_floats(n, n + 1, false);
      Dev dsrc(src.size()), dacc(n * 4), dout(n * 4), dback(src.size());
      dsrc.put(src.data());
      dacc.put(acc0.data());
      kernels::launch_accumulate_f32(dsrc.as<void>(), dt, dacc.as<float>(), n, nullptr);
      kernels::launch_load_f32(dsrc.as<void>(), dt, dout.as<float>(), n, nullptr);
      kernels::launch_store_f32(dacc.as<float>(), 3.0f, dback.as<void>(), dt, n, nullptr);
      std::vector<float> acc = acc0, loaded(n);
      std::vector<unsigned char> back(src.size());
      cpu::accumulate_f32(src.data(), dt, acc.data(), n);
      cpu::load_f32(src.data(), dt, loaded.data(), n);
      cpu::store_f32(acc.data(), 3.0f, back.data(), dt, n);
      EXPECT_EQ(dacc.get<float>(), acc) << dtype_name(dt) << " n=" << n;
      EXPECT_EQ(dout.get<float>(), loaded) << dtype_name(dt) << " n=" << n;
      EXPECT_EQ(dback.get<unsigned char>(), back) << dtype_name(dt) << " n=" << n;
    }
}

TEST_F(GpuKernels, CastConvertMatchesCpuExactly) {
  for (DType src_dt : kFloats)
    for (DType wire : {DType::kFloat16, DType::kBFloat16})
      for (int64_t n : kSizes) {
        const auto src = as_dtype(random_floats(n, 2 * n, false), src_dt);
        Dev dsrc(src.size()), dw(n * 2);
        dsrc.put(src.data());
        kernels::launch_cast_convert(dsrc.as<void>(), src_dt, dw.as<void>(), wire, n, 4.0f, nullptr);
        std::vector<uint16_t> want(n);
        cast_convert_cpu(src.data(), src_dt, want.data(), wire, n, 4.0f);
        EXPECT_EQ(dw.get<uint16_t>(), want) << dtype_name(src_dt) << "->" << dtype_name(wire);
      }
}

// The device selection pipeline, as the top-k compressor runs it.
void gpu_topk_select(float* x, int64_t n, int64_t k, uint32_t* idx, float* val) {
  const int64_t ntiles = kernels::topk_tiles(n);
  Dev ws(256 + kernels::kTopkHistBins * 4 + ntiles * 16);
  char* base = ws.as<char>();
  auto* state = reinterpret_cast<kernels::TopkDeviceState*>(base);
  auto* hist = reinterpret_cast<uint32_t*>(base + 256);
  auto* above = reinterpret_cast<int64_t*>(base + 256 + kernels::kTopkHistBins * 4);
  for (int level = 0; level < 3; ++level) {
    kernels::launch_topk_histogram(x, n, level, state, hist, nullptr);
    kernels::launch_topk_pick_bin(hist, level, k, state, nullptr);
  }
  kernels::launch_topk_tile_count(x, n, state, above, above + ntiles, nullptr);
  kernels::launch_topk_tile_scan(above, above + ntiles, ntiles, nullptr);
  kernels::launch_topk_compact(x, n, state, above, above + ntiles, idx, val, nullptr);
  check(cudaDeviceSynchronize());
}

// Selects the top k of x on the device (pairs into didx/dval, k each) and on
// the CPU (into idx/val); expects the same pairs and the same residual.
void expect_topk_equal(std::vector<float> x, int64_t k, const Dev& didx,
                       const Dev& dval, std::vector<uint32_t>* idx,
                       std::vector<float>* val, TopkScratch* scratch) {
  const int64_t n = static_cast<int64_t>(x.size());
  Dev dx(n * 4);
  dx.put(x.data());
  gpu_topk_select(dx.as<float>(), n, k, didx.as<uint32_t>(), dval.as<float>());
  idx->assign(k, 0);
  val->assign(k, 0.0f);
  topk_select_cpu(x.data(), n, k, idx->data(), val->data(), scratch);
  EXPECT_EQ(didx.get<uint32_t>(), *idx) << "indices";
  EXPECT_EQ(dval.get<float>(), *val) << "values";
  EXPECT_EQ(dx.get<float>(), x) << "residual";
}

TEST_F(GpuKernels, TopkSelectionMatchesCpuExactly) {
  TopkScratch scratch;
  for (int64_t n : kSizes)
    for (bool ties : {false, true})
      for (int64_t k : {int64_t{1}, std::max<int64_t>(1, n / 100), n}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k << " ties=" << ties);
        Dev didx(k * 4), dval(k * 4);
        std::vector<uint32_t> idx;
        std::vector<float> val;
        expect_topk_equal(random_floats(n, 3 * n + k, ties), k, didx, dval, &idx, &val,
                          &scratch);
        // Decoding: scatter-add of the pairs.
        std::vector<float> out0 = random_floats(n, 7, false), out = out0;
        Dev dout(n * 4);
        dout.put(out0.data());
        kernels::launch_topk_scatter_add(didx.as<uint32_t>(), dval.as<float>(), k,
                                         dout.as<float>(), nullptr);
        topk_scatter_add_cpu(idx.data(), val.data(), k, out.data());
        EXPECT_EQ(dout.get<float>(), out);
      }
}

// Ties at the threshold and k landing exactly on, just before and just
// after the edges of the radix bins (and of the pick_bin scan's per-thread
// chunks): values are built so whole bins hold known counts.
TEST_F(GpuKernels, TopkSelectionWithTiesAndBinEdgesMatchesCpuExactly) {
  TopkScratch scratch;
  const int64_t n = 50000;
  // Level-0 bins are the top 11 key bits: 1.0f, 2.0f, 4.0f ... sit in
  // distinct bins; within a bin, equal values tie on every level.
  std::vector<float> base(static_cast<size_t>(n));
  int64_t counts[] = {0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) {
    const int c = static_cast<int>((i * 7) % 4);
    const float mag = c == 0 ? 8.0f : c == 1 ? 4.0f : c == 2 ? 2.0f : 1.0f;
    base[i] = (i % 3 == 0) ? -mag : mag;
    ++counts[c];
  }
  std::vector<int64_t> ks;
  int64_t edge = 0;
  for (int c = 0; c < 4; ++c) {
    edge += counts[c];  // k == edge ends exactly on a bin boundary
    for (int64_t d : {-1, 0, 1})
      if (edge + d >= 1 && edge + d <= n) ks.push_back(edge + d);
  }
  ks.push_back(1);
  ks.push_back(counts[0] / 2);  // inside a single tied bin
  for (int64_t k : ks) {
    SCOPED_TRACE(::testing::Message() << "k=" << k);
    Dev didx(k * 4), dval(k * 4);
    std::vector<uint32_t> idx;
    std::vector<float> val;
    expect_topk_equal(base, k, didx, dval, &idx, &val, &scratch);
  }
}

TEST_F(GpuKernels, NonfiniteFlagMatchesCpu) {
  const float inf = std::numeric_limits<float>::infinity();
  for (DType dt : kFloats)
    for (int64_t n : kSizes)
      for (int where : {-1, 0, 1}) {  // none, a NaN, an Inf (at the end)
        std::vector<float> v = random_floats(n, 13 * n, false);
        if (where == 0) v[n - 1] = std::nanf("");
        if (where == 1) v[n / 2] = -inf;
        const auto src = as_dtype(v, dt);
        Dev dsrc(src.size()), dflag(4);
        dsrc.put(src.data());
        kernels::launch_nonfinite_flag(dsrc.as<void>(), dt, n, dflag.as<int32_t>(), nullptr);
        const int32_t want = cpu::any_nonfinite(src.data(), dt, n) ? 1 : 0;
        EXPECT_EQ(want, where >= 0 ? 1 : 0);
        EXPECT_EQ(dflag.get<int32_t>()[0], want)
            << dtype_name(dt) << " n=" << n << " where=" << where;
      }
}

// The batched launch (a block per slot) against the one-slot launcher
// (bitwise: the same block code) and the CPU reference, for several slot
// counts and shapes, with an orthonormality check of the result.
TEST_F(GpuKernels, PowerSgdBatchedOrthogonalizeMatchesSingleAndCpu) {
  for (int slots : {1, 2, 5, 17}) {
    std::vector<kernels::PowerSgdOrthoSlot> table;
    int64_t total = 0;
    for (int s = 0; s < slots; ++s) {
      const int64_t m = 1 + (s * 211) % 700, r = std::min<int64_t>(m, 1 + s % 4);
      table.push_back({total, m, r, static_cast<uint64_t>(100 + s)});
      total += m * r;
    }
    std::vector<float> p = random_floats(total, 17 + slots, false);
    Dev dp(total * 4), done(total * 4), dtable(table.size() * sizeof(table[0]));
    dp.put(p.data());
    done.put(p.data());
    dtable.put(table.data());
    kernels::launch_powersgd_orthogonalize_slots(
        dp.as<float>(), dtable.as<kernels::PowerSgdOrthoSlot>(), slots, 5, nullptr);
    for (const auto& t : table)
      kernels::launch_powersgd_orthogonalize(done.as<float>() + t.p_off, t.m, t.r,
                                             5, t.stream_id, nullptr);
    const auto batched = dp.get<float>(), single = done.get<float>();
    ASSERT_EQ(batched, single) << slots << " slots";
    for (const auto& t : table) {
      float* cp = p.data() + t.p_off;
      powersgd_orthogonalize_cpu(cp, t.m, t.r, 5, t.stream_id);
      for (int64_t i = 0; i < t.m * t.r; ++i)
        ASSERT_NEAR(batched[t.p_off + i], cp[i], 1e-4) << "slot at " << t.p_off;
      for (int64_t a = 0; a < t.r; ++a)
        for (int64_t b = 0; b <= a; ++b) {
          double d = 0;
          for (int64_t row = 0; row < t.m; ++row)
            d += double(batched[t.p_off + row * t.r + a]) * batched[t.p_off + row * t.r + b];
          ASSERT_NEAR(d, a == b ? 1.0 : 0.0, 1e-4) << "columns " << a << ", " << b;
        }
    }
  }
}

TEST_F(GpuKernels, PowerSgdKernelsMatchCpu) {
  for (int64_t m : {1, 5, 300, 2049})
    for (int64_t r : {1, 4}) {
      std::vector<float> p = random_floats(m * r, m + r, false);
      if (m > 2) for (int64_t i = 0; i < m; ++i) p[i * r + (r - 1)] = p[i * r];  // dependent
      Dev dp(m * r * 4);
      dp.put(p.data());
      kernels::launch_powersgd_orthogonalize(dp.as<float>(), m, r, 5, 6, nullptr);
      powersgd_orthogonalize_cpu(p.data(), m, r, 5, 6);
      const auto gp = dp.get<float>();
      for (int64_t i = 0; i < m * r; ++i)
        ASSERT_NEAR(gp[i], p[i], 1e-4) << "orthogonalize m=" << m << " r=" << r << " at " << i;
      for (DType dt : kFloats) {
        const int64_t n = 333;
        const std::vector<float> q = random_floats(n * r, 9, false);
        std::vector<float> res = random_floats(m * n, 10, false);
        Dev dq(n * r * 4), dres(m * n * 4), dgrad(m * n * dtype_size(dt));
        dp.put(p.data());
        dq.put(q.data());
        dres.put(res.data());
        kernels::launch_powersgd_decompress(dp.as<float>(), dq.as<float>(), m, n, r,
                                            dres.as<float>(), dgrad.as<void>(), dt, nullptr);
        std::vector<float> qt(n * r);
        std::vector<unsigned char> grad(m * n * dtype_size(dt));
        powersgd_decompress_cpu(p.data(), q.data(), m, n, r, res.data(), grad.data(), dt, qt.data());
        EXPECT_EQ(dres.get<float>(), res) << "residual " << dtype_name(dt);
        EXPECT_EQ(dgrad.get<unsigned char>(), grad) << "grad " << dtype_name(dt);
      }
    }
}

TEST_F(GpuKernels, OnebitKernelsMatchCpu) {
  for (int64_t n : kSizes)
    for (int64_t chunk : {32, 2048}) {
      std::vector<float> x = random_floats(n, 11 * n + chunk, true);
      const int64_t words = onebit_block_words(n, chunk), nchunks = onebit_chunks(n, chunk);
      Dev dx(n * 4), dblock(words * 4);
      dx.put(x.data());
      kernels::launch_onebit_encode(dx.as<float>(), n, chunk, dblock.as<uint32_t>(), nullptr);
      std::vector<uint32_t> block(words);
      onebit_encode_cpu(x.data(), n, chunk, block.data());
      const auto gblock = dblock.get<uint32_t>();
      for (int64_t c = 0; c < nchunks; ++c) {
        float a, b;
        std::memcpy(&a, &gblock[c], 4);
        std::memcpy(&b, &block[c], 4);
        ASSERT_NEAR(a, b, 1e-6 * std::fabs(b)) << "scale of chunk " << c;
      }
      for (int64_t w = nchunks; w < words; ++w) ASSERT_EQ(gblock[w], block[w]) << "word " << w;
      const auto gx = dx.get<float>();
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(gx[i], x[i], 1e-5) << "residual " << i;
      // Decode three ranks' blocks (the CPU's, so both sides see the same).
      const int world = 3;
      std::vector<uint32_t> blocks;
      for (int rr = 0; rr < world; ++rr) blocks.insert(blocks.end(), block.begin(), block.end());
      for (DType dt : kFloats) {
        Dev dblocks(blocks.size() * 4), dout(n * dtype_size(dt));
        dblocks.put(blocks.data());
        kernels::launch_onebit_decode_sum(dblocks.as<uint32_t>(), world, n, chunk, 3.0f,
                                          dout.as<void>(), dt, nullptr);
        std::vector<unsigned char> out(n * dtype_size(dt));
        onebit_decode_sum_cpu(blocks.data(), world, n, chunk, 3.0f, out.data(), dt);
        EXPECT_EQ(dout.get<unsigned char>(), out) << dtype_name(dt) << " n=" << n;
      }
    }
}

TEST_F(GpuKernels, LaunchersRejectBadArguments) {
  EXPECT_THROW(kernels::launch_onebit_encode(nullptr, 10, 48, nullptr, nullptr), Error);
  EXPECT_THROW(kernels::launch_topk_pick_bin(nullptr, 3, 1, nullptr, nullptr), Error);
  EXPECT_THROW(kernels::launch_cast_convert(nullptr, DType::kInt32, nullptr, DType::kFloat16,
                                            4, 1.0f, nullptr),
               Error);
}

#else

TEST(GpuKernels, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }

#endif  // TUTTI_WITH_CUDA

}  // namespace
}  // namespace compression
}  // namespace tutti
