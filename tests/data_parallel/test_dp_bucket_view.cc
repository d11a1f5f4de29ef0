// gradient_as_bucket_view (issue 15): gradients live in the fusion buckets.
// The same steps run through a copying reducer and a view reducer must give
// the same bits (dyadic gradients: exact sums), the view reducer must copy
// nothing (stats) and its gradients must be the buckets' memory (slot
// offsets), also across the learned-order rebuild, with accumulation,
// unused parameters and the hierarchical all-reduce.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "data_parallel/dp_test_util.h"

namespace tutti {
namespace {

using test::ParamDecl;
using test::TestParam;

const std::vector<ParamDecl> kParams = {
    {"a", DType::kFloat32, Shape{16}}, {"b", DType::kFloat32, Shape{8, 4}},
    {"c", DType::kFloat32, Shape{20}}, {"d", DType::kFloat32, Shape{0}},
    {"e", DType::kFloat32, Shape{24}}, {"f", DType::kFloat32, Shape{6}},
    {"h", DType::kFloat64, Shape{5}},
};
constexpr int kUnused = 2;  // "c": unused in odd steps on rank 0
constexpr int kSteps = 3;
constexpr int kPasses = 2;  // backward passes per step

double grad_of(int rank, int p, int64_t i, int step, int pass) {
  return 0.5 * static_cast<double>((rank + 1) * (p + 2) + i % 3) + step + 0.25 * pass;
}
bool used(int rank, int p, int step) { return !(p == kUnused && rank == 0 && step % 2 == 1); }

ReducerOptions options(bool view, bool hierarchical) {
  ReducerOptions o;
  o.bucket_cap_mb = 200.0 / (1 << 20);
  o.first_bucket_cap_mb = 0;
  o.backward_passes_per_step = kPasses;
  o.hierarchical = hierarchical;
  o.hierarchical_node_size = 2;
  o.gradient_as_bucket_view = view;
  return o;
}

// Adds `v` to element i of a float32/float64 gradient (what autograd does).
void accumulate(const Tensor& g, int64_t i, double v) {
  if (g.dtype() == DType::kFloat32)
    static_cast<float*>(g.data())[i] += static_cast<float>(v);
  else
    static_cast<double*>(g.data())[i] += v;
}

void zero(const Tensor& g) {
  if (g.nbytes()) std::memset(g.data(), 0, g.nbytes());
}

std::vector<unsigned char> bytes_of(const Tensor& g) {
  const auto* p = static_cast<const unsigned char*>(g.data());
  return std::vector<unsigned char>(p, p + g.nbytes());
}

// Runs kSteps steps of kPasses passes in registration order (so the learned
// order differs from the initial plan) and returns every gradient after
// every step.  The gradients are read and written through gradient(i):
// the registered tensors in copying mode, the bucket slices in view mode.
std::vector<std::vector<unsigned char>> run(Reducer& r) {
  const int rank = world()->rank();
  const int n = r.num_parameters();
  std::vector<std::vector<unsigned char>> out;
  for (int step = 0; step < kSteps; ++step) {
    for (int p = 0; p < n; ++p) zero(r.gradient(p));  // optimizer.zero_grad()
    for (int pass = 0; pass < kPasses; ++pass) {
      for (int p = 0; p < n; ++p) {
        if (!used(rank, p, step)) continue;
        const Tensor g = r.gradient(p);
        for (int64_t i = 0; i < g.numel(); ++i) accumulate(g, i, grad_of(rank, p, i, step, pass));
        r.grad_ready(p);
      }
      EXPECT_EQ(r.synchronize(), pass + 1 == kPasses);
    }
    for (int p = 0; p < n; ++p) out.push_back(bytes_of(r.gradient(p)));
  }
  return out;
}

// Every gradient of bucket b sits at its slot's offset from the bucket's
// first: the gradients are the bucket's memory.
void expect_gradients_in_buckets(const Reducer& r) {
  for (const BucketLayout& b : r.buckets()) {
    const char* base = nullptr;
    for (const BucketSlot& s : b.slots) {
      int index = 0;
      while (kParams[static_cast<size_t>(index)].name != s.name) ++index;
      const Tensor g = r.gradient(index);
      if (g.numel() == 0) continue;
      const char* at = static_cast<const char*>(g.data());
      if (!base) base = at - s.offset * static_cast<int64_t>(dtype_size(b.dtype));
      EXPECT_EQ(at, base + s.offset * static_cast<int64_t>(dtype_size(b.dtype)))
          << "bucket " << b.id << " slot '" << s.name << "'";
    }
  }
}

class BucketView : public ::testing::TestWithParam<bool> {};  // hierarchical

TEST_P(BucketView, SameBitsAsCopyingAndNoCopies) {
  auto params = test::make_params(kParams);
  Reducer copying(world(), options(false, GetParam()));
  test::register_all(copying, params);
  copying.build();
  auto seeds = test::make_params(kParams);
  Reducer view(world(), options(true, GetParam()));
  for (auto& p : seeds) view.add_parameter(p.name, p.param_tensor(), Tensor());
  view.build();
  expect_gradients_in_buckets(view);
  const void* before = view.gradient(0).data();

  const auto a = run(copying);
  const auto b = run(view);
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k)
    EXPECT_EQ(a[k], b[k]) << "'" << kParams[k % kParams.size()].name << "' step "
                          << k / kParams.size();
  // Closed form of one element: 'b'[1] at the last step, both passes, all ranks.
  const int n = world()->size();
  double sum = 0;
  for (int k = 0; k < n; ++k)
    for (int pass = 0; pass < kPasses; ++pass) sum += grad_of(k, 1, 1, kSteps - 1, pass);
  EXPECT_EQ(static_cast<const float*>(view.gradient(1).data())[1], static_cast<float>(sum / n));

  const ReducerStats cs = copying.stats(), vs = view.stats();
  EXPECT_EQ(vs.bytes_copied_in, 0) << "view mode copied gradients into buckets";
  EXPECT_EQ(vs.bytes_copied_out, 0) << "view mode wrote buckets back";
  EXPECT_GT(cs.bytes_copied_in, 0);
  EXPECT_GT(cs.bytes_copied_out, 0);
  EXPECT_EQ(vs.bucket_rebuilds, cs.bucket_rebuilds);
  if (n > 1 || vs.bucket_rebuilds) {
    EXPECT_EQ(vs.bucket_rebuilds, 1) << "registration order differs from the plan";
    EXPECT_NE(view.gradient(0).data(), before) << "the rebuild moved the slices";
  }
  expect_gradients_in_buckets(view);
}

INSTANTIATE_TEST_SUITE_P(FlatAndHierarchical, BucketView, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "hierarchical" : "flat"; });

// A registered gradient seeds the slice at build(); afterwards the reducer
// reads only the slice.
TEST(BucketViewSeed, RegisteredGradientSeedsTheSlice) {
  auto params = test::make_params(kParams);
  for (auto& p : params) p.grad.fill([](int64_t i) { return 0.5 * static_cast<double>(i); });
  Reducer r(world(), options(true, false));
  test::register_all(r, params);
  r.build();
  const Tensor g = r.gradient(4);
  ASSERT_NE(g.data(), params[4].grad_tensor().data());
  EXPECT_EQ(static_cast<const float*>(g.data())[7], 3.5f);
  EXPECT_EQ(g.shape(), kParams[4].shape);
  EXPECT_NE(r.gradient_storage(4), nullptr);
}

}  // namespace
}  // namespace tutti
