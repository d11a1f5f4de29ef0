#include "tensor_parallel/tp_test_util.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/cuda_utils.h"

namespace tutti {
namespace tptest {

std::vector<ProcessMeshPtr> all_meshes() {
  std::vector<ProcessMeshPtr> meshes;
  for (int tp : {1, 2, 3, 4})
    if (world()->size() % tp == 0)
      meshes.push_back(std::make_shared<ProcessMesh>(world(), tp));
  return meshes;
}

std::vector<float> random_floats(uint64_t seed, int64_t n, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Dense gemm(const std::vector<float>& a, bool ta, const std::vector<float>& b,
           bool tb, int64_t m, int64_t n, int64_t k,
           const std::vector<float>* bias) {
  Dense d;
  d.value.assign(m * n, 0.0);
  d.magnitude.assign(m * n, 0.0);
  d.terms = k + (bias ? 1 : 0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, mag = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double t = static_cast<double>(ta ? a[p * m + i] : a[i * k + p]) *
                         static_cast<double>(tb ? b[j * k + p] : b[p * n + j]);
        s += t;
        mag += std::fabs(t);
      }
      if (bias) {
        s += (*bias)[j];
        mag += std::fabs((*bias)[j]);
      }
      d.value[i * n + j] = s;
      d.magnitude[i * n + j] = mag;
    }
  return d;
}

Dense column_sums(const std::vector<float>& x, int64_t rows, int64_t cols) {
  Dense d;
  d.value.assign(cols, 0.0);
  d.magnitude.assign(cols, 0.0);
  d.terms = rows;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      d.value[c] += x[r * cols + c];
      d.magnitude[c] += std::fabs(x[r * cols + c]);
    }
  return d;
}

Dense cols_of(const Dense& d, int64_t rows, int64_t cols, int64_t c0,
              int64_t c1) {
  Dense o;
  o.terms = d.terms;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = c0; c < c1; ++c) {
      o.value.push_back(d.value[r * cols + c]);
      o.magnitude.push_back(d.magnitude[r * cols + c]);
    }
  return o;
}

Dense rows_of(const Dense& d, int64_t cols, int64_t r0, int64_t r1) {
  Dense o;
  o.terms = d.terms;
  o.value.assign(d.value.begin() + r0 * cols, d.value.begin() + r1 * cols);
  o.magnitude.assign(d.magnitude.begin() + r0 * cols,
                     d.magnitude.begin() + r1 * cols);
  return o;
}

std::vector<float> cols_of(const std::vector<float>& x, int64_t rows,
                           int64_t cols, int64_t c0, int64_t c1) {
  std::vector<float> o;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = c0; c < c1; ++c) o.push_back(x[r * cols + c]);
  return o;
}

std::vector<float> rows_of(const std::vector<float>& x, int64_t cols,
                           int64_t r0, int64_t r1) {
  return std::vector<float>(x.begin() + r0 * cols, x.begin() + r1 * cols);
}

Dense scaled(const Dense& d, double f) {
  Dense o = d;
  for (auto& v : o.value) v *= f;
  for (auto& v : o.magnitude) v *= std::fabs(f);
  o.terms += 1;
  return o;
}

::testing::AssertionResult near_dense(const std::vector<float>& actual,
                                      const Dense& expected,
                                      int64_t extra_terms) {
  if (actual.size() != expected.value.size())
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " vs expected "
           << expected.value.size();
  const double u = std::ldexp(1.0, -24);
  for (size_t i = 0; i < actual.size(); ++i) {
    const double tol =
        (expected.terms + extra_terms) * u * expected.magnitude[i] + 1e-30;
    const double err = std::fabs(actual[i] - expected.value[i]);
    if (!(err <= tol))
      return ::testing::AssertionFailure()
             << "element " << i << " is " << actual[i] << ", expected "
             << expected.value[i] << " (error " << err << " > bound " << tol
             << " from " << expected.terms << " terms of magnitude "
             << expected.magnitude[i] << ")";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult near(const std::vector<float>& actual,
                                const std::vector<double>& expected,
                                double tol) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " vs expected " << expected.size();
  for (size_t i = 0; i < actual.size(); ++i) {
    const double err = std::fabs(actual[i] - expected[i]);
    if (!(err <= tol * std::max(1.0, std::fabs(expected[i]))))
      return ::testing::AssertionFailure()
             << "element " << i << " is " << actual[i] << ", expected "
             << expected[i] << " (tolerance " << tol << ")";
  }
  return ::testing::AssertionSuccess();
}

std::vector<float> read(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  std::vector<float> v(t.numel());
  if (t.numel() == 0) return v;
#if TUTTI_WITH_CUDA
  if (t.is_cuda()) {
    TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
    TUTTI_CUDA_CHECK(
        cudaMemcpy(v.data(), t.data(), t.nbytes(), cudaMemcpyDeviceToHost));
    return v;
  }
#endif
  std::copy_n(t.data_as<float>(), t.numel(), v.data());
  return v;
}

std::vector<float> assemble(const ProcessMesh& mesh, const NamedTensor& nt) {
  const ShardInfo& s = nt.shard;
  std::vector<float> local = read(nt.tensor);
  if (!s.sharded()) return local;
  const auto tp = mesh.tp_group();
  const int p = tp->size();
  // Every rank's offset, then every rank's data (equal shard sizes).
  std::vector<int64_t> offsets(p);
  int64_t mine = s.offset;
  tp->allgather(Tensor::of(&mine, 1), Tensor::of(offsets));
  std::vector<float> all(local.size() * p);
  tp->allgather(Tensor::of(local), Tensor::of(all));
  int64_t global_numel = 1, inner = 1;
  for (size_t i = 0; i < s.global_shape.size(); ++i) {
    global_numel *= s.global_shape[i];
    if (static_cast<int>(i) > s.dim) inner *= s.global_shape[i];
  }
  const int64_t local_dim = nt.tensor.shape()[s.dim];
  const int64_t global_dim = s.global_shape[s.dim];
  std::vector<float> global(global_numel, std::nanf(""));
  for (int r = 0; r < p; ++r)
    for (size_t l = 0; l < local.size(); ++l) {
      const int64_t outer = l / (local_dim * inner),
                    d = (l / inner) % local_dim, in = l % inner;
      global[(outer * global_dim + offsets[r] + d) * inner + in] =
          all[r * local.size() + l];
    }
  return global;
}

void load_region(const std::vector<float>& global, const NamedTensor& nt) {
  const ShardInfo& s = nt.shard;
  float* dst = nt.tensor.data_as<float>();
  const int64_t n = nt.tensor.numel();
  if (!s.sharded()) {
    std::copy_n(global.data(), n, dst);
    return;
  }
  int64_t inner = 1;
  for (size_t i = s.dim + 1; i < s.global_shape.size(); ++i)
    inner *= s.global_shape[i];
  const int64_t local_dim = nt.tensor.shape()[s.dim];
  const int64_t global_dim = s.global_shape[s.dim];
  for (int64_t l = 0; l < n; ++l) {
    const int64_t outer = l / (local_dim * inner), d = (l / inner) % local_dim,
                  in = l % inner;
    dst[l] = global[(outer * global_dim + s.offset + d) * inner + in];
  }
}

void expect_error(const std::function<void()>& f, ErrorCode code,
                  const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an Error(" << error_code_name(code) << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message lacks '" << p << "': " << e.what();
  }
}

}  // namespace tptest
}  // namespace tutti
