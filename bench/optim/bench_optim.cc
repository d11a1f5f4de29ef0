// Fused multi-tensor AdamW / SGD-momentum step (tutti::optim::step, one pass
// per element) against a per-tensor loop of separate element-wise passes,
// the shape of torch.optim's single-tensor path (foreach=False: for every
// tensor, grad.add, lerp_, mul_, addcmul_, sqrt, div, add_, addcdiv_ each
// sweep the tensor), in the same run.  Both do float32 scalar-width C++ for
// the per-tensor loop, compiled for AVX2 + FMA without errno (so GCC
// vectorises every pass, as ATen's kernels are), and tutti's own lanes for
// the fused step.
//
// bytes_per_second counts the step's compulsory traffic (Adam: read p, g,
// m, v and write p, m, v = 28 bytes per element; SGD momentum: 20), the same
// for both variants, so the ratio of two rates is the speed-up.  Rates use
// CPU time (single-threaded loops on a shared machine).
//
//   build/bench/optim/bench_optim --benchmark_min_time=0.2 \
//     --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
// The baseline's sqrt pass only vectorises without errno.
#pragma GCC optimize("no-math-errno")
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "tutti/optim.h"

namespace {

using tutti::Tensor;
using tutti::optim::Hyper;
using tutti::optim::Kind;

struct Model {
  std::vector<std::vector<float>> p, g, m, v, tmp;
  Model(int64_t tensors, int64_t n) {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.f, 1.f);
    for (int64_t t = 0; t < tensors; ++t) {
      std::vector<float> a(n);
      for (float& x : a) x = d(rng);
      p.push_back(a);
      for (float& x : a) x = d(rng);
      g.push_back(a);
      m.emplace_back(n, 0.f);
      v.emplace_back(n, 0.f);
      tmp.emplace_back(n, 0.f);
    }
  }
  std::vector<Tensor> list(std::vector<std::vector<float>>& x) {
    std::vector<Tensor> out;
    for (auto& a : x) out.push_back(Tensor::of(a));
    return out;
  }
  std::vector<std::vector<Tensor>> states(bool adam) {
    std::vector<std::vector<Tensor>> out;
    for (size_t i = 0; i < p.size(); ++i) {
      if (adam)
        out.push_back({Tensor::of(m[i]), Tensor::of(v[i])});
      else
        out.push_back({Tensor::of(m[i])});
    }
    return out;
  }
};

void set_rate(benchmark::State& state, int64_t elems, int bytes_per_elem) {
  state.SetBytesProcessed(state.iterations() * elems * bytes_per_elem);
  state.counters["elems"] = static_cast<double>(elems);
}

// tutti::optim::step over the model's tensors, step numbers 1, 2, ...
void run_fused(benchmark::State& state, Hyper h, int bytes_per_elem) {
  Model model(state.range(0), state.range(1));
  auto p = model.list(model.p), g = model.list(model.g);
  auto s = model.states(h.kind != Kind::kSgd);
  int64_t t = 0;
  for (auto _ : state) {
    h.step = ++t;
    tutti::optim::step(p, g, s, h);
    benchmark::ClobberMemory();
  }
  set_rate(state, state.range(0) * state.range(1), bytes_per_elem);
}

void BM_FusedAdam(benchmark::State& state) {
  Hyper h;
  h.kind = Kind::kAdamW;
  h.weight_decay = 0.01f;
  run_fused(state, h, 28);
}

// torch.optim.AdamW's single-tensor path, one element-wise pass per op.
__attribute__((target("avx2,fma"))) void BM_PerTensorAdam(benchmark::State& state) {
  Model model(state.range(0), state.range(1));
  const int64_t n = state.range(1);
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  int64_t t = 0;
  for (auto _ : state) {
    ++t;
    const float bc1 = 1 - std::pow(b1, float(t)), bc2s = std::sqrt(1 - std::pow(b2, float(t)));
    for (size_t k = 0; k < model.p.size(); ++k) {
      float *p = model.p[k].data(), *g = model.g[k].data(), *m = model.m[k].data();
      float *v = model.v[k].data(), *d = model.tmp[k].data();
      for (int64_t i = 0; i < n; ++i) p[i] *= 1 - lr * wd;                       // p.mul_
      for (int64_t i = 0; i < n; ++i) m[i] = std::fma(1 - b1, g[i] - m[i], m[i]);  // lerp_
      for (int64_t i = 0; i < n; ++i) v[i] *= b2;                                // mul_
      for (int64_t i = 0; i < n; ++i) v[i] = std::fma((1 - b2) * g[i], g[i], v[i]);  // addcmul_
      for (int64_t i = 0; i < n; ++i) d[i] = std::sqrt(v[i]);                    // sqrt
      for (int64_t i = 0; i < n; ++i) d[i] /= bc2s;                              // div
      for (int64_t i = 0; i < n; ++i) d[i] += eps;                               // add_
      for (int64_t i = 0; i < n; ++i) p[i] += (-lr / bc1) * m[i] / d[i];         // addcdiv_
    }
    benchmark::ClobberMemory();
  }
  set_rate(state, state.range(0) * n, 28);
}

void BM_FusedSgdMomentum(benchmark::State& state) {
  Hyper h;
  h.kind = Kind::kSgd;
  h.lr = 0.01f;
  h.momentum = 0.9f;
  h.weight_decay = 1e-4f;
  run_fused(state, h, 20);
}

// torch.optim.SGD's single-tensor path: grad.add (a new tensor), buf.mul_,
// buf.add_, p.add_.
__attribute__((target("avx2,fma"))) void BM_PerTensorSgdMomentum(
    benchmark::State& state) {
  Model model(state.range(0), state.range(1));
  const int64_t n = state.range(1);
  const float lr = 0.01f, mom = 0.9f, wd = 1e-4f;
  for (auto _ : state) {
    for (size_t k = 0; k < model.p.size(); ++k) {
      float *p = model.p[k].data(), *g = model.g[k].data(), *b = model.m[k].data();
      float* d = model.tmp[k].data();
      for (int64_t i = 0; i < n; ++i) d[i] = std::fma(wd, p[i], g[i]);  // grad.add(p, alpha=wd)
      for (int64_t i = 0; i < n; ++i) b[i] *= mom;                       // buf.mul_
      for (int64_t i = 0; i < n; ++i) b[i] += d[i];                      // buf.add_
      for (int64_t i = 0; i < n; ++i) p[i] = std::fma(-lr, b[i], p[i]);  // p.add_
    }
    benchmark::ClobberMemory();
  }
  set_rate(state, state.range(0) * n, 20);
}

// {tensors, elements per tensor}: many small (1 Mi total), a few medium
// (4 Mi), one large (16 Mi, beyond the caches).
#define SIZES \
  ->Args({1024, 1024})->Args({64, 65536})->Args({1, 1 << 24})->Unit(benchmark::kMillisecond)
BENCHMARK(BM_FusedAdam) SIZES;
BENCHMARK(BM_PerTensorAdam) SIZES;
BENCHMARK(BM_FusedSgdMomentum) SIZES;
BENCHMARK(BM_PerTensorSgdMomentum) SIZES;

}  // namespace

BENCHMARK_MAIN();
