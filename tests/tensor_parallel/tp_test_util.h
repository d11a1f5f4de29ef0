// Helpers for the tensor-parallel tests: meshes for every TP size the world
// allows, global test data that every rank generates identically, a float64
// dense reference with per-element error bounds, and shard assembly from
// ShardInfo alone.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "core/check.h"
#include "tutti/mesh.h"
#include "tutti/tensor_parallel.h"

namespace tutti {
namespace tptest {

// One mesh per tp_size in {1, 2, 3, 4} that divides the world size, built in
// the same order on every rank (construction is collective).
std::vector<ProcessMeshPtr> all_meshes();

// n floats uniform in [lo, hi), the same on every rank for the same seed.
std::vector<float> random_floats(uint64_t seed, int64_t n, float lo = -1.0f,
                                 float hi = 1.0f);

// A float64 result with, per element, the sum of the absolute values of the
// terms that produced it: a float32 computation of an n-term sum in any
// order is within n * u * magnitude of the exact value (u = 2^-24, Higham's
// gamma_n bound), which is what the comparisons below allow.
struct Dense {
  std::vector<double> value;
  std::vector<double> magnitude;
  int64_t terms = 1;  // n: the longest sum behind an element
};

// C [m, n] = op(A) op(B) (+ bias[n]), row-major; A is [m, k] or (ta) [k, m],
// B is [k, n] or (tb) [n, k].
Dense gemm(const std::vector<float>& a, bool ta, const std::vector<float>& b,
           bool tb, int64_t m, int64_t n, int64_t k,
           const std::vector<float>* bias = nullptr);
// Column sums of x [rows, cols].
Dense column_sums(const std::vector<float>& x, int64_t rows, int64_t cols);
// Columns [c0, c1) / rows [r0, r1) of a [rows, cols] result.
Dense cols_of(const Dense& d, int64_t rows, int64_t cols, int64_t c0,
              int64_t c1);
Dense rows_of(const Dense& d, int64_t cols, int64_t r0, int64_t r1);
std::vector<float> cols_of(const std::vector<float>& x, int64_t rows,
                           int64_t cols, int64_t c0, int64_t c1);
std::vector<float> rows_of(const std::vector<float>& x, int64_t cols,
                           int64_t r0, int64_t r1);

// d with value and magnitude multiplied by f (and one more term).
Dense scaled(const Dense& d, double f);

// Every element of `actual` within (terms + extra_terms) * u * magnitude
// (+ 1e-30) of the reference; names the first element that is not.
::testing::AssertionResult near_dense(const std::vector<float>& actual,
                                      const Dense& expected,
                                      int64_t extra_terms = 4);
// |actual - expected| <= tol * max(1, |expected|) for every element.
::testing::AssertionResult near(const std::vector<float>& actual,
                                const std::vector<double>& expected,
                                double tol);

// Reads a host or device float32 tensor.
std::vector<float> read(const Tensor& t);
// A float32 host tensor view over v with shape s.
inline Tensor view(std::vector<float>& v, Shape s) {
  return Tensor(v.data(), DType::kFloat32, s);
}

// Assembles the global tensor from every TP rank's shard using only the
// ShardInfo facts (global_shape, dim, offset), as a checkpoint loader would:
// each shard is all-gathered over the TP group together with its offset.
// float32 shards; replicated tensors are returned as they are.
std::vector<float> assemble(const ProcessMesh& mesh, const NamedTensor& shard);
// Copies the region that `shard.shard` names out of `global` into the
// shard's tensor (host float32): the load half of a resharding checkpoint.
void load_region(const std::vector<float>& global, const NamedTensor& shard);

// Expects `f` to throw tutti::Error with `code` and a message containing
// every string in `parts`.
void expect_error(const std::function<void()>& f, ErrorCode code,
                  const std::vector<std::string>& parts);

}  // namespace tptest
}  // namespace tutti
