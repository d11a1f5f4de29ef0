// The skip decision across ranks: Inf or NaN planted on ONE rank in ONE
// tensor makes every rank of the groups skip, and the scaler state stays
// byte-identical on every rank (compared with an allgather).  Run under
// mpiexec -np 1..4.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "amp_test_util.h"

namespace tutti {
namespace amp {
namespace {

using test::HostTensor;

// True when every rank of `g` holds the same bytes.
bool same_on_all_ranks(Communicator* g, std::vector<unsigned char> mine) {
  const int64_t n = static_cast<int64_t>(mine.size());
  std::vector<unsigned char> all(static_cast<size_t>(n * g->size()));
  g->allgather(Tensor(mine.data(), DType::kUInt8, Shape{n}),
               Tensor(all.data(), DType::kUInt8, Shape{n * g->size()}));
  for (int r = 0; r < g->size(); ++r)
    if (!std::equal(mine.begin(), mine.end(), all.begin() + r * n)) return false;
  return true;
}

// A rank's gradients: 7 tensors of mixed dtypes and sizes (one empty),
// finite values that differ per rank, scaled by `scale`.  Dtypes are the
// same on every rank (the lists may be all-reduced).
struct Grads {
  std::vector<HostTensor> t;
  std::vector<std::string> names;
  Grads(int rank, float scale) {
    const int64_t sizes[] = {1, 1000, 0, 17, 65537, 3, 4096};
    for (int i = 0; i < 7; ++i) {
      t.emplace_back(test::kAmpDTypes[i % 3], sizes[i]);
      for (int64_t k = 0; k < sizes[i]; ++k)
        t.back().set(k, scale * static_cast<float>((k * 3 + rank + i) % 11 - 5) / 8);
      names.push_back("layer" + std::to_string(i) + ".weight");
    }
  }
  std::vector<Tensor> views() {
    std::vector<Tensor> v;
    for (auto& x : t) v.push_back(x.tensor());
    return v;
  }
};

// update()'s error message, "" when it did not throw.
std::string update_error(DynamicLossScaler* s) {
  try {
    s->update();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A tp x dp mesh: tensor-parallel pairs (rank / 2) and data-parallel groups
// (rank % 2); with an odd world, tp groups of one.
struct Mesh {
  int tp_size;
  ProcessGroupPtr tp, dp;
  explicit Mesh(const ProcessGroupPtr& w)
      : tp_size(w->size() % 2 == 0 ? 2 : 1),
        tp(w->split_group(w->rank() / tp_size, w->rank(), "tp")),
        dp(w->split_group(w->rank() % tp_size, w->rank(), "dp")) {}
};

const float kPlanted[] = {std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()};

TEST(OverflowAgreement, OneRankOneTensorMakesEveryRankSkip) {
  ProcessGroupPtr w = world();
  LossScalerOptions o;
  // Every overflow halves the scale and every clean step doubles it back,
  // so the scaled gradients stay exact in float16 over the whole run.
  o.init_scale = 1024;
  o.growth_interval = 1;
  DynamicLossScaler scaler(o);
  int expected_skips = 0;
  for (int victim = 0; victim < w->size(); ++victim) {
    for (float planted : kPlanted) {
      for (int tensor : {0, 4, 6}) {
        Grads g(w->rank(), scaler.scale());
        if (w->rank() == victim) {
          HostTensor& x = g.t[tensor];
          x.set(x.numel() / 2, planted);
        }
        StepCheckOptions c;
        c.names = g.names;
        c.groups = {w.get()};
        EXPECT_TRUE(scaler.unscale_and_check(g.views(), c))
            << "victim " << victim << " tensor " << tensor << " value " << planted;
        EXPECT_TRUE(scaler.update().skipped);
        ++expected_skips;
        ASSERT_TRUE(same_on_all_ranks(w.get(), test::state_bytes(&scaler)))
            << "scaler state diverged after victim " << victim;
        // A clean step in between: nobody skips.
        Grads clean(w->rank(), scaler.scale());
        EXPECT_FALSE(scaler.unscale_and_check(clean.views(), c));
        // Unscaled values: scale * v / scale == v exactly (powers of two).
        EXPECT_EQ(clean.t[1].get(1), static_cast<float>((3 + w->rank() + 1) % 11 - 5) / 8);
        EXPECT_FALSE(scaler.update().skipped);
      }
    }
  }
  EXPECT_EQ(scaler.skipped_steps(), expected_skips);
  EXPECT_TRUE(same_on_all_ranks(w.get(), test::state_bytes(&scaler)));
}

TEST(OverflowAgreement, ErrorAtMinimumNamesTheRankAndTensorOnEveryRank) {
  ProcessGroupPtr w = world();
  const int victim = w->size() - 1;
  LossScalerOptions o;
  o.init_scale = 1;
  o.min_scale = 1;
  DynamicLossScaler scaler(o);
  Grads g(w->rank(), 1.0f);
  if (w->rank() == victim) g.t[4].set(65536, std::numeric_limits<float>::infinity());
  StepCheckOptions c;
  c.names = g.names;
  c.groups = {w.get()};
  EXPECT_TRUE(scaler.unscale_and_check(g.views(), c));
  const std::string message = update_error(&scaler);
  const std::string expected = "rank " + std::to_string(victim) + ": 'layer4.weight'";
  EXPECT_NE(message.find(expected), std::string::npos) << message;
  EXPECT_NE(message.find("step 0"), std::string::npos) << message;
  // Only the victim's entry: ranks without non-finite values are not listed.
  for (int r = 0; r < w->size(); ++r)
    if (r != victim)
      EXPECT_EQ(message.find("rank " + std::to_string(r) + ": '"), std::string::npos) << message;
  EXPECT_TRUE(same_on_all_ranks(w.get(), test::state_bytes(&scaler)));
}

// Agreeing over dp then tp reaches every rank of the full grid; over tp
// alone only the victim's tp group.
TEST(OverflowAgreement, MeshGroupsAgreeInTurn) {
  ProcessGroupPtr w = world();
  Mesh mesh(w);
  auto& tp = mesh.tp;
  auto& dp = mesh.dp;
  const int tp_size = mesh.tp_size;
  ASSERT_EQ(tp->size() * dp->size(), w->size());
  for (int victim = 0; victim < w->size(); ++victim) {
    for (bool both : {true, false}) {
      DynamicLossScaler scaler;
      Grads g(w->rank(), scaler.scale());
      if (w->rank() == victim) g.t[1].set(999, std::numeric_limits<float>::quiet_NaN());
      StepCheckOptions c;
      c.groups = both ? std::vector<Communicator*>{dp.get(), tp.get()}
                      : std::vector<Communicator*>{tp.get()};
      const bool expected = both || w->rank() / tp_size == victim / tp_size;
      EXPECT_EQ(scaler.unscale_and_check(g.views(), c), expected)
          << "victim " << victim << (both ? " dp+tp" : " tp only");
      EXPECT_EQ(scaler.update().skipped, expected);
      if (both) EXPECT_TRUE(same_on_all_ranks(w.get(), test::state_bytes(&scaler)));
    }
  }
}

// The report at the minimum travels over both groups of the mesh: every
// rank's message names every rank that overflowed, once.  Both policies
// gather it (collectively); kError shows it in the exception, kWarn logs it
// and carries on with identical state.
TEST(OverflowAgreement, MeshReportNamesEveryVictim) {
  ProcessGroupPtr w = world();
  Mesh mesh(w);
  LossScalerOptions o;
  o.init_scale = 1;
  o.min_scale = 1;
  o.at_min_scale = MinScalePolicy::kWarn;
  DynamicLossScaler scaler(o);
  // Victims: rank 0 (tensor 1) and the last rank (tensor 6).
  Grads g(w->rank(), 1.0f);
  const int last = w->size() - 1;
  if (w->rank() == 0) g.t[1].set(3, std::numeric_limits<float>::infinity());
  if (w->rank() == last) g.t[6].set(7, std::numeric_limits<float>::quiet_NaN());
  StepCheckOptions c;
  c.names = g.names;
  c.groups = {mesh.dp.get(), mesh.tp.get()};
  EXPECT_TRUE(scaler.unscale_and_check(g.views(), c));
  LossScalerOptions e = o;
  e.at_min_scale = MinScalePolicy::kError;
  DynamicLossScaler strict(e);
  Grads g2(w->rank(), 1.0f);
  if (w->rank() == 0) g2.t[1].set(3, std::numeric_limits<float>::infinity());
  if (w->rank() == last) g2.t[6].set(7, std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(strict.unscale_and_check(g2.views(), c));
  const std::string message = update_error(&strict);
  const std::string first = "rank 0: 'layer1.weight'";
  const std::string second = "rank " + std::to_string(last) +
                             (last == 0 ? ": 'layer1.weight', 'layer6.weight'" : ": 'layer6.weight'");
  EXPECT_NE(message.find(last == 0 ? second : first), std::string::npos) << message;
  EXPECT_NE(message.find(second), std::string::npos) << message;
  EXPECT_EQ(message.find(second), message.rfind(second)) << "listed twice: " << message;
  const ScaleUpdate u = scaler.update();
  EXPECT_TRUE(u.skipped);
  EXPECT_TRUE(same_on_all_ranks(w.get(), test::state_bytes(&scaler)));
}

// After a sum all-reduce of the gradients, NaN/Inf reach every rank, so the
// local check agrees without a round trip (already_agreed).
TEST(OverflowAgreement, AlreadyAgreedAfterSumAllreduce) {
  ProcessGroupPtr w = world();
  for (int victim = 0; victim < w->size(); ++victim) {
    for (float planted : kPlanted) {
      DynamicLossScaler scaler;
      Grads g(w->rank(), scaler.scale());
      if (w->rank() == victim) g.t[6].set(5, planted);
      for (auto& t : g.t) w->allreduce(t.tensor(), ReduceOp::kSum);
      StepCheckOptions c;
      c.groups = {w.get()};
      c.already_agreed = true;
      EXPECT_TRUE(scaler.unscale_and_check(g.views(), c)) << "victim " << victim;
      scaler.update();
      EXPECT_TRUE(same_on_all_ranks(w.get(), test::state_bytes(&scaler)));
    }
  }
}

TEST(OverflowAgreement, VerifyCatchesAFalseAgreementClaim) {
  ProcessGroupPtr w = world();
  setenv("TUTTI_AMP_VERIFY_AGREEMENT", "1", 1);
  config::reload();
  DynamicLossScaler scaler;
  // A true claim passes the check.
  Grads clean(w->rank(), scaler.scale());
  StepCheckOptions c;
  c.groups = {w.get()};
  c.already_agreed = true;
  EXPECT_FALSE(scaler.unscale_and_check(clean.views(), c));
  scaler.update();
  // A false one (the flag differs, the gradients were never reduced) is a
  // kMismatch on every rank when there is more than one rank.
  Grads g(w->rank(), scaler.scale());
  if (w->rank() == 0) g.t[0].set(0, std::numeric_limits<float>::infinity());
  ErrorCode code = ErrorCode::kInternal;
  try {
    scaler.unscale_and_check(g.views(), c);
    code = ErrorCode::kInvalidArgument;  // no error: marks "passed"
  } catch (const Error& e) {
    code = e.code();
    EXPECT_NE(std::string(e.what()).find("already_agreed"), std::string::npos);
  }
  EXPECT_EQ(code, w->size() > 1 ? ErrorCode::kMismatch : ErrorCode::kInvalidArgument);
  unsetenv("TUTTI_AMP_VERIFY_AGREEMENT");
  config::reload();
}

TEST(OverflowAgreement, ExternalCheckAgreedThroughAgree) {
  // The check happened elsewhere (e.g. fused into model_grads_to_master).
  ProcessGroupPtr w = world();
  HostTensor half(DType::kFloat16, 100), master(DType::kFloat32, 100);
  for (int64_t i = 0; i < 100; ++i) half.set(i, 1.0f);
  half.set(42, 65504.0f);  // the float16 maximum: finite, not an overflow
  if (w->rank() == w->size() / 2) half.set(43, std::numeric_limits<float>::infinity());
  DynamicLossScaler scaler;
  const NonFiniteReport local =
      model_grads_to_master({half.tensor()}, {master.tensor()}, scaler.inv_scale());
  EXPECT_EQ(local.found, w->rank() == w->size() / 2);
  StepCheckOptions c;
  c.groups = {w.get()};
  EXPECT_TRUE(scaler.agree(local, c));
  EXPECT_TRUE(scaler.update().skipped);
  EXPECT_EQ(scaler.scale(), 32768.0f);
}

}  // namespace
}  // namespace amp
}  // namespace tutti
