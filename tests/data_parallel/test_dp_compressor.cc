// The compression hook: a test-only Compressor that all-reduces each bucket
// in float64 and rounds back once.  Checks the contract the compression
// layer relies on: setup() once per bucket at build() with the plan's
// layouts, allreduce() once per bucket and step, in step order, on the
// reducer's communication thread (never the training thread), with the
// data-parallel group and the step number; the result is the average.  A
// failing compressor surfaces from synchronize() and the next step works.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "data_parallel/dp_test_util.h"

namespace tutti {
namespace {

using test::expect_contains;
using test::expect_error;
using test::ParamDecl;

class Float64Compressor : public Compressor {
 public:
  std::string name() const override { return "test-f64"; }
  void setup(const BucketLayout& layout) override {
    std::lock_guard<std::mutex> lock(mu);
    layouts.push_back(layout);
    scratch.emplace_back(static_cast<size_t>(layout.numel));
    last_step.push_back(-1);
  }
  void allreduce(int bucket_id, const Tensor& bucket, const CompressContext& ctx) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      threads.push_back(std::this_thread::get_id());
      comms.push_back(ctx.comm);
      EXPECT_GT(ctx.step, last_step[static_cast<size_t>(bucket_id)]) << "step order";
      last_step[static_cast<size_t>(bucket_id)] = ctx.step;
      ++calls;
    }
    if (fail_bucket == bucket_id && fail_step == ctx.step)
      throw Error(ErrorCode::kInternal, "test-f64 failed on purpose");
    auto& s = scratch[static_cast<size_t>(bucket_id)];
    EXPECT_EQ(static_cast<int64_t>(s.size()), bucket.numel());
    convert(bucket.data(), bucket.dtype(), s.data(), DType::kFloat64, s.size());
    ctx.comm->allreduce(Tensor::of(s), ReduceOp::kSum, {"test-f64"});
    for (auto& v : s) v /= ctx.comm->size();
    convert(s.data(), DType::kFloat64, bucket.data(), bucket.dtype(), s.size());
    stats_.uncompressed_bytes += bucket.nbytes();
    stats_.wire_bytes += s.size() * sizeof(double);
  }
  CompressStats stats() const override { return stats_; }
  void reset_stats() override { stats_ = {}; }
  StateDict state_dict() override { return {}; }

  std::mutex mu;
  std::vector<BucketLayout> layouts;
  std::vector<std::vector<double>> scratch;
  std::vector<int64_t> last_step;
  std::vector<std::thread::id> threads;
  std::vector<Communicator*> comms;
  int calls = 0;
  int fail_bucket = -1;
  int64_t fail_step = -1;
  CompressStats stats_;
};

const std::vector<ParamDecl> kParams = {
    {"w1", DType::kFloat32, Shape{20, 10}}, {"b1", DType::kFloat32, Shape{20}},
    {"w2", DType::kBFloat16, Shape{9, 2}},  {"b2", DType::kFloat32, Shape{9}},
    {"w3", DType::kFloat64, Shape{17}}};

TEST(Compressor, ReplacesTheAllReduceOnTheCommThread) {
  auto comp = std::make_shared<Float64Compressor>();
  auto params = test::make_params(kParams);
  ReducerOptions o;
  o.compressor = comp;
  o.bucket_cap_mb = 300.0 / (1 << 20);
  o.hierarchical = true;  // ignored with a compressor
  Reducer r(world(), o);
  test::register_all(r, params);
  r.build();
  ASSERT_EQ(comp->layouts.size(), r.buckets().size());
  for (size_t b = 0; b < r.buckets().size(); ++b) {
    EXPECT_EQ(comp->layouts[b].id, static_cast<int>(b));
    EXPECT_EQ(comp->layouts[b].numel, r.buckets()[b].numel);
    EXPECT_EQ(comp->layouts[b].slots.size(), r.buckets()[b].slots.size());
  }
  const int rank = world()->rank(), n = world()->size();
  const int steps = 3;
  for (int step = 0; step < steps; ++step) {
    for (size_t p = 0; p < params.size(); ++p)
      params[p].grad.fill([&](int64_t i) { return test::grad_value(rank, static_cast<int>(p) + step, i); });
    for (int i = r.num_parameters() - 1; i >= 0; --i) r.grad_ready(i);
    EXPECT_TRUE(r.synchronize());
    for (size_t p = 0; p < params.size(); ++p)
      EXPECT_TRUE(test::matches(params[p].grad, [&](int64_t i) {
        double sum = 0;
        for (int k = 0; k < n; ++k)
          sum += test::stored(params[p].grad.dtype, test::grad_value(k, static_cast<int>(p) + step, i));
        return test::stored(params[p].grad.dtype, sum / n);  // rounded once from float64
      })) << params[p].name;
  }
  EXPECT_EQ(comp->calls, steps * static_cast<int>(r.buckets().size()));
  for (auto id : comp->threads) EXPECT_NE(id, std::this_thread::get_id());
  for (auto* c : comp->comms) EXPECT_EQ(c, world().get());
  EXPECT_EQ(comp->last_step.back(), steps - 1);
}

TEST(Compressor, FailureSurfacesAndTheNextStepWorks) {
  auto comp = std::make_shared<Float64Compressor>();
  auto params = test::make_params(kParams);
  ReducerOptions o;
  o.compressor = comp;
  o.bucket_cap_mb = 1e-9;  // one bucket per tensor
  Reducer r(world(), o);
  test::register_all(r, params);
  r.build();
  comp->fail_bucket = 1;  // on every rank, before its collective
  comp->fail_step = 0;
  const int rank = world()->rank();
  for (auto& p : params) p.grad.fill([&](int64_t i) { return rank + i; });
  for (int i = r.num_parameters() - 1; i >= 0; --i) r.grad_ready(i);
  expect_contains(expect_error([&] { r.synchronize(); }, ErrorCode::kInternal),
                  "failed on purpose");
  EXPECT_EQ(comp->calls, 2) << "buckets after the failed one were not run";
  for (int i = r.num_parameters() - 1; i >= 0; --i) r.grad_ready(i);
  EXPECT_TRUE(r.synchronize());
  const int n = world()->size();
  EXPECT_TRUE(test::matches(params[0].grad, [&](int64_t i) { return (n - 1) / 2.0 + i; }));
}

// A resumed run continues the step count the compressor sees: the reducer's
// state (its "<name>/step" tensor) loaded into a fresh reducer.
TEST(Compressor, StepCountSurvivesAStateRoundTrip) {
  auto params = test::make_params(kParams);
  auto run_steps = [&](Reducer& r, int steps) {
    for (int s = 0; s < steps; ++s) {
      for (int i = r.num_parameters() - 1; i >= 0; --i) r.grad_ready(i);
      ASSERT_TRUE(r.synchronize());
    }
  };
  ReducerOptions o;
  o.compressor = std::make_shared<Float64Compressor>();
  o.name = "dpx";
  Reducer first(world(), o);
  test::register_all(first, params);
  first.build();
  run_steps(first, 3);
  StateDict saved = first.state_dict();
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(saved[0].name, "dpx/step");
  EXPECT_EQ(saved[0].tensor.data_as<int64_t>()[0], 3);
  const int64_t saved_step = saved[0].tensor.data_as<int64_t>()[0];

  auto comp = std::make_shared<Float64Compressor>();
  o.compressor = comp;
  Reducer second(world(), o);
  test::register_all(second, params);
  second.build();
  StateDict target = second.state_dict();
  target[0].tensor.data_as<int64_t>()[0] = saved_step;  // what a load does
  second.on_state_loaded();
  run_steps(second, 1);
  EXPECT_EQ(comp->last_step.back(), 3) << "the fresh reducer continues at step 3";
}

TEST(Compressor, NeedsAverage) {
  ReducerOptions o;
  o.compressor = std::make_shared<Float64Compressor>();
  o.op = ReduceOp::kSum;
  expect_contains(expect_error([&] { Reducer r(world(), o); }, ErrorCode::kInvalidArgument),
                  "op must be avg");
}

}  // namespace
}  // namespace tutti
