// Encode + decode throughput of every compressor on one process, next to
// memcpy of the same bytes in the same run, and the bytes each sends.
//
// A world of one: the all-reduce / all-gather inside each compressor is a
// local copy at most, so the time is the compressor's own arithmetic
// (encode + decode; the codec cost that auto weighs against the link).
// Counters per run:
//   bytes_per_second  gradient bytes compressed+decompressed per second
//   encode_ms/decode_ms  per step, from the compressor's stats
//   payload_ratio     bytes this rank contributes to collectives / gradient
//                     bytes (all-gather payload for top-k and 1-bit, the
//                     all-reduced buffers otherwise)
//   wire_ratio_w8     bytes sent per rank at 8 ranks under the ring model
//                     (all-reduce 2(W-1)/W * B, all-gather (W-1) * b) /
//                     those of an uncompressed all-reduce
// The bucket: n float32 elements as 1024-row matrices (1024 x (n/k - 1))
// each followed by a 1024-element bias, like a stack of linear layers.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "compression/common.h"
#include "tutti/tutti.h"

namespace {

using namespace tutti;

std::vector<float> gradient(int64_t n) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> d(0.0f, 1e-3f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

BucketLayout layout(int64_t n) {
  BucketLayout l;
  l.numel = n;
  const int64_t layer = 1024 * 1024;
  for (int64_t off = 0; off + layer <= n; off += layer) {
    l.slots.push_back({"w", off, Shape{1024, 1023}});
    l.slots.push_back({"b", off + 1024 * 1023, Shape{1024}});
  }
  return l;
}

void BM_Memcpy(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> src = gradient(n), dst(src.size());
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size() * 4);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 4);
}

void BM_Compressor(benchmark::State& state, const char* name) {
  const int64_t n = state.range(0);
  const std::vector<float> g = gradient(n);
  std::vector<float> bucket = g;
  auto c = make_compressor(name);
  const BucketLayout l = layout(n);
  c->setup(l);
  auto* bc = dynamic_cast<compression::BucketCompressor*>(c.get());
  CompressContext ctx;
  ctx.comm = world().get();
  int64_t step = 0;
  c->reset_stats();
  for (auto _ : state) {
    state.PauseTiming();
    std::memcpy(bucket.data(), g.data(), g.size() * 4);
    state.ResumeTiming();
    ctx.step = step++;
    c->allreduce(0, Tensor::of(bucket), ctx);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 4);
  const CompressStats st = c->stats();
  const double it = static_cast<double>(state.iterations());
  state.counters["encode_ms"] = st.encode_seconds / it * 1e3;
  state.counters["decode_ms"] = st.decode_seconds / it * 1e3;
  const compression::Payload p = bc->payload(0, step);
  const double bytes = static_cast<double>(n) * 4;
  state.counters["payload_ratio"] =
      static_cast<double>(p.allreduce_bytes + p.allgather_bytes) / bytes;
  compression::Payload plain;
  plain.allreduce_bytes = static_cast<uint64_t>(bytes);
  state.counters["wire_ratio_w8"] =
      static_cast<double>(compression::wire_bytes(p, 8)) /
      static_cast<double>(compression::wire_bytes(plain, 8));
}

const int64_t kSizes[] = {int64_t{1} << 20, int64_t{16} << 20};

void register_all() {
  for (int64_t n : kSizes)
    benchmark::RegisterBenchmark("memcpy", BM_Memcpy)->Arg(n)->Unit(benchmark::kMillisecond);
  for (const char* name : {"none", "fp16", "bf16", "topk", "powersgd", "onebit"})
    for (int64_t n : kSizes)
      benchmark::RegisterBenchmark(name, BM_Compressor, name)
          ->Arg(n)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  tutti::init();
  benchmark::Initialize(&argc, argv);
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  tutti::shutdown();
  return 0;
}
