// ColumnParallelLinear and RowParallelLinear against the dense float64
// computation, at every tp_size the world allows (1, 2, 4 under -np 4; 3
// under -np 3), for several shapes including odd and empty batches.
//
// Tolerance: a float32 sum of n terms, in any order (OpenBLAS blocking, the
// TP all-reduce of partial sums), is within n * 2^-24 * sum|terms| of the
// exact sum; near_dense() allows (n + 4) * 2^-24 * sum|terms| per element,
// with sum|terms| computed by the reference.  Copies (gather, slice) are
// exact.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tensor_parallel/tp_test_util.h"

namespace tutti {
namespace {

using tptest::Dense;
using tptest::near_dense;
using tptest::view;

struct Dims {
  int64_t rows, in, out;
};
// Every in/out is a multiple of 12, so tp_size 1, 2, 3 and 4 all divide.
const Dims kDims[] = {
    {1, 12, 24}, {3, 24, 12}, {7, 12, 36}, {5, 36, 12}, {0, 12, 12}};

std::string trace(const ProcessMesh& mesh, const Dims& d, const char* flag,
                  bool on, bool bias) {
  return detail::cat(mesh.str(), " rows ", d.rows, " in ", d.in, " out ", d.out,
                     " ", flag, " ", on, " bias ", bias);
}

// Global data for one case, identical on every rank.
struct Case {
  Dims d;
  std::vector<float> x, w, b, dy;
  Dense y, dx, dw, db;
  Case(const Dims& dims, uint64_t seed) : d(dims) {
    x = tptest::random_floats(seed, d.rows * d.in);
    w = tptest::random_floats(seed + 1, d.out * d.in);
    b = tptest::random_floats(seed + 2, d.out);
    dy = tptest::random_floats(seed + 3, d.rows * d.out);
    dx = tptest::gemm(dy, false, w, false, d.rows, d.in, d.out);  // dY W
    dw = tptest::gemm(dy, true, x, false, d.out, d.in, d.rows);   // dY^T X
    db = tptest::column_sums(dy, d.rows, d.out);
  }
  Dense forward(bool bias) const {
    return tptest::gemm(x, false, w, true, d.rows, d.out, d.in,
                        bias ? &b : nullptr);
  }
};

std::vector<float> poisoned(int64_t n) {
  return std::vector<float>(n, std::nanf(""));
}

TEST(ColumnParallelLinear, ForwardAndBackwardMatchDense) {
  uint64_t seed = 100;
  for (const auto& mesh : tptest::all_meshes())
    for (const Dims& d : kDims)
      for (bool gather : {false, true})
        for (bool bias : {false, true}) {
          SCOPED_TRACE(trace(*mesh, d, "gather_output", gather, bias));
          const Case c(d, seed += 10);
          const int p = mesh->tp_size(), r = mesh->tp_rank();
          const int64_t op = d.out / p, o0 = r * op, o1 = o0 + op;
          ColumnParallelLinearOptions opt;
          opt.name = "fc1";
          opt.gather_output = gather;
          opt.bias = bias;
          ColumnParallelLinear layer(mesh, d.in, d.out, opt);
          EXPECT_EQ(layer.out_features_per_rank(), op);
          std::vector<float> x = c.x, w = c.w, b = c.b;
          layer.load_from_full(view(w, {d.out, d.in}),
                               bias ? view(b, {d.out}) : Tensor());

          const int64_t out_cols = gather ? d.out : op;
          std::vector<float> y = poisoned(d.rows * out_cols);
          layer.forward(view(x, {d.rows, d.in}), view(y, {d.rows, out_cols}));
          const Dense y_ref = c.forward(bias);
          EXPECT_TRUE(near_dense(
              y,
              gather ? y_ref : tptest::cols_of(y_ref, d.rows, d.out, o0, o1)));

          std::vector<float> dy =
              gather ? c.dy : tptest::cols_of(c.dy, d.rows, d.out, o0, o1);
          std::vector<float> dx = poisoned(d.rows * d.in);
          layer.backward(view(x, {d.rows, d.in}), view(dy, {d.rows, out_cols}),
                         view(dx, {d.rows, d.in}));
          EXPECT_TRUE(near_dense(dx, c.dx)) << "input grad";
          const Dense dw_ref = tptest::rows_of(c.dw, d.in, o0, o1);
          EXPECT_TRUE(near_dense(tptest::read(layer.weight_grad()), dw_ref))
              << "weight grad";
          const Dense db_ref = tptest::cols_of(c.db, 1, d.out, o0, o1);
          if (bias)
            EXPECT_TRUE(near_dense(tptest::read(layer.bias_grad()), db_ref))
                << "bias grad";

          // A second backward (input grad skipped) accumulates; zero_grad
          // clears.
          layer.backward(view(x, {d.rows, d.in}), view(dy, {d.rows, out_cols}),
                         Tensor());
          EXPECT_TRUE(near_dense(tptest::read(layer.weight_grad()),
                                 tptest::scaled(dw_ref, 2)))
              << "accumulated weight grad";
          if (bias)
            EXPECT_TRUE(near_dense(tptest::read(layer.bias_grad()),
                                   tptest::scaled(db_ref, 2)))
                << "accumulated bias grad";
          layer.zero_grad();
          for (float v : tptest::read(layer.weight_grad())) ASSERT_EQ(v, 0.0f);
        }
}

TEST(RowParallelLinear, ForwardAndBackwardMatchDense) {
  uint64_t seed = 5000;
  for (const auto& mesh : tptest::all_meshes())
    for (const Dims& d : kDims)
      for (bool parallel_input : {false, true})
        for (bool bias : {false, true}) {
          SCOPED_TRACE(
              trace(*mesh, d, "input_is_parallel", parallel_input, bias));
          const Case c(d, seed += 10);
          const int p = mesh->tp_size(), r = mesh->tp_rank();
          const int64_t ip = d.in / p, i0 = r * ip, i1 = i0 + ip;
          RowParallelLinearOptions opt;
          opt.name = "fc2";
          opt.input_is_parallel = parallel_input;
          opt.bias = bias;
          RowParallelLinear layer(mesh, d.in, d.out, opt);
          EXPECT_EQ(layer.in_features_per_rank(), ip);
          std::vector<float> w = c.w, b = c.b;
          layer.load_from_full(view(w, {d.out, d.in}),
                               bias ? view(b, {d.out}) : Tensor());

          const int64_t in_cols = parallel_input ? ip : d.in;
          std::vector<float> x =
              parallel_input ? tptest::cols_of(c.x, d.rows, d.in, i0, i1) : c.x;
          std::vector<float> y = poisoned(d.rows * d.out);
          layer.forward(view(x, {d.rows, in_cols}), view(y, {d.rows, d.out}));
          EXPECT_TRUE(near_dense(y, c.forward(bias)));

          std::vector<float> dy = c.dy;
          std::vector<float> dx = poisoned(d.rows * in_cols);
          layer.backward(view(x, {d.rows, in_cols}), view(dy, {d.rows, d.out}),
                         view(dx, {d.rows, in_cols}));
          EXPECT_TRUE(near_dense(
              dx, parallel_input ? tptest::cols_of(c.dx, d.rows, d.in, i0, i1)
                                 : c.dx))
              << "input grad";
          EXPECT_TRUE(near_dense(tptest::read(layer.weight_grad()),
                                 tptest::cols_of(c.dw, d.out, d.in, i0, i1)))
              << "weight grad";
          if (bias)
            EXPECT_TRUE(near_dense(tptest::read(layer.bias_grad()), c.db))
                << "bias grad";
        }
}

// The 3-D activations of a transformer ([sequence, batch, hidden]) flatten to
// rows; a Column -> Row pair (the Megatron MLP without activation) computes
// X W1^T W2^T with one all-reduce forward and one backward.
TEST(TensorParallelLinear,
     ColumnThenRowOn3dActivationsCommunicatesOncePerPass) {
  const int64_t s = 3, bsz = 5, h = 12, f = 24;
  for (const auto& mesh : tptest::all_meshes()) {
    SCOPED_TRACE(mesh->str());
    const int p = mesh->tp_size();
    auto x = tptest::random_floats(7, s * bsz * h),
         w1 = tptest::random_floats(8, f * h),
         w2 = tptest::random_floats(9, h * f),
         dy = tptest::random_floats(10, s * bsz * h);
    ColumnParallelLinearOptions co;
    co.gather_output = false;
    co.bias = false;
    RowParallelLinearOptions ro;
    ro.input_is_parallel = true;
    ro.bias = false;
    ColumnParallelLinear fc1(mesh, h, f, co);
    RowParallelLinear fc2(mesh, f, h, ro);
    fc1.load_from_full(view(w1, {f, h}));
    fc2.load_from_full(view(w2, {h, f}));
    std::vector<float> hmid = poisoned(s * bsz * f / p),
                       y = poisoned(s * bsz * h);
    std::vector<float> dh = poisoned(s * bsz * f / p),
                       dx = poisoned(s * bsz * h);
    mesh->reset_comm_stats();
    fc1.forward(view(x, {s, bsz, h}), view(hmid, {s, bsz, f / p}));
    fc2.forward(view(hmid, {s, bsz, f / p}), view(y, {s, bsz, h}));
    fc2.backward(view(hmid, {s, bsz, f / p}), view(dy, {s, bsz, h}),
                 view(dh, {s, bsz, f / p}));
    fc1.backward(view(x, {s, bsz, h}), view(dh, {s, bsz, f / p}),
                 view(dx, {s, bsz, h}));
    // Reference through the dense intermediate (float64 throughout).
    const Dense hid = tptest::gemm(x, false, w1, true, s * bsz, f, h);
    std::vector<float> hid_f(hid.value.begin(), hid.value.end());
    Dense y_ref = tptest::gemm(hid_f, false, w2, true, s * bsz, h, f);
    y_ref.terms += h;  // the intermediate was rounded to float32 once
    EXPECT_TRUE(near_dense(y, y_ref));
    const CommStats st = mesh->comm_stats();
    const uint64_t act = s * bsz * h * sizeof(float);
    EXPECT_EQ(st.allreduce_calls, p > 1 ? 2u : 0u);
    EXPECT_EQ(st.allreduce_bytes, p > 1 ? 2 * act : 0u);
    EXPECT_EQ(st.allgather_calls + st.reduce_scatter_calls, 0u);
  }
}

// Parameters in float16/bfloat16 on the CPU: GEMMs accumulate in float32 and
// round once; the TP all-reduce adds p rounded partial sums.  Bound: (n
// 2^-24 + (p + 3) u16) * sum|terms|, u16 = 2^-11 (float16) or 2^-8
// (bfloat16), for the rounding of each partial, of the sum and of the bias
// add.
TEST(TensorParallelLinear, SixteenBitParametersAccumulateInFloat32) {
  const int64_t rows = 5, h = 12, f = 24;
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (const auto& mesh : tptest::all_meshes()) {
      SCOPED_TRACE(detail::cat(mesh->str(), " ", dtype_name(dt)));
      const int p = mesh->tp_size(), r = mesh->tp_rank();
      auto round = [&](std::vector<float> v) {
        std::vector<uint16_t> h16(v.size());
        convert(v.data(), DType::kFloat32, h16.data(), dt, v.size());
        convert(h16.data(), dt, v.data(), DType::kFloat32, v.size());
        return v;
      };
      auto to16 = [&](const std::vector<float>& v) {
        std::vector<uint16_t> h16(v.size());
        convert(v.data(), DType::kFloat32, h16.data(), dt, v.size());
        return h16;
      };
      auto w = round(tptest::random_floats(22, h * f)),
           b = round(tptest::random_floats(23, h));
      RowParallelLinearOptions ro;
      ro.dtype = dt;
      RowParallelLinear fc(mesh, f, h, ro);
      fc.load_from_full(view(w, {h, f}), view(b, {h}));
      const std::vector<float> xin = round(tptest::random_floats(24, rows * f));
      auto x16 = to16(xin);
      std::vector<uint16_t> y16(rows * h, 0xFFFF);
      fc.forward(Tensor(x16.data(), dt, Shape{rows, f}),
                 Tensor(y16.data(), dt, Shape{rows, h}));
      std::vector<float> y(rows * h);
      convert(y16.data(), dt, y.data(), DType::kFloat32, y.size());
      const Dense ref = tptest::gemm(xin, false, w, true, rows, h, f, &b);
      const double u16 =
          dt == DType::kFloat16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
      for (size_t i = 0; i < y.size(); ++i) {
        const double tol = (ref.terms * std::ldexp(1.0, -24) + (p + 3) * u16) *
                           ref.magnitude[i];
        ASSERT_LE(std::fabs(y[i] - ref.value[i]), tol)
            << "element " << i << " rank " << r;
      }
    }
}

}  // namespace
}  // namespace tutti
