// A small, fully deterministic data-parallel training program for the
// resume and preemption tests.
//
// Model: an MLP 8 -> 16 (tanh) -> 1, float32, parameters replicated.  Data:
// 1024 synthetic samples, shuffled each epoch by an RNG whose state, with
// the data cursor, goes into the checkpoint manifest; a second RNG adds
// input noise.  The global batch (24 samples) is split across the ranks.
//
// Gradient averaging is a plain world()->allreduce over int64 fixed point:
// each rank sums per-sample gradients quantised to 2^-30, so the sum is
// exact and independent of how the batch is split -- a 4-rank and a 2-rank
// run give bit-identical parameters, which is what the 4 -> 2 resume test
// compares.  (The data-parallel reducer, the real loss scaler and the real
// compressors will replace the stand-ins below once they land; each is one
// line in `components`.)
//
// Stand-ins with the shape of the real components' state:
//   scaler      dynamic loss scale (float32[1]) and growth tracker
//               (int64[1]); an overflow skips the step and halves the scale
//   compressor  error-feedback residual per bucket, per rank: rounds the
//               local gradient to bfloat16 precision and keeps the rest
//               (ShardInfo: dim 0 of a [world, n] tensor; rank-local, so a
//               resume at another world size resets it: --reset-compressor)
//   optimizer   SGD momentum; with --zero the momentum is flat-sharded
//               ZeRO-style over the ranks (uneven splits) and parameters are
//               re-assembled with allgatherv
//
//   tiny_train --dir D --steps N [--save-every K] [--zero] [--compress]
//              [--step-ms M] [--kill-at S] [--out PREFIX] [--reset-compressor]
// Prints "RESUMED <step>" / "FRESH", "PREEMPTED <step>" on a stop notice
// (exit 75 after the checkpoint committed), "SAVED-NOW <step>" when the
// ranks agree on a rebalance recommendation (PreemptionMonitor::decide:
// a checkpoint of that step, and training goes on), "DONE <step>" at the
// end.
// --kill-at S: SIGKILL rank (S mod world) at step S while its async save of
// step S may still be in flight -- only when TUTTI_RESTART_COUNT is unset or
// 0, so that the job tutti-run restarts runs to the end.
// --out PREFIX: every rank writes its whole state (parameters, momentum,
// scaler, residuals) to PREFIX.rank<R> for byte comparison.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tutti/checkpoint.h"
#include "tutti/preemption.h"
#include "tutti/tutti.h"

using namespace tutti;

namespace {

constexpr int kIn = 8, kHidden = 16;
constexpr int kSamples = 1024, kBatch = 24;
constexpr int64_t kParams = kHidden * kIn + kHidden + kHidden + 1;  // 161
constexpr double kFixed = 1073741824.0;                            // 2^30

std::pair<int64_t, int64_t> split(int64_t n, int parts, int i) {
  const int64_t base = n / parts, rem = n % parts;
  return {i * base + std::min<int64_t>(i, rem), base + (i < rem ? 1 : 0)};
}

// ---- components ------------------------------------------------------------

struct Model : Stateful {
  std::vector<float> p = std::vector<float>(kParams);  // w1 | b1 | w2 | b2
  float* w1() { return p.data(); }
  float* b1() { return p.data() + kHidden * kIn; }
  float* w2() { return b1() + kHidden; }
  float* b2() { return w2() + kHidden; }
  void init() {
    std::mt19937_64 g(42);
    std::normal_distribution<float> n(0.f, 0.3f);
    for (auto& x : p) x = n(g);
  }
  StateDict state_dict() override {
    return {{"w1", Tensor(w1(), DType::kFloat32, Shape{kHidden, kIn}), {}},
            {"b1", Tensor(b1(), DType::kFloat32, Shape{kHidden}), {}},
            {"w2", Tensor(w2(), DType::kFloat32, Shape{1, kHidden}), {}},
            {"b2", Tensor(b2(), DType::kFloat32, Shape{1}), {}}};
  }
};

struct Optimizer : Stateful {
  bool zero = false;
  int64_t lo = 0, n = kParams;  // this rank's momentum slice
  std::vector<float> m;
  int64_t steps = 0;
  void setup(bool z, int world, int rank) {
    zero = z;
    if (zero) std::tie(lo, n) = split(kParams, world, rank);
    m.assign(static_cast<size_t>(n), 0.f);
  }
  StateDict state_dict() override {
    ShardInfo s;
    if (zero) {
      s.global_shape = {kParams};
      s.flat = true;
      s.offset = lo;
      s.group = "dp";
    }
    return {{"momentum", Tensor(m.data(), DType::kFloat32, Shape{n}), s},
            {"steps", Tensor(&steps, DType::kInt64, Shape{}), {}}};
  }
};

struct Scaler : Stateful {
  float scale = 32768.f;
  int64_t growth = 0;
  int64_t skipped = 0;
  StateDict state_dict() override {
    return {{"scale", Tensor(&scale, DType::kFloat32, Shape{1}), {}},
            {"growth_tracker", Tensor(&growth, DType::kInt64, Shape{1}), {}},
            {"skipped", Tensor(&skipped, DType::kInt64, Shape{1}), {}}};
  }
};

struct Compressor : Stateful {
  // Buckets: [w1, b1] and [w2, b2].
  std::vector<float> r0 = std::vector<float>(kHidden * kIn + kHidden);
  std::vector<float> r1 = std::vector<float>(kHidden + 1);
  int world = 1, rank = 0;
  StateDict state_dict() override {
    auto info = [&](int64_t len) {
      ShardInfo s;
      s.global_shape = {world, len};
      s.dim = 0;
      s.offset = rank;
      s.group = "dp";
      return s;
    };
    const auto n0 = static_cast<int64_t>(r0.size()), n1 = static_cast<int64_t>(r1.size());
    return {{"residual/bucket0", Tensor(r0.data(), DType::kFloat32, Shape{1, n0}), info(n0)},
            {"residual/bucket1", Tensor(r1.data(), DType::kFloat32, Shape{1, n1}), info(n1)}};
  }
  void compress(std::vector<double>& g) {
    size_t k = 0;
    for (auto* r : {&r0, &r1})
      for (auto& res : *r) {
        const float v = static_cast<float>(g[k]) + res;
        const float sent = bfloat16_to_float(float_to_bfloat16(v));
        res = v - sent;
        g[k++] = sent;
      }
  }
};

// ---- data --------------------------------------------------------------------

void sample(int idx, float* x, float* y) {
  double s = 0;
  for (int j = 0; j < kIn; ++j) {
    x[j] = static_cast<float>(std::sin(0.37 * idx + 1.3 * j) * 1.5);
    s += x[j] * (j % 3 - 1) * 0.7;
  }
  *y = static_cast<float>(std::tanh(s) + 0.1 * std::cos(idx * 0.01));
}

struct DataState {
  std::mt19937_64 order{1234};
  std::mt19937_64 noise{99};
  std::vector<int> perm;
  int64_t cursor = 0, epoch = 0;
  void new_epoch() {
    perm.resize(kSamples);
    for (int i = 0; i < kSamples; ++i) perm[static_cast<size_t>(i)] = i;
    std::shuffle(perm.begin(), perm.end(), order);
    cursor = 0;
  }
  nlohmann::json to_json() const {
    std::ostringstream a, b;
    a << order;
    b << noise;
    return {{"order_rng", a.str()}, {"noise_rng", b.str()}, {"cursor", cursor},
            {"epoch", epoch}, {"perm", perm}};
  }
  void from_json(const nlohmann::json& j) {
    std::istringstream a(j.at("order_rng").get<std::string>());
    std::istringstream b(j.at("noise_rng").get<std::string>());
    a >> order;
    b >> noise;
    cursor = j.at("cursor").get<int64_t>();
    epoch = j.at("epoch").get<int64_t>();
    perm = j.at("perm").get<std::vector<int>>();
  }
};

// ---- one step ----------------------------------------------------------------

// Gradient of 0.5 * (f(x) - y)^2 for one sample, into g (kParams).
void sample_grad(Model& m, const float* x, float y, std::vector<double>& g) {
  float h[kHidden];
  float out = *m.b2();
  for (int i = 0; i < kHidden; ++i) {
    float a = m.b1()[i];
    for (int j = 0; j < kIn; ++j) a += m.w1()[i * kIn + j] * x[j];
    h[i] = std::tanh(a);
    out += m.w2()[i] * h[i];
  }
  const float d = out - y;
  for (int i = 0; i < kHidden; ++i) {
    const float dh = d * m.w2()[i] * (1.f - h[i] * h[i]);
    for (int j = 0; j < kIn; ++j) g[static_cast<size_t>(i * kIn + j)] = dh * x[j];
    g[static_cast<size_t>(kHidden * kIn + i)] = dh;
    g[static_cast<size_t>(kHidden * kIn + kHidden + i)] = d * h[i];
  }
  g[kParams - 1] = d;
}

struct Trainer {
  Model model;
  Optimizer opt;
  Scaler scaler;
  Compressor comp;
  DataState data;
  bool compress = false;
  ProcessGroupPtr w;

  void step() {
    const int W = w->size(), R = w->rank();
    if (data.perm.empty() || data.cursor + kBatch > kSamples) {
      if (!data.perm.empty()) ++data.epoch;
      data.new_epoch();
    }
    // Every rank draws the whole batch's noise, so the RNG advances alike.
    std::normal_distribution<float> nd(0.f, 0.05f);
    std::vector<float> noise(kBatch * kIn);
    for (auto& v : noise) v = nd(data.noise);
    auto [b0, bn] = split(kBatch, W, R);
    std::vector<int64_t> q(kParams, 0);
    std::vector<double> g(kParams), local(kParams, 0.0);
    float x[kIn], y;
    double max_scaled = 0;
    for (int64_t s = b0; s < b0 + bn; ++s) {
      sample(data.perm[static_cast<size_t>(data.cursor + s)], x, &y);
      for (int j = 0; j < kIn; ++j) x[j] += noise[static_cast<size_t>(s * kIn + j)];
      sample_grad(model, x, y, g);
      for (int64_t k = 0; k < kParams; ++k) {
        const auto kk = static_cast<size_t>(k);
        max_scaled = std::max(max_scaled, std::fabs(g[kk] * scaler.scale));
        if (compress) local[kk] += g[kk];
        else q[kk] += std::llround(g[kk] * kFixed);
      }
    }
    data.cursor += kBatch;
    if (compress) {
      comp.compress(local);
      for (int64_t k = 0; k < kParams; ++k)
        q[static_cast<size_t>(k)] = std::llround(local[static_cast<size_t>(k)] * kFixed);
    }
    // Loss-scaler stand-in: "overflow" when a scaled gradient leaves the
    // float16 range; every rank must agree.
    double overflow = max_scaled > 65504.0 ? 1.0 : 0.0;
    w->allreduce(Tensor::of(&overflow, 1), ReduceOp::kMax, {"overflow flag"});
    w->allreduce(Tensor::of(q), ReduceOp::kSum, {"gradients"});
    if (overflow > 0) {
      scaler.scale *= 0.5f;
      scaler.growth = 0;
      ++scaler.skipped;
      return;
    }
    if (++scaler.growth == 4) {
      scaler.scale *= 2.f;
      scaler.growth = 0;
    }
    const float lr = 0.05f, beta = 0.9f;
    for (int64_t k = 0; k < opt.n; ++k) {
      const float grad = static_cast<float>(static_cast<double>(q[static_cast<size_t>(opt.lo + k)]) /
                                            kFixed / kBatch);
      float& mk = opt.m[static_cast<size_t>(k)];
      mk = beta * mk + grad;
      model.p[static_cast<size_t>(opt.lo + k)] -= lr * mk;
    }
    if (opt.zero) {
      // Each rank updated its slice; reassemble the replicated parameters.
      std::vector<int64_t> counts;
      for (int r = 0; r < W; ++r) counts.push_back(split(kParams, W, r).second);
      std::vector<float> mine(model.p.begin() + opt.lo, model.p.begin() + opt.lo + opt.n);
      w->allgatherv(Tensor::of(mine), Tensor::of(model.p), counts, {"zero params"});
    }
    ++opt.steps;
  }

  // Collective: the global view of the state (momentum gathered when it is
  // sharded), then this rank's residuals: rank 0's file is comparable
  // across world sizes when no compressor runs.
  void dump(const std::string& prefix) {
    std::vector<float> full_m = opt.m;
    if (opt.zero) {
      std::vector<int64_t> counts;
      for (int r = 0; r < w->size(); ++r) counts.push_back(split(kParams, w->size(), r).second);
      full_m.assign(kParams, 0.f);
      w->allgatherv(Tensor::of(opt.m), Tensor::of(full_m), counts, {"dump momentum"});
    }
    std::ofstream out(prefix + ".rank" + std::to_string(w->rank()), std::ios::binary);
    auto put = [&](const void* p, size_t n) {
      out.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    };
    put(model.p.data(), model.p.size() * sizeof(float));
    put(full_m.data(), full_m.size() * sizeof(float));
    put(&scaler.scale, sizeof(scaler.scale));
    put(&scaler.growth, sizeof(scaler.growth));
    put(&scaler.skipped, sizeof(scaler.skipped));
    put(&opt.steps, sizeof(opt.steps));
    const std::string d = data.to_json().dump();
    put(d.data(), d.size());
    put(comp.r0.data(), comp.r0.size() * sizeof(float));
    put(comp.r1.data(), comp.r1.size() * sizeof(float));
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string dir, out;
  int64_t steps = 40, save_every = 5, kill_at = -1;
  int step_ms = 0;
  bool zero = false, compress = false, reset_compressor = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--dir") dir = next();
    else if (a == "--steps") steps = std::stoll(next());
    else if (a == "--save-every") save_every = std::stoll(next());
    else if (a == "--kill-at") kill_at = std::stoll(next());
    else if (a == "--step-ms") step_ms = std::stoi(next());
    else if (a == "--out") out = next();
    else if (a == "--zero") zero = true;
    else if (a == "--compress") compress = true;
    else if (a == "--reset-compressor") reset_compressor = true;
  }
  // The monitor first: a notice that arrives during start-up must not kill
  // the process (SIGUSR1's default action would).
  PreemptionMonitor monitor;
  tutti::init();
  Trainer t;
  t.w = world();
  t.compress = compress;
  t.model.init();
  t.opt.setup(zero, t.w->size(), t.w->rank());
  t.comp.world = t.w->size();
  t.comp.rank = t.w->rank();
  // Extra state plugs in here, one line per component.
  Components parts = {{"model", &t.model}, {"optimizer", &t.opt}, {"scaler", &t.scaler}};
  if (compress) parts.push_back({"compressor", &t.comp});

  CheckpointOptions co;
  co.dir = dir;
  CheckpointManager ckpt(t.w, co);
  LoadOptions lo;
  if (reset_compressor) lo.optional = {"compressor/"};
  auto loaded = ckpt.load(parts, lo);
  int64_t start = 0;
  if (loaded) {
    t.data.from_json(nlohmann::json::parse(loaded->metadata_json).at("data"));
    start = loaded->step;
    if (t.w->rank() == 0)
      std::printf("RESUMED %lld from %d ranks\n", static_cast<long long>(start),
                  loaded->saved_world_size);
  } else if (t.w->rank() == 0) {
    std::printf("FRESH\n");
  }
  std::fflush(stdout);
  const char* restarts = std::getenv("TUTTI_RESTART_COUNT");
  const bool first_attempt = !restarts || std::string(restarts) == "0";
  auto meta = [&] { return nlohmann::json({{"data", t.data.to_json()}}).dump(); };

  for (int64_t step = start + 1; step <= steps; ++step) {
    t.step();
    const PreemptionAction action = monitor.decide(*t.w);  // collective
    if (action == PreemptionAction::kStop) {
      ckpt.save(step, parts, meta());
      ckpt.wait();
      if (t.w->rank() == 0) {
        std::printf("PREEMPTED %lld (%s)\n", static_cast<long long>(step),
                    monitor.notice() ? monitor.notice()->source.c_str() : "another rank");
        std::fflush(stdout);
      }
      exit_preempted();
    }
    if (action == PreemptionAction::kSaveNow) {
      // An early warning (AWS rebalance recommendation): a checkpoint now,
      // committed in the background while training goes on.
      ckpt.save(step, parts, meta());
      if (t.w->rank() == 0) {
        std::printf("SAVED-NOW %lld (%s)\n", static_cast<long long>(step),
                    monitor.notice() ? monitor.notice()->source.c_str() : "another rank");
        std::fflush(stdout);
      }
    } else if (step % save_every == 0) {
      ckpt.save(step, parts, meta());
    }
    if (step == kill_at && first_attempt && t.w->rank() == step % t.w->size()) {
      std::printf("KILLING rank %d at step %lld\n", t.w->rank(), static_cast<long long>(step));
      std::fflush(stdout);
      ::kill(::getpid(), SIGKILL);
    }
    if (step_ms) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
  }
  ckpt.wait();
  if (!out.empty()) t.dump(out);
  if (t.w->rank() == 0) std::printf("DONE %lld\n", static_cast<long long>(steps));
  std::fflush(stdout);
  return 0;
}
