// Data-parallel training is equivalent to one process on the whole batch.
//
// An MLP (6 -> 10 -> 8 -> 3, tanh) trains for kSteps SGD steps on a global
// batch of 24 samples.  The reference model sees all 24 samples with loss
// scale 1/24; with N ranks each rank sees its 24/N samples with scale
// 1/(24/N) (the local mean) and the reducer averages over ranks, which is
// the global mean in exact arithmetic.  Both start from the same seed and
// the reducer also broadcasts rank 0's parameters after the other ranks
// perturbed theirs.
//
// Tolerance.  The only differences are summation order (the per-sample
// gradient terms are summed in one GEMM vs. N GEMMs plus an all-reduce, and
// divided by 24 vs. by 24/N then N).  Each gradient element is a sum of 24
// terms of magnitude <= ~1, so two orders of summation differ by at most
// ~24 * 2^-24 ~ 1.4e-6 (float32) or ~2.7e-15 (float64); times lr = 0.1 per
// step over 4 steps (tanh is 1-Lipschitz, the weights are < 1) that bounds
// the parameter difference by ~6e-7 / ~1e-15.  We allow 1e-6 (float32) and
// 1e-14 (float64) relative to max(1, |reference|); observed worst cases at
// -np 1..4 are 3e-8 and 3e-17.  One lost sample moves the parameters by
// ~1e-3 in one step, 1000x the float32 tolerance (EquivalenceControl).
//
// Equivalence is checked for several bucket caps: one bucket per tensor,
// ~100-byte buckets, one bucket for all; and with gradient accumulation
// (backward_passes_per_step and no_sync).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "data_parallel/dp_test_util.h"
#include "data_parallel/mlp_model.h"

namespace tutti {
namespace {

constexpr int kGlobalBatch = 24;
constexpr int kSteps = 4;
const std::vector<int> kWidths = {6, 10, 8, 3};

enum class Accum { kNone, kPassesPerStep, kNoSync };

struct Case {
  double cap_mb;
  int passes;  // micro-batches per rank per step
  Accum accum;
};

template <typename T>
double tolerance();
template <>
double tolerance<float>() { return 1e-6; }
template <>
double tolerance<double>() { return 1e-14; }

template <typename T>
void train_reference(test::Mlp<T>& model) {
  std::vector<T> x, y;
  test::make_samples<T>(0, kGlobalBatch, kWidths.front(), kWidths.back(), &x, &y);
  for (int s = 0; s < kSteps; ++s) {
    model.zero_grad();
    model.forward_backward(x.data(), y.data(), kGlobalBatch, T(1) / kGlobalBatch, nullptr);
    model.sgd_step(T(0.1));
  }
}

template <typename T>
void train_data_parallel(test::Mlp<T>& model, const Case& c) {
  auto w = world();
  const int n = w->size(), rank = w->rank();
  const int local = kGlobalBatch / n, micro = local / c.passes;
  ASSERT_EQ(micro * c.passes * n, kGlobalBatch) << "the split must be exact";
  ReducerOptions o;
  o.bucket_cap_mb = c.cap_mb;
  o.first_bucket_cap_mb = c.cap_mb;
  o.backward_passes_per_step = c.accum == Accum::kPassesPerStep ? c.passes : 1;
  Reducer reducer(w, o);
  for (int i = 0; i < model.num_params(); ++i)
    reducer.add_parameter(model.name(i), model.param(i), model.grad(i));
  reducer.build();
  if (c.cap_mb < 1e-9)
    EXPECT_EQ(static_cast<int>(reducer.buckets().size()), model.num_params()) << "one per tensor";
  if (c.cap_mb >= 1000) EXPECT_EQ(reducer.buckets().size(), 1u) << "one for all";
  if (rank != 0)  // diverge, then let the broadcast restore rank 0's start
    for (auto& v : model.param_data(0)) v += T(rank);
  reducer.broadcast_parameters(0);
  std::vector<T> x, y;
  auto ready = [&](int i) { reducer.grad_ready(i); };
  for (int s = 0; s < kSteps; ++s) {
    model.zero_grad();
    for (int m = 0; m < c.passes; ++m) {
      test::make_samples<T>(rank * local + m * micro, micro, kWidths.front(), kWidths.back(), &x, &y);
      const bool last = m + 1 == c.passes;
      // Each micro-batch's loss is scaled by 1/local: the sum over the
      // rank's micro-batches is its local mean gradient.
      if (c.accum == Accum::kNoSync && !last) {
        auto guard = reducer.no_sync();
        model.forward_backward(x.data(), y.data(), micro, T(1) / local, ready);
        EXPECT_FALSE(reducer.synchronize());
      } else {
        model.forward_backward(x.data(), y.data(), micro, T(1) / local, ready);
        EXPECT_EQ(reducer.synchronize(), last) << "pass " << m;
      }
    }
    model.sgd_step(T(0.1));
  }
  const ReducerStats st = reducer.stats();
  EXPECT_EQ(st.steps, kSteps);
  EXPECT_EQ(st.accumulation_passes, kSteps * (c.passes - 1));
  EXPECT_EQ(st.unready_gradients, 0);
}

template <typename T>
void check_equivalence(const Case& c) {
  test::Mlp<T> ref(kWidths, 7), dp(kWidths, 7);
  train_reference(ref);
  train_data_parallel(dp, c);
  double worst = 0;
  for (int i = 0; i < ref.num_params(); ++i)
    for (size_t j = 0; j < ref.param_data(i).size(); ++j) {
      const double a = dp.param_data(i)[j], e = ref.param_data(i)[j];
      worst = std::max(worst, std::fabs(a - e) / std::max(1.0, std::fabs(e)));
    }
  EXPECT_LE(worst, tolerance<T>()) << "largest relative parameter difference";
  // And every rank ends with the same bits.
  std::vector<unsigned char> bytes;
  for (int i = 0; i < dp.num_params(); ++i) {
    const auto& v = dp.param_data(i);
    const unsigned char* p = reinterpret_cast<const unsigned char*>(v.data());
    bytes.insert(bytes.end(), p, p + v.size() * sizeof(T));
  }
  EXPECT_TRUE(test::same_on_every_rank(bytes));
}

// Caps: 1 byte (one bucket per tensor), ~100 bytes, 1000 MiB (one bucket).
const double kCaps[] = {1e-12, 100.0 / (1 << 20), 1000.0};

class Equivalence : public ::testing::TestWithParam<double> {};

TEST_P(Equivalence, Float32) { check_equivalence<float>({GetParam(), 1, Accum::kNone}); }
TEST_P(Equivalence, Float64) { check_equivalence<double>({GetParam(), 1, Accum::kNone}); }
TEST_P(Equivalence, AccumulatePassesPerStep) {
  check_equivalence<double>({GetParam(), 2, Accum::kPassesPerStep});
}
TEST_P(Equivalence, AccumulateNoSync) {
  check_equivalence<double>({GetParam(), 2, Accum::kNoSync});
}

INSTANTIATE_TEST_SUITE_P(Caps, Equivalence, ::testing::ValuesIn(kCaps));

TEST(EquivalenceControl, ALostSampleIsDetected) {
  // The tolerance must be far below what a wrong gradient does: one sample
  // fewer changes some gradient by `worst`, i.e. a parameter by 0.1 * worst
  // after one SGD step.
  test::Mlp<double> a(kWidths, 7), b(kWidths, 7);
  std::vector<double> x, y;
  test::make_samples<double>(0, kGlobalBatch, kWidths.front(), kWidths.back(), &x, &y);
  a.forward_backward(x.data(), y.data(), kGlobalBatch, 1.0 / kGlobalBatch, nullptr);
  b.forward_backward(x.data(), y.data(), kGlobalBatch - 1, 1.0 / kGlobalBatch, nullptr);
  double worst = 0;
  for (int i = 0; i < a.num_params(); ++i)
    for (size_t j = 0; j < a.grad_data(i).size(); ++j)
      worst = std::max(worst, std::fabs(a.grad_data(i)[j] - b.grad_data(i)[j]));
  EXPECT_GT(0.1 * worst, 1e3 * tolerance<float>());
}

}  // namespace
}  // namespace tutti
