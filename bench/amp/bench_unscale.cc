// Fused unscale + non-finite check against memcpy, in the same run.
//
// Every benchmark reports bytes_per_second counting bytes read + written
// (in-place unscale of n float32: 8n; memcpy of 4n bytes: 8n), so the
// ratio to BM_Memcpy at the same traffic is the fraction of the memory
// bandwidth a single thread reaches.  Rates use CPU time (single-threaded
// loops on a shared machine: time the thread was not running is not
// counted).  "wrong" counts elements that differ from the scalar reference
// in a check before timing (must be 0).
//
//   build/bench/amp/bench_amp --benchmark_min_time=0.2 \
//     --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "tutti/amp.h"

namespace {

using tutti::DType;
using tutti::Tensor;

struct Buf {
  DType dtype;
  std::vector<unsigned char> bytes;
  Buf(DType d, int64_t n) : dtype(d), bytes(static_cast<size_t>(n) * tutti::dtype_size(d)) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-100, 100);
    for (int64_t i = 0; i < n; ++i) tutti::store_from_double(bytes.data(), d, i, u(rng));
  }
  int64_t numel() const { return static_cast<int64_t>(bytes.size() / tutti::dtype_size(dtype)); }
  Tensor tensor() { return Tensor(bytes.data(), dtype, tutti::Shape{numel()}); }
};

// Elements of the unscaled copy that differ from float32 multiply + one
// rounding (the reference in tutti/dtype.h).
int64_t count_wrong(DType d, int64_t n) {
  Buf in(d, n), out(d, n);
  out.bytes = in.bytes;
  tutti::amp::unscale_and_check({out.tensor()}, 0.25f);
  int64_t wrong = 0;
  std::vector<unsigned char> expect(tutti::dtype_size(d));
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(tutti::load_as_double(in.bytes.data(), d, i)) * 0.25f;
    tutti::store_from_double(expect.data(), d, 0, v);
    wrong += std::memcmp(expect.data(), out.bytes.data() + i * expect.size(), expect.size()) != 0;
  }
  return wrong;
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) * 4;
  std::vector<unsigned char> a(bytes, 1), b(bytes, 2);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), bytes);
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * bytes);
}

// In place; alternating 1/2 and 2 keeps values away from subnormals.
void unscale_bench(benchmark::State& state, DType d) {
  const int64_t n = state.range(0);
  Buf g(d, n);
  std::vector<Tensor> list = {g.tensor()};
  bool found = false;
  int k = 0;
  for (auto _ : state) {
    found |= tutti::amp::unscale_and_check(list, (k++ & 1) ? 2.0f : 0.5f).found;
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * g.bytes.size());
  state.counters["wrong"] = static_cast<double>(count_wrong(d, std::min<int64_t>(n, 1 << 16)));
  state.counters["found"] = found;
}

void BM_UnscaleF32(benchmark::State& s) { unscale_bench(s, DType::kFloat32); }
void BM_UnscaleF16(benchmark::State& s) { unscale_bench(s, DType::kFloat16); }
void BM_UnscaleBF16(benchmark::State& s) { unscale_bench(s, DType::kBFloat16); }

// The same float32 elements spread over 211 tensors of mixed sizes.
void BM_UnscaleF32List(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<Buf> bufs;
  int64_t left = n;
  for (int i = 0; i < 211 && left > 0; ++i) {
    const int64_t m = i == 210 ? left : std::min(left, (n / 211) * (1 + i % 3) / 2 + 1);
    bufs.emplace_back(DType::kFloat32, m);
    left -= m;
  }
  std::vector<Tensor> list;
  size_t bytes = 0;
  for (auto& b : bufs) {
    list.push_back(b.tensor());
    bytes += b.bytes.size();
  }
  int k = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(tutti::amp::unscale_and_check(list, (k++ & 1) ? 2.0f : 0.5f));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * bytes);
  state.counters["tensors"] = static_cast<double>(list.size());
}

// Read only (bf16 mode, or a check after unscaling elsewhere): bytes read.
void BM_CheckF32(benchmark::State& state) {
  Buf g(DType::kFloat32, state.range(0));
  std::vector<Tensor> list = {g.tensor()};
  for (auto _ : state) benchmark::DoNotOptimize(tutti::amp::check_finite(list));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * g.bytes.size());
}

// float16 gradients -> float32 master gradients, unscaled: 2n read, 4n written.
void BM_ModelGradsToMasterF16(benchmark::State& state) {
  Buf g(DType::kFloat16, state.range(0)), m(DType::kFloat32, state.range(0));
  std::vector<Tensor> gl = {g.tensor()}, ml = {m.tensor()};
  for (auto _ : state) {
    benchmark::DoNotOptimize(tutti::amp::model_grads_to_master(gl, ml, 0.5f));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          (g.bytes.size() + m.bytes.size()));
}

// Sum of squares + max-abs: bytes read.
void BM_NormF32(benchmark::State& state) {
  Buf g(DType::kFloat32, state.range(0));
  std::vector<Tensor> list = {g.tensor()};
  for (auto _ : state) benchmark::DoNotOptimize(tutti::amp::multi_tensor_norms(list));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * g.bytes.size());
}

// Element counts: 64 Ki (L2), 1 Mi (L3), 32 Mi (DRAM: 128 MB of float32).
#define SIZES ->Arg(1 << 16)->Arg(1 << 20)->Arg(1 << 25)
BENCHMARK(BM_Memcpy) SIZES;
BENCHMARK(BM_UnscaleF32) SIZES;
BENCHMARK(BM_UnscaleF16) SIZES;
BENCHMARK(BM_UnscaleBF16) SIZES;
BENCHMARK(BM_UnscaleF32List) SIZES;
BENCHMARK(BM_CheckF32) SIZES;
BENCHMARK(BM_ModelGradsToMasterF16) SIZES;
BENCHMARK(BM_NormF32) SIZES;

}  // namespace

BENCHMARK_MAIN();
