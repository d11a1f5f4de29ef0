// Region operators, forward and backward, with closed-form expected values:
// rank w (world rank) stores test::rank_value(w, i), small integers that every
// dtype holds exactly and whose sums over a TP group stay exact, so the
// comparisons are exact in float32, float16 and bfloat16.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "tensor_parallel/tp_test_util.h"

namespace tutti {
namespace {

using test::Buffer;
using test::rank_value;

using RegionFn = void (*)(const ProcessMesh&, const Tensor&, const Tensor&,
                          const RegionOptions&);

// World rank of TP rank q in this rank's TP group.
int peer(const ProcessMesh& m, int q) { return m.rank_of(m.dp_rank(), q); }

// Sum over the TP group of rank_value(peer, i).
double tp_sum(const ProcessMesh& m, int64_t i) {
  double s = 0;
  for (int q = 0; q < m.tp_size(); ++q) s += rank_value(peer(m, q), i);
  return s;
}

struct Region {
  const char* name;
  RegionFn fn;
  bool first_dim;  // split on the first (sequence) dimension, else the last
  bool shrinks;    // output is the shard of the input (else input is the shard)
  // expected(mesh, shard_numel, k): output element k; the input of rank w
  // holds rank_value(w, i).
  std::function<double(const ProcessMesh&, int64_t, int64_t)> expected;
};

// Shapes of (shard, whole) for a split on the first or the last dimension.
std::vector<std::pair<Shape, Shape>> shapes(int p, bool first_dim) {
  if (first_dim)
    return {{Shape{1, 3}, Shape{p, 3}},
            {Shape{3, 5}, Shape{3 * p, 5}},
            {Shape{2, 3, 2}, Shape{2 * p, 3, 2}},
            {Shape{3}, Shape{3 * p}},
            {Shape{0, 4}, Shape{0, 4}}};
  return {{Shape{1, 1}, Shape{1, p}},
          {Shape{3, 5}, Shape{3, 5 * p}},
          {Shape{2, 3, 2}, Shape{2, 3, 2 * p}},
          {Shape{0, 4}, Shape{0, 4 * p}},
          {Shape{7}, Shape{7 * p}}};
}

// Element k of the whole tensor [.., c*p] built from shards [.., c] side by
// side: shard q's element (row, j).
double gathered_last(const ProcessMesh& m, int64_t c, int64_t k) {
  const int p = m.tp_size();
  const int64_t row = k / (c * p), col = k % (c * p);
  return rank_value(peer(m, static_cast<int>(col / c)), row * c + col % c);
}

// This rank's slice of the last dimension of its own whole tensor.
double sliced_last(const ProcessMesh& m, int64_t c, int64_t k) {
  const int p = m.tp_size();
  const int64_t row = k / c, j = k % c;
  return rank_value(peer(m, m.tp_rank()), row * c * p + m.tp_rank() * c + j);
}

std::vector<Region> regions() {
  auto same = [](const ProcessMesh& m, int64_t, int64_t k) {
    return rank_value(peer(m, m.tp_rank()), k);
  };
  auto sum = [](const ProcessMesh& m, int64_t, int64_t k) {
    return tp_sum(m, k);
  };
  // Shard sizes: n is the shard's element count.
  auto gather_first = [](const ProcessMesh& m, int64_t n, int64_t k) {
    return rank_value(peer(m, static_cast<int>(k / n)), k % n);
  };
  auto reduce_scatter_first = [](const ProcessMesh& m, int64_t n, int64_t k) {
    return tp_sum(m, m.tp_rank() * n + k);
  };
  auto slice_first = [](const ProcessMesh& m, int64_t n, int64_t k) {
    return rank_value(peer(m, m.tp_rank()), m.tp_rank() * n + k);
  };
  // For last-dim regions the expectation needs the shard's last dimension,
  // passed as n by the driver.
  return {
      {"copy_to_tp_forward", copy_to_tp_forward, false, false, same},
      {"copy_to_tp_backward", copy_to_tp_backward, false, false, sum},
      {"reduce_from_tp_forward", reduce_from_tp_forward, false, false, sum},
      {"reduce_from_tp_backward", reduce_from_tp_backward, false, false, same},
      {"gather_from_tp_forward", gather_from_tp_forward, false, false,
       gathered_last},
      {"gather_from_tp_backward", gather_from_tp_backward, false, true,
       sliced_last},
      {"scatter_to_tp_forward", scatter_to_tp_forward, false, true,
       sliced_last},
      {"scatter_to_tp_backward", scatter_to_tp_backward, false, false,
       gathered_last},
      {"gather_from_sequence_parallel_forward",
       gather_from_sequence_parallel_forward, true, false, gather_first},
      {"gather_from_sequence_parallel_backward",
       gather_from_sequence_parallel_backward, true, true,
       reduce_scatter_first},
      {"reduce_scatter_to_sequence_parallel_forward",
       reduce_scatter_to_sequence_parallel_forward, true, true,
       reduce_scatter_first},
      {"reduce_scatter_to_sequence_parallel_backward",
       reduce_scatter_to_sequence_parallel_backward, true, false, gather_first},
      {"scatter_to_sequence_parallel_forward",
       scatter_to_sequence_parallel_forward, true, true, slice_first},
      {"scatter_to_sequence_parallel_backward",
       scatter_to_sequence_parallel_backward, true, false, gather_first},
  };
}

bool is_pointwise(const Region& r) {
  const std::string n = r.name;
  return n.rfind("copy_", 0) == 0 || n.rfind("reduce_from", 0) == 0;
}

TEST(Regions, ForwardAndBackwardHaveClosedForms) {
  for (const auto& mesh : tptest::all_meshes())
    for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
      for (const Region& r : regions())
        for (const auto& sw : shapes(mesh->tp_size(), r.first_dim)) {
          // Pointwise regions keep the shape: use the whole shape for both.
          const Shape in_shape =
              is_pointwise(r) ? sw.second : (r.shrinks ? sw.second : sw.first);
          const Shape out_shape =
              is_pointwise(r) ? sw.second : (r.shrinks ? sw.first : sw.second);
          SCOPED_TRACE(detail::cat(mesh->str(), " ", dtype_name(dt), " ",
                                   r.name, " ", in_shape.str(), " -> ",
                                   out_shape.str()));
          const int me = world()->rank();
          Buffer in(dt, in_shape.numel()), out(dt, out_shape.numel());
          in.fill([&](int64_t i) { return rank_value(me, i); });
          out.fill([](int64_t) { return -99.0; });  // poison
          RegionOptions o;
          o.name = "x";
          r.fn(*mesh, Tensor(in.bytes.data(), dt, in_shape),
               Tensor(out.bytes.data(), dt, out_shape), o);
          const int64_t param =
              r.first_dim ? sw.first.numel() : sw.first[sw.first.ndim() - 1];
          EXPECT_TRUE(test::matches(
              out, [&](int64_t k) { return r.expected(*mesh, param, k); }));
        }
}

TEST(Regions, MisshapenTensorsAreClearErrors) {
  for (const auto& mesh : tptest::all_meshes()) {
    SCOPED_TRACE(mesh->str());
    const int p = mesh->tp_size();
    std::vector<float> a(64), b(64);
    RegionOptions o;
    o.name = "h";
    tptest::expect_error(
        [&] {
          gather_from_tp_forward(*mesh, tptest::view(a, {2, 3}),
                                 tptest::view(b, {3, 3 * p}), o);
        },
        ErrorCode::kInvalidArgument,
        {"gather_from_tp forward 'h'", "must agree except in the last"});
    tptest::expect_error(
        [&] {
          copy_to_tp_forward(*mesh, tptest::view(a, {2, 3}),
                             Tensor(b.data(), DType::kFloat16, Shape{2, 3}), o);
        },
        ErrorCode::kInvalidArgument,
        {"copy_to_tp forward 'h'", "same shape, dtype"});
    if (p > 1) {
      tptest::expect_error(
          [&] {
            scatter_to_tp_forward(*mesh, tptest::view(a, {2, 3 * p + 1}),
                                  tptest::view(b, {2, 3}), o);
          },
          ErrorCode::kInvalidArgument,
          {"scatter_to_tp forward 'h'",
           "last dimension " + std::to_string(3 * p + 1),
           "not divisible by tp_size " + std::to_string(p)});
      tptest::expect_error(
          [&] {
            reduce_scatter_to_sequence_parallel_forward(
                *mesh, tptest::view(a, {p + 1, 2}), tptest::view(b, {1, 2}), o);
          },
          ErrorCode::kInvalidArgument,
          {"first dimension " + std::to_string(p + 1),
           "tp_size " + std::to_string(p)});
    }
  }
}

}  // namespace
}  // namespace tutti
