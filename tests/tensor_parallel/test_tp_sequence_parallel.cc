// Sequence-parallel linear layers against the dense computation, and the
// errors for sizes tp_size does not divide.  Activations are
// [sequence, batch, hidden]; under sequence parallelism each TP rank holds
// sequence positions [r*s/p, (r+1)*s/p).  Tolerance: see test_tp_linear.cc
// (near_dense: (n + 4) 2^-24 sum|terms| per element).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tensor_parallel/tp_test_util.h"

namespace tutti {
namespace {

using tptest::Dense;
using tptest::near_dense;
using tptest::view;

struct SeqDims {
  int64_t seq_per_rank, batch, in, out;
};
const SeqDims kDims[] = {{1, 1, 12, 24},
                         {3, 1, 24, 12},
                         {1, 3, 12, 12},
                         {3, 5, 36, 24},
                         {0, 2, 12, 12}};

std::vector<float> poisoned(int64_t n) {
  return std::vector<float>(n, std::nanf(""));
}

// One case's sizes and global data (the same on every rank): rows
// [l0, l0 + local_rows) of the flattened [seq, batch] are this rank's
// sequence slice.
struct SeqCase {
  int p, r;
  int64_t seq, rows, local_rows, l0;
  std::vector<float> x, w, b, dy;
  SeqCase(const ProcessMesh& mesh, const SeqDims& d, uint64_t seed)
      : p(mesh.tp_size()),
        r(mesh.tp_rank()),
        seq(d.seq_per_rank * p),
        rows(seq * d.batch),
        local_rows(d.seq_per_rank * d.batch),
        l0(r * local_rows),
        x(tptest::random_floats(seed, rows * d.in)),
        w(tptest::random_floats(seed + 1, d.out * d.in)),
        b(tptest::random_floats(seed + 2, d.out)),
        dy(tptest::random_floats(seed + 3, rows * d.out)) {}
  std::string str(const ProcessMesh& mesh, const SeqDims& d, bool bias) const {
    return detail::cat(mesh.str(), " seq ", seq, " batch ", d.batch, " in ",
                       d.in, " out ", d.out, " bias ", bias);
  }
};

TEST(SequenceParallel,
     ColumnParallelLinearGathersInputAndReduceScattersItsGradient) {
  uint64_t seed = 900;
  for (const auto& mesh : tptest::all_meshes())
    for (const SeqDims& d : kDims)
      for (bool bias : {false, true}) {
        const SeqCase c(*mesh, d, seed += 10);
        SCOPED_TRACE(c.str(*mesh, d, bias));
        const int p = c.p, r = c.r;
        const int64_t seq = c.seq, rows = c.rows, local_rows = c.local_rows,
                      l0 = c.l0;
        auto x = c.x, w = c.w, b = c.b, dy = c.dy;
        const int64_t op = d.out / p, o0 = r * op;
        ColumnParallelLinearOptions o;
        o.name = "qkv";
        o.bias = bias;
        o.gather_output = false;
        o.sequence_parallel = true;
        ColumnParallelLinear layer(mesh, d.in, d.out, o);
        layer.load_from_full(view(w, {d.out, d.in}),
                             bias ? view(b, {d.out}) : Tensor());
        auto x_local = tptest::rows_of(x, d.in, l0, l0 + local_rows);
        std::vector<float> y = poisoned(rows * op);
        layer.forward(view(x_local, {d.seq_per_rank, d.batch, d.in}),
                      view(y, {seq, d.batch, op}));
        const Dense y_ref = tptest::gemm(x, false, w, true, rows, d.out, d.in,
                                         bias ? &b : nullptr);
        EXPECT_TRUE(
            near_dense(y, tptest::cols_of(y_ref, rows, d.out, o0, o0 + op)));

        auto dy_local = tptest::cols_of(dy, rows, d.out, o0, o0 + op);
        std::vector<float> dx = poisoned(local_rows * d.in);
        layer.backward(view(x_local, {d.seq_per_rank, d.batch, d.in}),
                       view(dy_local, {seq, d.batch, op}),
                       view(dx, {d.seq_per_rank, d.batch, d.in}));
        const Dense dx_ref =
            tptest::gemm(dy, false, w, false, rows, d.in, d.out);
        EXPECT_TRUE(
            near_dense(dx, tptest::rows_of(dx_ref, d.in, l0, l0 + local_rows)))
            << "input grad";
        const Dense dw_ref =
            tptest::gemm(dy, true, x, false, d.out, d.in, rows);
        EXPECT_TRUE(near_dense(tptest::read(layer.weight_grad()),
                               tptest::rows_of(dw_ref, d.in, o0, o0 + op)))
            << "weight grad";
        if (bias)
          EXPECT_TRUE(
              near_dense(tptest::read(layer.bias_grad()),
                         tptest::cols_of(tptest::column_sums(dy, rows, d.out),
                                         1, d.out, o0, o0 + op)))
              << "bias grad";
      }
}

TEST(SequenceParallel,
     RowParallelLinearReduceScattersOutputAndGathersItsGradient) {
  uint64_t seed = 1900;
  for (const auto& mesh : tptest::all_meshes())
    for (const SeqDims& d : kDims)
      for (bool bias : {false, true}) {
        const SeqCase c(*mesh, d, seed += 10);
        SCOPED_TRACE(c.str(*mesh, d, bias));
        const int p = c.p, r = c.r;
        const int64_t seq = c.seq, rows = c.rows, local_rows = c.local_rows,
                      l0 = c.l0;
        auto x = c.x, w = c.w, b = c.b, dy = c.dy;
        const int64_t ip = d.in / p, i0 = r * ip;
        RowParallelLinearOptions o;
        o.name = "proj";
        o.bias = bias;
        o.input_is_parallel = true;
        o.sequence_parallel = true;
        RowParallelLinear layer(mesh, d.in, d.out, o);
        layer.load_from_full(view(w, {d.out, d.in}),
                             bias ? view(b, {d.out}) : Tensor());
        auto x_part = tptest::cols_of(x, rows, d.in, i0, i0 + ip);
        std::vector<float> y = poisoned(local_rows * d.out);
        layer.forward(view(x_part, {seq, d.batch, ip}),
                      view(y, {d.seq_per_rank, d.batch, d.out}));
        const Dense y_ref = tptest::gemm(x, false, w, true, rows, d.out, d.in,
                                         bias ? &b : nullptr);
        EXPECT_TRUE(
            near_dense(y, tptest::rows_of(y_ref, d.out, l0, l0 + local_rows)));

        auto dy_local = tptest::rows_of(dy, d.out, l0, l0 + local_rows);
        std::vector<float> dx = poisoned(rows * ip);
        layer.backward(view(x_part, {seq, d.batch, ip}),
                       view(dy_local, {d.seq_per_rank, d.batch, d.out}),
                       view(dx, {seq, d.batch, ip}));
        const Dense dx_ref =
            tptest::gemm(dy, false, w, false, rows, d.in, d.out);
        EXPECT_TRUE(
            near_dense(dx, tptest::cols_of(dx_ref, rows, d.in, i0, i0 + ip)))
            << "input grad";
        const Dense dw_ref =
            tptest::gemm(dy, true, x, false, d.out, d.in, rows);
        EXPECT_TRUE(
            near_dense(tptest::read(layer.weight_grad()),
                       tptest::cols_of(dw_ref, d.out, d.in, i0, i0 + ip)))
            << "weight grad";
        if (bias)  // the full bias gradient on every TP rank (replicated bias)
          EXPECT_TRUE(near_dense(tptest::read(layer.bias_grad()),
                                 tptest::column_sums(dy, rows, d.out)))
              << "bias grad";
      }
}

// A LayerNorm-style scale gamma [h] applied to this rank's sequence slice
// (y = x * gamma): its gradient sum_rows dy * x covers only the local rows
// until allreduce_sequence_parallel_grads sums it over the TP group; then it
// is the dense gradient on every TP rank and counts once in the grad norm.
TEST(SequenceParallel, AllreduceSequenceParallelGradsGivesTheDenseGradient) {
  uint64_t seed = 1900;
  for (const auto& mesh : tptest::all_meshes())
    for (const SeqDims& d : kDims) {
      const SeqCase c(*mesh, d, seed += 10);
      SCOPED_TRACE(c.str(*mesh, d, false));
      const int64_t h = d.in;
      const auto dy = tptest::random_floats(seed + 5, c.rows * h);
      std::vector<float> prod(c.rows * h);
      for (size_t i = 0; i < prod.size(); ++i) prod[i] = dy[i] * c.x[i];
      // This rank's partial gradient, and a second parameter (a bias: the
      // column sums of dy) reduced in the same call.
      auto local = tptest::rows_of(prod, h, c.l0, c.l0 + c.local_rows);
      auto dy_local = tptest::rows_of(dy, h, c.l0, c.l0 + c.local_rows);
      std::vector<float> g_gamma(h, 0.0f), g_beta(h, 0.0f);
      for (int64_t row = 0; row < c.local_rows; ++row)
        for (int64_t j = 0; j < h; ++j) {
          g_gamma[j] += local[row * h + j];
          g_beta[j] += dy_local[row * h + j];
        }
      allreduce_sequence_parallel_grads(
          *mesh, {view(g_gamma, {h}), view(g_beta, {h})});
      const Dense gamma_ref = tptest::column_sums(prod, c.rows, h);
      const Dense beta_ref = tptest::column_sums(dy, c.rows, h);
      EXPECT_TRUE(near_dense(g_gamma, gamma_ref)) << "gamma grad";
      EXPECT_TRUE(near_dense(g_beta, beta_ref)) << "beta grad";
      // Replicated after the reduction: the TP grad norm counts it once.
      std::vector<float> gamma(h, 1.0f);
      TPParameter param{"ln.weight", view(gamma, {h}), view(g_gamma, {h}), {}};
      param.shard.global_shape = {h};
      double want = 0;
      for (double v : gamma_ref.value) want += v * v;
      EXPECT_NEAR(tp_grad_norm_squared(*mesh, {param}), want,
                  1e-5 * want + 1e-30);
    }
  // Nothing to sum; every rank agrees on that.
  allreduce_sequence_parallel_grads(*tptest::all_meshes().front(), {});
}

TEST(SequenceParallel, NonDivisibleSizesAndBadOptionsNameTheLayer) {
  for (const auto& mesh : tptest::all_meshes()) {
    const int p = mesh->tp_size();
    const std::string tp = "tp_size " + std::to_string(p);
    SCOPED_TRACE(mesh->str());
    ColumnParallelLinearOptions co;
    co.name = "fc_bad";
    RowParallelLinearOptions ro;
    ro.name = "proj_bad";
    if (p > 1) {
      tptest::expect_error(
          [&] { ColumnParallelLinear l(mesh, 8, 4 * p + 1, co); },
          ErrorCode::kInvalidArgument,
          {"ColumnParallelLinear 'fc_bad'",
           "out_features " + std::to_string(4 * p + 1), tp});
      tptest::expect_error([&] { RowParallelLinear l(mesh, 4 * p + 1, 8, ro); },
                           ErrorCode::kInvalidArgument,
                           {"RowParallelLinear 'proj_bad'",
                            "in_features " + std::to_string(4 * p + 1), tp});
      tptest::expect_error(
          [&] { VocabParallelEmbedding e(mesh, 10 * p + 1, 4); },
          ErrorCode::kInvalidArgument,
          {"VocabParallelEmbedding", "vocab_size " + std::to_string(10 * p + 1),
           tp});
      tptest::expect_error(
          [&] { VocabParallelCrossEntropy c(mesh, 10 * p + 1); },
          ErrorCode::kInvalidArgument,
          {"VocabParallelCrossEntropy",
           "vocab_size " + std::to_string(10 * p + 1), tp});
      // A sequence the TP group cannot split.
      RowParallelLinearOptions sp = ro;
      sp.input_is_parallel = true;
      sp.sequence_parallel = true;
      RowParallelLinear row(mesh, 4 * p, 4, sp);
      std::vector<float> x((p + 1) * 4), y(4 * 4);
      tptest::expect_error(
          [&] {
            row.forward(view(x, {p + 1, 4}), view(y, {1, 4}));
          },
          ErrorCode::kInvalidArgument,
          {"RowParallelLinear 'proj_bad' forward", "sequence length",
           std::to_string(p + 1), tp});
    }
    tptest::expect_error([&] { ColumnParallelLinear l(mesh, 0, 4 * p, co); },
                         ErrorCode::kInvalidArgument,
                         {"'fc_bad'", "must be positive"});
    co.sequence_parallel = true;  // with gather_output (the default)
    tptest::expect_error([&] { ColumnParallelLinear l(mesh, 8, 4 * p, co); },
                         ErrorCode::kInvalidArgument,
                         {"'fc_bad'", "gather_output = false"});
    ro.sequence_parallel = true;  // without input_is_parallel
    tptest::expect_error([&] { RowParallelLinear l(mesh, 4 * p, 8, ro); },
                         ErrorCode::kInvalidArgument,
                         {"'proj_bad'", "input_is_parallel = true"});
    // Shapes, dtypes and devices of activations.
    ColumnParallelLinearOptions ok;
    ok.name = "fc";
    ColumnParallelLinear fc(mesh, 8, 4 * p, ok);
    std::vector<float> x(3 * 8), y(3 * 4 * p), y_short(2 * 4 * p);
    tptest::expect_error(
        [&] {
          fc.forward(view(x, {3, 4, 2}), view(y, {3, 4 * p}));
        },
        ErrorCode::kInvalidArgument,
        {"ColumnParallelLinear 'fc' forward", "input", "last dimension 8"});
    tptest::expect_error(
        [&] {
          fc.forward(view(x, {3, 8}), view(y_short, {2, 4 * p}));
        },
        ErrorCode::kInvalidArgument, {"output", "expected 3 rows"});
    tptest::expect_error(
        [&] {
          fc.forward(Tensor(x.data(), DType::kBFloat16, Shape{3, 8}),
                     view(y, {3, 4 * p}));
        },
        ErrorCode::kInvalidArgument, {"input", "must be float32 on cpu"});
    tptest::expect_error(
        [&] {
          fc.backward(view(x, {3, 8}), Tensor(), Tensor());
        },
        ErrorCode::kInvalidArgument,
        {"'fc' backward", "grad_output is missing"});
    std::vector<float> w(4 * p * 7);
    tptest::expect_error(
        [&] {
          fc.load_from_full(view(w, {4 * p, 7}));
        },
        ErrorCode::kInvalidArgument,
        {"'fc' load_from_full", "fc.weight",
         "global shape [" + std::to_string(4 * p) + ", 8]"});
  }
}

}  // namespace
}  // namespace tutti
