// Sharded optimizer (ZeRO-1/2) against the unsharded optimizer in one run,
// float32 host tensors, Adam.  The "model" is a list of parameters whose
// gradients are filled (no compute): the step is the reducer's gradient
// communication plus the optimizer, which is what sharding changes.
//
// Per variant (unsharded = Reducer all-reduce + optim::step over every
// parameter; zero1; zero2), on every rank, reported for rank 0 with the
// slowest rank's step time:
//   state bytes      float32 master weights + optimizer state this rank holds
//                    (unsharded: the whole model's), and the ratio to
//                    unsharded (expected 1/W, up to uneven shards)
//   optimizer bytes  everything the optimizer allocated (state, stage-2
//                    gradient shard, all-gather buffers: gather_bytes())
//   grad bytes       gradient storage the reducer and optimizer hold
//                    (ShardedOptimizer::gradient_bytes(): bucket buffers, or
//                    stage 2's pool, + gradient shards; unsharded: the
//                    reducer's buckets), not counting the caller's gradients
//                    (the same in every variant)
//   peak heap        the most heap bytes the variant held (model, gradients,
//                    reducer buckets, optimizer), sampled after every step,
//                    and its ratio to unsharded
//   step ms          median over steps of fill gradients + synchronize +
//                    step, the slowest rank's; ratio to unsharded
//   wire bytes       algorithmic bytes a rank sends per step with ring
//                    collectives: all-reduce 2 (W-1)/W * B, reduce-scatter
//                    and all-gather (W-1)/W * B each (B = the model's bytes);
//                    zero2 / unsharded is 1 (zero1 pays the all-gather on top)
// Variants: unsharded, zero1, zero2 (the default pool of 2 bucket
// buffers), zero2-nopool (bucket_buffers = 0: every bucket keeps its
// buffer, the layout before the pool).  Use --cap-mb 2 or so to get several
// buckets (the pool saves nothing on a one-bucket model).
// Output: one JSON object on rank 0's stdout.
//
//   mpiexec -np 4 --oversubscribe bench_zero --params 4000000 --steps 10
//   mpiexec -np 4 --oversubscribe bench_zero --layers 32 --cap-mb 0.5 --steps 5
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tutti/tutti.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int64_t params = 4000000;  // elements, split over `layers` tensors
  int layers = 8;
  int steps = 10;
  int warmup = 2;
  double cap_mb = 25;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--params") a.params = std::atoll(argv[i + 1]);
    else if (k == "--steps") a.steps = std::atoi(argv[i + 1]);
    else if (k == "--warmup") a.warmup = std::atoi(argv[i + 1]);
    else if (k == "--cap-mb") a.cap_mb = std::atof(argv[i + 1]);
    else if (k == "--layers") a.layers = std::atoi(argv[i + 1]);
  }
  return a;
}

// Heap bytes in use (glibc: small blocks + mmapped ones).  Differences of
// this count what a variant allocated, unlike the resident set, which does
// not grow when the allocator reuses an earlier variant's freed memory.
int64_t heap_bytes() {
  const struct mallinfo2 mi = mallinfo2();
  return static_cast<int64_t>(mi.uordblks + mi.hblkhd);
}

struct Result {
  std::string name;
  int64_t state_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t grad_bytes = 0;
  int64_t peak_heap = 0;
  double step_ms = 0;
  double wire_bytes = 0;
};

// stage 0: unsharded reference; 3: stage 2 without the pool.
Result run(const Args& a, int variant) {
  const int stage = variant == 3 ? 2 : variant;
  auto w = tutti::world();
  const int W = w->size();
  const int64_t heap0 = heap_bytes();
  const int kLayers = a.layers;
  const int64_t per = a.params / kLayers;
  std::vector<std::vector<float>> p(kLayers, std::vector<float>(static_cast<size_t>(per)));
  std::vector<std::vector<float>> g = p;
  for (int l = 0; l < kLayers; ++l)
    for (int64_t i = 0; i < per; ++i) p[l][static_cast<size_t>(i)] = 0.01f * static_cast<float>(i % 97);
  tutti::ReducerOptions ro;
  ro.bucket_cap_mb = a.cap_mb;
  ro.learn_bucket_order = false;
  tutti::Reducer reducer(w, ro);
  for (int l = 0; l < kLayers; ++l)
    reducer.add_parameter("layer" + std::to_string(l), tutti::Tensor::of(p[l]), tutti::Tensor::of(g[l]));
  reducer.build();
  tutti::optim::Hyper h;
  h.kind = tutti::optim::Kind::kAdam;
  std::unique_ptr<tutti::ShardedOptimizer> zero;
  std::vector<std::vector<float>> master, m1, m2;  // unsharded state
  Result r;
  const int64_t total = per * kLayers;
  if (stage > 0) {
    tutti::ShardedOptimizerOptions o;
    o.stage = stage;
    if (variant == 3) o.bucket_buffers = 0;
    zero.reset(new tutti::ShardedOptimizer(reducer, h, o));
    r.state_bytes = zero->state_bytes();
    int64_t grad = 0;
    for (const auto& s : zero->shards())
      if (stage == 2) grad += s.shard_numel * 4;
    r.optimizer_bytes = r.state_bytes + zero->gather_bytes() + grad;
    r.name = stage == 1 ? "zero1" : variant == 3 ? "zero2-nopool" : "zero2";
    r.wire_bytes = (stage == 1 ? 3.0 : 2.0) * (W - 1) / W * static_cast<double>(total) * 4;
  } else {
    master = p;
    m1.assign(kLayers, std::vector<float>(static_cast<size_t>(per), 0.f));
    m2 = m1;
    r.state_bytes = total * 4 * 3;
    r.optimizer_bytes = r.state_bytes;
    r.name = "unsharded";
    r.wire_bytes = 2.0 * (W - 1) / W * static_cast<double>(total) * 4;
  }
  std::vector<double> times;
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    w->barrier();
    const auto t0 = Clock::now();
    for (int l = kLayers - 1; l >= 0; --l) {
      std::fill(g[l].begin(), g[l].end(), 0.001f * static_cast<float>(w->rank() + l + s));
      reducer.grad_ready(l);
    }
    reducer.synchronize();
    if (zero) {
      zero->step();
    } else {
      h.step = s + 1;
      std::vector<tutti::Tensor> ps, gs, cs;
      std::vector<std::vector<tutti::Tensor>> ss;
      for (int l = 0; l < kLayers; ++l) {
        ps.push_back(tutti::Tensor::of(master[l]));
        gs.push_back(tutti::Tensor::of(g[l]));
        cs.push_back(tutti::Tensor::of(p[l]));
        ss.push_back({tutti::Tensor::of(m1[l]), tutti::Tensor::of(m2[l])});
      }
      tutti::optim::step(ps, gs, ss, h, 1.f, cs);
    }
    std::vector<double> dt = {std::chrono::duration<double>(Clock::now() - t0).count()};
    w->allreduce(tutti::Tensor::of(dt), tutti::ReduceOp::kMax);
    if (s >= a.warmup) times.push_back(dt[0]);
    r.peak_heap = std::max(r.peak_heap, heap_bytes() - heap0);
  }
  r.grad_bytes = zero ? zero->gradient_bytes() : reducer.stats().bucket_bytes;
  std::sort(times.begin(), times.end());
  r.step_ms = times[times.size() / 2] * 1e3;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  tutti::init();
  int rc = 0;
  try {
    const Args a = parse(argc, argv);
    auto w = tutti::world();
    // Two rounds of the three variants; the second round's results are
    // reported (the first warms the allocator, MPI's buffers and caches,
    // which would otherwise penalise whichever variant runs first).
    std::vector<Result> rs(4);
    for (int round = 0; round < 2; ++round)
      for (int v : {0, 1, 2, 3}) rs[static_cast<size_t>(v)] = run(a, v);
    if (w->rank() == 0) {
      const Result& u = rs[0];
      std::printf("{\"world\": %d, \"params\": %lld, \"steps\": %d, \"variants\": [\n", w->size(),
                  static_cast<long long>(a.params / a.layers * a.layers), a.steps);
      for (size_t i = 0; i < rs.size(); ++i) {
        const Result& r = rs[i];
        std::printf(
            "  {\"name\": \"%s\", \"state_bytes\": %lld, \"state_ratio\": %.4f, "
            "\"optimizer_bytes\": %lld, \"grad_bytes\": %lld, \"grad_ratio\": %.4f, "
            "\"peak_heap\": %lld, \"heap_ratio\": %.3f, "
            "\"step_ms\": %.2f, "
            "\"step_ratio\": %.3f, \"wire_bytes\": %.0f, \"wire_ratio\": %.3f}%s\n",
            r.name.c_str(), static_cast<long long>(r.state_bytes),
            static_cast<double>(r.state_bytes) / static_cast<double>(u.state_bytes),
            static_cast<long long>(r.optimizer_bytes), static_cast<long long>(r.grad_bytes),
            static_cast<double>(r.grad_bytes) / static_cast<double>(u.grad_bytes),
            static_cast<long long>(r.peak_heap),
            static_cast<double>(r.peak_heap) / static_cast<double>(u.peak_heap),
            r.step_ms, r.step_ms / u.step_ms, r.wire_bytes,
            u.wire_bytes > 0 ? r.wire_bytes / u.wire_bytes : 1.0, i + 1 < rs.size() ? "," : "");
      }
      std::printf("]}\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_zero: %s\n", e.what());
    rc = 1;
  }
  tutti::shutdown();
  return rc;
}
