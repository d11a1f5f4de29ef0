// tutti::optim::step on the host: closed-form trajectories (dyadic values
// where float32 is exact, constant-gradient Adam within a stated bound),
// vector lanes against scalar lanes bit for bit, mixed gradient dtypes and
// grad_scale against pre-widened float32 gradients, model-copy rounding,
// unaligned slices of one flat buffer, and argument errors that name the
// parameter.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "optim/cpu_optim.h"
#include "optim/cuda_optim.h"
#include "optim_test_util.h"
#include "tutti/error.h"
#include "tutti/optim.h"

namespace tutti {
namespace optim {
namespace {

using Vec = std::vector<float>;

Tensor T(Vec& v) { return Tensor::of(v); }

// One parameter with its states, all float32 host vectors.
struct Param {
  Vec p, g, s0, s1;
  Param(int64_t n, float p0, float g0) : p(n, p0), g(n, g0), s0(n, 0.f), s1(n, 0.f) {}
  std::vector<Tensor> states(Kind k) {
    if (k == Kind::kSgd) return {T(s0)};
    return {T(s0), T(s1)};
  }
};

void run(Param& x, const Hyper& h, float grad_scale = 1.f) {
  Param* px = &x;
  step({T(px->p)}, {T(px->g)}, {px->states(h.kind)}, h, grad_scale);
}

// ---- closed forms -----------------------------------------------------------------

// Dyadic values keep every SGD quantity exact in float32, so these compare
// with ==.
TEST(OptimClosedForm, SgdPlainAndWeightDecay) {
  Param x(5, 1.0f, 0.5f);
  Hyper h;
  h.kind = Kind::kSgd;
  h.lr = 0.25f;
  for (int t = 1; t <= 4; ++t) {
    h.step = t;
    run(x, h);
    for (float v : x.p) EXPECT_EQ(v, 1.0f - 0.125f * t);
  }
  // p <- p - lr * (g + wd * p) = p * (1 - lr*wd) - lr*g: 1 -> 0.75 -> 0.5625
  Param y(3, 1.0f, 0.5f);
  h.weight_decay = 1.0f;
  h.lr = 0.25f;
  run(y, h);
  EXPECT_EQ(y.p[0], 1.0f - 0.25f * (0.5f + 1.0f));
  run(y, h);
  EXPECT_EQ(y.p[2], 0.625f - 0.25f * (0.5f + 0.625f));
}

TEST(OptimClosedForm, SgdMomentumDampeningNesterovMaximize) {
  // g = 1, momentum 0.5: buf = 1, 1.5, 1.75, 1.875 (buf_1 = g, torch's
  // first step); dampening 0.5 gives buf = 1, 1, 1, 1 after the first.
  Hyper h;
  h.kind = Kind::kSgd;
  h.lr = 0.125f;
  h.momentum = 0.5f;
  Param a(4, 0.f, 1.f), d(4, 0.f, 1.f), n(4, 0.f, 1.f), m(4, 0.f, 1.f);
  const float bufs[] = {1.f, 1.5f, 1.75f, 1.875f};
  float pa = 0, pn = 0;
  for (int t = 1; t <= 4; ++t) {
    h.step = t;
    h.dampening = 0;
    h.nesterov = false;
    h.maximize = false;
    run(a, h);
    h.maximize = true;
    run(m, h);
    h.maximize = false;
    h.nesterov = true;
    run(n, h);
    h.nesterov = false;
    h.dampening = 0.5f;
    run(d, h);
    pa -= 0.125f * bufs[t - 1];
    pn -= 0.125f * (1.f + 0.5f * bufs[t - 1]);  // g + momentum * buf
    EXPECT_EQ(a.s0[3], bufs[t - 1]) << "step " << t;
    EXPECT_EQ(a.p[3], pa) << "step " << t;
    EXPECT_EQ(m.p[1], -pa) << "maximize, step " << t;
    EXPECT_EQ(n.p[0], pn) << "nesterov, step " << t;
    EXPECT_EQ(d.s0[2], 1.f) << "dampening, step " << t;
    EXPECT_EQ(d.p[2], -0.125f * t) << "dampening, step " << t;
  }
}

// Constant gradient g: m_t = g(1 - b1^t), v_t = g^2(1 - b2^t), so the bias
// corrected step is lr * g / (|g| + eps) every step.  float32 rounds each
// of ~10 operations per step; the bound allows 2 float32 ulps of the
// quantity per step (measured: at most 0.6 for the parameter, 0.05 for the
// moments).
TEST(OptimClosedForm, AdamAndAdamWConstantGradient) {
  for (Kind kind : {Kind::kAdam, Kind::kAdamW}) {
    for (float g : {0.5f, -3.0f, 1e-3f}) {
      Hyper h;
      h.kind = kind;
      h.lr = 1e-2f;
      h.weight_decay = kind == Kind::kAdamW ? 0.1f : 0.f;
      Param x(9, 2.0f, g);
      double p = 2.0;
      for (int t = 1; t <= 6; ++t) {
        h.step = t;
        run(x, h);
        const double lr = h.lr, eps = h.eps;
        p *= 1.0 - lr * h.weight_decay;  // AdamW; 1 for Adam
        p -= lr * g / (std::fabs(g) + eps);
        const double m = g * (1 - std::pow(double(h.beta1), t));
        const double v = double(g) * g * (1 - std::pow(double(h.beta2), t));
        const double ulp = std::ldexp(1.0, -23);
        EXPECT_NEAR(x.p[4], p, 2 * t * ulp * 2.0) << kind_name(kind) << " g " << g << " step " << t;
        EXPECT_NEAR(x.s0[8], m, 2 * t * ulp * std::fabs(g)) << "exp_avg, step " << t;
        EXPECT_NEAR(x.s1[0], v, 2 * t * ulp * g * g) << "exp_avg_sq, step " << t;
      }
    }
  }
}

// ---- lanes, dtypes, copies, slices -------------------------------------------------

Vec random_vec(std::mt19937* rng, int64_t n, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  Vec v(n);
  for (float& x : v) x = d(*rng);
  return v;
}

bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

using test::hyper_grid;

TEST(OptimLanes, VectorMatchesScalarBitForBit) {
  if (!cpu_step_vectorised()) GTEST_SKIP() << "no AVX2+FMA on this CPU";
  std::mt19937 rng(7);
  for (const Hyper& base : hyper_grid()) {
    for (int64_t n : {1, 7, 8, 9, 1023, 1024, 1025, 3001}) {
      Vec p = random_vec(&rng, n, 1.f), s0 = random_vec(&rng, n, 0.1f), s1(n);
      for (int64_t i = 0; i < n; ++i) s1[i] = std::fabs(s0[i]) * 0.01f;
      Vec g = random_vec(&rng, n, 1.f);
      Vec p2 = p, a2 = s0, b2 = s1;
      for (int t = 1; t <= 3; ++t) {
        Hyper h = base;
        h.step = t;
        const Coeffs c = make_coeffs(h, 1.f);
        Entry e{p.data(), g.data(), s0.data(), base.kind == Kind::kSgd ? nullptr : s1.data(),
                nullptr, n, DType::kFloat32, DType::kFloat32};
        Entry f = e;
        f.param = p2.data();
        f.state0 = a2.data();
        f.state1 = e.state1 ? b2.data() : nullptr;
        cpu_step(e, c, true);
        cpu_step(f, c, false);
        ASSERT_TRUE(same_bits(p, p2)) << kind_name(h.kind) << " n " << n << " step " << t;
        ASSERT_TRUE(same_bits(s0, a2)) << kind_name(h.kind) << " n " << n << " step " << t;
        ASSERT_TRUE(same_bits(s1, b2)) << kind_name(h.kind) << " n " << n << " step " << t;
      }
    }
  }
}


// A float16/bfloat16 gradient (times grad_scale) steps exactly like the
// float32 gradient holding float(g) * grad_scale; model copies hold the
// rounded parameters.  One call mixes all three gradient dtypes and all
// three copy dtypes.
TEST(OptimDtypes, MixedGradientsScaleAndModelCopies) {
  std::mt19937 rng(11);
  const int64_t n = 1000;
  const float scale = 0.125f;  // a power of two keeps float(g)*scale exact
  for (const Hyper& base : hyper_grid()) {
    std::vector<Vec> p(3), ref(3), s0(3), s1(3), r0(3), r1(3), wide(3);
    std::vector<std::vector<uint16_t>> g16(3);
    std::vector<Vec> copy32(1);
    std::vector<uint16_t> copy16(n, 0x7e00), copybf(n, 0x7fc0);  // NaN poison
    copy32[0].assign(n, std::nanf(""));
    Vec g32 = random_vec(&rng, n, 4.f);
    for (int k = 0; k < 3; ++k) {
      p[k] = random_vec(&rng, n, 1.f);
      ref[k] = p[k];
      s0[k] = Vec(n, 0.f), s1[k] = Vec(n, 0.f), r0[k] = Vec(n, 0.f), r1[k] = Vec(n, 0.f);
      g16[k].resize(n);
      wide[k].resize(n);
      for (int64_t i = 0; i < n; ++i) {
        const float x = g32[i] * (k + 1);
        if (k == 1) g16[k][i] = float_to_half(x);
        if (k == 2) g16[k][i] = float_to_bfloat16(x);
        const float w = k == 0   ? x
                        : k == 1 ? half_to_float(g16[k][i])
                                 : bfloat16_to_float(g16[k][i]);
        wide[k][i] = w * scale;
      }
    }
    Vec g0 = g32;  // k = 0: float32 gradient
    const bool sgd = base.kind == Kind::kSgd;
    auto states = [&](std::vector<Vec>& a, std::vector<Vec>& b) {
      std::vector<std::vector<Tensor>> out;
      for (int k = 0; k < 3; ++k)
        out.push_back(sgd ? std::vector<Tensor>{T(a[k])} : std::vector<Tensor>{T(a[k]), T(b[k])});
      return out;
    };
    const std::vector<Tensor> grads = {
        T(g0), Tensor(g16[1].data(), DType::kFloat16, Shape{n}),
        Tensor(g16[2].data(), DType::kBFloat16, Shape{n})};
    const std::vector<Tensor> copies = {
        T(copy32[0]), Tensor(copy16.data(), DType::kFloat16, Shape{n}),
        Tensor(copybf.data(), DType::kBFloat16, Shape{n})};
    for (int t = 1; t <= 2; ++t) {
      Hyper h = base;
      h.step = t;
      step({T(p[0]), T(p[1]), T(p[2])}, grads, states(s0, s1), h, scale, copies);
      step({T(ref[0]), T(ref[1]), T(ref[2])}, {T(wide[0]), T(wide[1]), T(wide[2])},
           states(r0, r1), h);
      for (int k = 0; k < 3; ++k) {
        ASSERT_TRUE(same_bits(p[k], ref[k])) << kind_name(h.kind) << " grad dtype #" << k;
        ASSERT_TRUE(same_bits(s0[k], r0[k])) << kind_name(h.kind) << " grad dtype #" << k;
      }
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(copy32[0][i], p[0][i]) << i;
        ASSERT_EQ(copy16[i], float_to_half(p[1][i])) << i;
        ASSERT_EQ(copybf[i], float_to_bfloat16(p[2][i])) << i;
      }
    }
  }
}

// Shards of one flat buffer at odd offsets (no 32-byte alignment) step
// exactly like separate, aligned tensors.
TEST(OptimSlices, UnalignedShardsOfAFlatBuffer) {
  std::mt19937 rng(5);
  const int64_t sizes[] = {3, 17, 1030, 9};
  int64_t total = 1;  // element 0 unused: every shard starts unaligned
  for (int64_t n : sizes) total += n;
  Vec flat_p = random_vec(&rng, total, 1.f), flat_g = random_vec(&rng, total, 1.f);
  Vec flat_m(total, 0.f), flat_v(total, 0.f);
  std::vector<Vec> p, g, m, v;
  std::vector<Tensor> ps, gs, qs, hs;
  std::vector<std::vector<Tensor>> st, st2;
  int64_t off = 1;
  for (int64_t n : sizes) {
    p.emplace_back(flat_p.begin() + off, flat_p.begin() + off + n);
    g.emplace_back(flat_g.begin() + off, flat_g.begin() + off + n);
    m.emplace_back(n, 0.f);
    v.emplace_back(n, 0.f);
    ps.push_back(Tensor::of(flat_p).slice(off, off + n));
    gs.push_back(Tensor::of(flat_g).slice(off, off + n));
    st.push_back({Tensor::of(flat_m).slice(off, off + n), Tensor::of(flat_v).slice(off, off + n)});
    off += n;
  }
  for (size_t k = 0; k < p.size(); ++k) {
    qs.push_back(T(p[k]));
    hs.push_back(T(g[k]));
    st2.push_back({T(m[k]), T(v[k])});
  }
  Hyper h;
  h.kind = Kind::kAdamW;
  h.weight_decay = 0.01f;
  for (int t = 1; t <= 3; ++t) {
    h.step = t;
    step(ps, gs, st, h);
    step(qs, hs, st2, h);
  }
  off = 1;
  for (size_t k = 0; k < p.size(); ++k) {
    ASSERT_TRUE(same_bits(Vec(flat_p.begin() + off, flat_p.begin() + off + sizes[k]), p[k])) << k;
    ASSERT_TRUE(same_bits(Vec(flat_v.begin() + off, flat_v.begin() + off + sizes[k]), v[k])) << k;
    off += sizes[k];
  }
}

// ---- errors ---------------------------------------------------------------------

// Runs f, expects kInvalidArgument whose message holds every needle.
template <typename F>
void expect_invalid(F f, std::vector<std::string> needles) {
  try {
    f();
    FAIL() << "no error; expected one mentioning " << needles[0];
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    for (const std::string& s : needles)
      EXPECT_NE(std::string(e.what()).find(s), std::string::npos)
          << "'" << s << "' not in: " << e.what();
  }
}

TEST(OptimErrors, NameTheParameterAndLeaveEverythingUntouched) {
  Vec p0(4, 1.f), g0(4, 1.f), m0(4, 0.f), v0(4, 0.f);
  Vec p1(5, 1.f), g1(6, 1.f), m1(5, 0.f), v1(5, 0.f);
  const std::vector<std::string> names = {"fc1.weight", "fc1.bias"};
  Hyper adam;
  expect_invalid([&] { step({T(p0), T(p1)}, {T(g0), T(g1)}, {{T(m0), T(v0)}, {T(m1), T(v1)}},
                            adam, 1.f, {}, nullptr, names); },
                 {"parameter #1 'fc1.bias'", "gradient", "6 elements", "adam"});
  // Nothing was written before the check failed (parameter #0 is valid).
  EXPECT_EQ(p0[0], 1.f);
  EXPECT_EQ(m0[0], 0.f);
  Vec g1ok(5, 1.f);
  expect_invalid([&] { step({T(p0), T(p1)}, {T(g0), T(g1ok)}, {{T(m0), T(v0)}, {T(m1)}}, adam); },
                 {"parameter #1", "1 state tensors", "keeps 2"});
  expect_invalid([&] { step({T(p0), T(p1)}, {T(g0), T(g1ok)}, {{T(m0), T(v0)}}, adam); },
                 {"2 parameters but 1 state lists"});
  expect_invalid([&] { step({T(p0)}, {T(g0), T(g1ok)}, {{T(m0), T(v0)}}, adam); },
                 {"1 parameters but 2 gradients"});
  // A state tensor on a CUDA device beside host parameters (the check runs
  // before anything touches the memory).
  const Tensor on_gpu(m1.data(), DType::kFloat32, Shape{5}, Device::cuda(0));
  expect_invalid([&] { step({T(p0), T(p1)}, {T(g0), T(g1ok)}, {{T(m0), T(v0)}, {on_gpu, T(v1)}},
                            adam, 1.f, {}, nullptr, names); },
                 {"parameter #1 'fc1.bias'", "state 0 is on cuda:0", "parameter #0 is on cpu"});
  // float16 parameters, a state overlapping its parameter, a bad copy dtype.
  std::vector<uint16_t> half(4);
  expect_invalid([&] { step({Tensor(half.data(), DType::kFloat16, Shape{4})}, {T(g0)},
                            {{T(m0), T(v0)}}, adam); },
                 {"parameter #0", "float32"});
  expect_invalid([&] { step({T(p0)}, {T(g0)}, {{T(p0), T(v0)}}, adam); },
                 {"parameter #0", "state 0 overlaps the parameter"});
  std::vector<int32_t> ints(4);
  expect_invalid([&] { step({T(p0)}, {T(g0)}, {{T(m0), T(v0)}}, adam, 1.f,
                            {Tensor(ints.data(), DType::kInt32, Shape{4})}); },
                 {"parameter #0", "model copy"});
  // Hyper-parameters as torch validates them.
  Hyper bad = adam;
  bad.beta2 = 1.f;
  expect_invalid([&] { step({T(p0)}, {T(g0)}, {{T(m0), T(v0)}}, bad); }, {"beta2"});
  bad = adam;
  bad.step = 0;
  expect_invalid([&] { step({T(p0)}, {T(g0)}, {{T(m0), T(v0)}}, bad); }, {"step 0"});
  Hyper sgd;
  sgd.kind = Kind::kSgd;
  sgd.momentum = 0.9f;
  sgd.nesterov = true;
  sgd.dampening = 0.1f;
  expect_invalid([&] { step({T(p0)}, {T(g0)}, {{T(m0)}}, sgd); }, {"Nesterov", "sgd"});
  EXPECT_EQ(p0[3], 1.f);
}

TEST(OptimErrors, SgdWithoutMomentumNeedsNoStateAndEmptyListsAreNoOps) {
  Vec p(3, 1.f), g(3, 2.f);
  Hyper h;
  h.kind = Kind::kSgd;
  h.lr = 0.5f;
  step({T(p)}, {T(g)}, {}, h);
  EXPECT_EQ(p[1], 0.f);
  step({T(p)}, {T(g)}, {{}}, h);
  EXPECT_EQ(p[1], -1.f);
  h.momentum = 0.5f;
  expect_invalid([&] { step({T(p)}, {T(g)}, {}, h); }, {"1 parameters but 0 state lists"});
  step({}, {}, {}, Hyper());
  EXPECT_EQ(num_states(Kind::kSgd), 1);
  EXPECT_EQ(num_states(Kind::kAdamW), 2);
}

// ---- the CUDA path's host side (no GPU needed) ----------------------------------

// Fake, never dereferenced addresses: entry i's tensors at distinct values.
template <typename P>
P* fake(int64_t i, int k) {
  return reinterpret_cast<P*>(static_cast<uintptr_t>(0x100000 * (i + 1) + 0x1000 * k));
}

// The launch tables of a long list with sizes 0, 1, chunk boundaries and a
// parameter longer than a launch: every chunk of every entry appears in
// exactly one block, each slot carries its entry's pointers and dtypes, and
// every table passes the launcher's check.
TEST(OptimLaunchPlan, TablesCoverEveryChunkOnceWithTheEntrysPointers) {
  const int64_t c = OptTable::kChunk;
  std::vector<int64_t> sizes = {0, 1, c - 1, c, c + 1, (OptTable::kMaxBlocks + 2) * c + 3};
  for (int i = 0; i < 100; ++i) sizes.push_back(1 + (i * 7919) % (3 * c));
  std::vector<Entry> entries(sizes.size());
  std::map<const void*, size_t> index_of;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Entry& e = entries[i];
    e.param = fake<float>(i, 0);
    e.grad = fake<const void>(i, 1);
    e.state0 = fake<float>(i, 2);
    e.state1 = fake<float>(i, 3);
    e.copy = i % 2 ? fake<void>(i, 4) : nullptr;
    e.numel = sizes[i];
    e.grad_dtype = i % 3 == 0 ? DType::kFloat32 : i % 3 == 1 ? DType::kFloat16 : DType::kBFloat16;
    e.copy_dtype = DType::kBFloat16;
    index_of[e.param] = i;
  }
  Hyper h;
  const Coeffs coeffs = make_coeffs(h, 1.f);
  const std::vector<amp::MtaEntry> plan = plan_entries(entries);
  amp::MtaPlanner planner(plan);
  amp::MtaTable mta;
  OptTable t;
  std::vector<std::vector<int>> seen(sizes.size());
  int launches = 0;
  while (planner.next(&mta)) {
    ++launches;
    fill_opt_table(mta, entries, &t);
    ASSERT_NO_THROW(check_opt_table(t, coeffs));
    for (int b = 0; b < t.n_blocks; ++b) {
      const int slot = t.block_slot[b];
      const size_t i = index_of.at(t.param[slot]);
      const Entry& e = entries[i];
      ASSERT_EQ(t.grad[slot], e.grad);
      ASSERT_EQ(t.state0[slot], e.state0);
      ASSERT_EQ(t.state1[slot], e.state1);
      ASSERT_EQ(t.copy[slot], e.copy);
      ASSERT_EQ(t.numel[slot], e.numel);
      ASSERT_EQ(t.grad_dtype[slot], static_cast<uint8_t>(e.grad_dtype));
      ASSERT_EQ(t.copy_dtype[slot], static_cast<uint8_t>(e.copy_dtype));
      seen[i].push_back(t.block_chunk[b]);
    }
  }
  EXPECT_GT(launches, 3);
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<int> want(static_cast<size_t>(amp::mta_chunks(sizes[i])));
    for (size_t k = 0; k < want.size(); ++k) want[k] = static_cast<int>(k);
    std::sort(seen[i].begin(), seen[i].end());
    ASSERT_EQ(seen[i], want) << "entry " << i << " of " << sizes[i] << " elements";
  }
}

TEST(OptimLaunchPlan, LauncherCheckRejectsBadTables) {
  std::vector<Entry> entries(1);
  entries[0] = Entry{fake<float>(0, 0), fake<const void>(0, 1), fake<float>(0, 2),
                     fake<float>(0, 3), nullptr, 10, DType::kFloat32, DType::kFloat32};
  const std::vector<amp::MtaEntry> plan = plan_entries(entries);
  amp::MtaPlanner planner(plan);
  amp::MtaTable mta;
  ASSERT_TRUE(planner.next(&mta));
  OptTable t;
  fill_opt_table(mta, entries, &t);
  Hyper adam;
  const Coeffs c = make_coeffs(adam, 1.f);
  ASSERT_NO_THROW(check_opt_table(t, c));
  auto rejects = [&](OptTable bad, const Coeffs& cc, const char* needle) {
    expect_invalid([&] { check_opt_table(bad, cc); }, {"optim_step", needle});
  };
  OptTable bad = t;
  bad.n_blocks = 0;
  rejects(bad, c, "0 blocks");
  bad = t;
  bad.block_slot[0] = 1;
  rejects(bad, c, "names slot 1 of 1");
  bad = t;
  bad.state1[0] = nullptr;
  rejects(bad, c, "slot 0 lacks");
  bad = t;
  bad.grad_dtype[0] = 3;
  rejects(bad, c, "dtype codes 3/0");
  // SGD without momentum needs no state pointers at all.
  Hyper sgd;
  sgd.kind = Kind::kSgd;
  bad = t;
  bad.state0[0] = bad.state1[0] = nullptr;
  EXPECT_NO_THROW(check_opt_table(bad, make_coeffs(sgd, 1.f)));
}

}  // namespace
}  // namespace optim
}  // namespace tutti
