// GPU variants (label gpu; skipped without a CUDA device): every
// tensor-parallel kernel against its CPU twin on fresh random inputs with
// poisoned outputs, and the layers on CUDA against the same layers on the
// CPU.  Under -np N the ranks take device local_rank() % cuda_device_count():
// with a device each, the layers' collectives run over NCCL; where ranks
// share a GPU, over the staged transport (mpi_test_main.cc decides).
//
// Tolerances: float32 kernels differ from the twins only in summation order
// and exp/log ulps (1e-5 relative); float16/bfloat16 results are rounded
// once to 11/8 significant bits (2^-10 / 2^-7 relative, times a small
// factor for the roundings inside the layer).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "core/cuda_utils.h"
#include "core/gemm.h"
#include "tensor_parallel/memory.h"
#include "tensor_parallel/ops.h"
#include "tensor_parallel/tp_test_util.h"

namespace tutti {
namespace {

#if TUTTI_WITH_CUDA

// Host bytes of n elements of dtype from floats (rounded to dtype).
std::vector<unsigned char> to_bytes(const std::vector<float>& v, DType dt) {
  std::vector<unsigned char> b(v.size() * dtype_size(dt));
  convert(v.data(), DType::kFloat32, b.data(), dt, v.size());
  return b;
}

std::vector<float> to_floats(const std::vector<unsigned char>& b, DType dt) {
  std::vector<float> v(b.size() / dtype_size(dt));
  convert(b.data(), dt, v.data(), DType::kFloat32, v.size());
  return v;
}

// A host tensor and its device copy.
struct Pair {
  std::vector<unsigned char> host;
  tp::OwnedTensor dev;
  Tensor h;
  Pair(const std::vector<unsigned char>& bytes, DType dt, Shape s, int device)
      : host(bytes), dev(dt, s, Device::cuda(device)) {
    h = Tensor(host.data(), dt, s);
    tp::copy_from_host(dev.tensor(), host.data());
  }
  // Poisoned (all bits set: NaN for floats, -1 for integers).
  Pair(DType dt, Shape s, int device)
      : host(s.numel() * dtype_size(dt), 0xFF),
        dev(dt, s, Device::cuda(device)) {
    h = Tensor(host.data(), dt, s);
    tp::copy_from_host(dev.tensor(), host.data());
  }
  const Tensor& d() const { return dev.tensor(); }
  std::vector<float> device_floats() const {
    std::vector<unsigned char> b(host.size());
    tp::copy_to_host(b.data(), d());
    return to_floats(b, h.dtype());
  }
  std::vector<float> host_floats() const { return to_floats(host, h.dtype()); }
};

double tolerance(DType dt) {
  return dt == DType::kFloat32 ? 1e-5 : dt == DType::kFloat16 ? 4e-3 : 3e-2;
}

::testing::AssertionResult same(const Pair& p, double tol) {
  const auto dev = p.device_floats(), host = p.host_floats();
  std::vector<double> want(host.begin(), host.end());
  return tptest::near(dev, want, tol);
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    TUTTI_REQUIRE_GPU();
    device = local_rank() % cuda_device_count();
    guard_.emplace(device);  // launches check that tutti set the device
  }
  void TearDown() override { guard_.reset(); }
  int device = 0;

 private:
  std::optional<cuda::DeviceGuard> guard_;
};

const DType kFloatTypes[] = {DType::kFloat32, DType::kFloat16,
                             DType::kBFloat16};

TEST_F(Gpu, BiasKernelsAndSumOfSquaresMatchTheCpuTwins) {
  for (DType dt : kFloatTypes)
    for (int64_t rows : {1, 7, 300})
      for (int64_t cols : {1, 33, 1000}) {
        SCOPED_TRACE(detail::cat(dtype_name(dt), " [", rows, ", ", cols, "]"));
        Pair out(to_bytes(tptest::random_floats(1, rows * cols), dt), dt,
                 Shape{rows, cols}, device);
        Pair bias(to_bytes(tptest::random_floats(2, cols), dt), dt, Shape{cols},
                  device);
        tp::bias_add(out.h, bias.h, nullptr);
        tp::bias_add(out.d(), bias.d(), nullptr);
        EXPECT_TRUE(same(out, tolerance(dt))) << "bias_add";
        Pair db(to_bytes(tptest::random_floats(3, cols), dt), dt, Shape{cols},
                device);
        tp::bias_grad(out.h, db.h, nullptr);
        tp::bias_grad(out.d(), db.d(), nullptr);
        EXPECT_TRUE(
            same(db, tolerance(dt) * std::sqrt(static_cast<double>(rows))))
            << "bias_grad";
        double host = 0, dev = 0;
        tp::sum_squares({out.h}, &host, nullptr);
        tp::sum_squares({out.d()}, &dev, nullptr);
        EXPECT_NEAR(dev, host, 1e-6 * host) << "sum_squares";
      }
}

TEST_F(Gpu, EmbeddingKernelsMatchTheCpuTwins) {
  const int64_t vocab_local = 11, dim = 37, start = 22;
  for (DType dt : kFloatTypes)
    for (DType index : {DType::kInt32, DType::kInt64})
      for (int64_t n : {1, 9, 513}) {
        SCOPED_TRACE(
            detail::cat(dtype_name(dt), " ", dtype_name(index), " n ", n));
        std::vector<int64_t> ids(n);
        for (int64_t i = 0; i < n; ++i)
          ids[i] = (i * 13) % 50;  // some held, most not
        std::vector<unsigned char> id_bytes(n * dtype_size(index));
        convert(ids.data(), DType::kInt64, id_bytes.data(), index, n);
        Pair id(id_bytes, index, Shape{n}, device);
        Pair w(to_bytes(tptest::random_floats(4, vocab_local * dim), dt), dt,
               Shape{vocab_local, dim}, device);
        Pair out(dt, Shape{n, dim}, device);
        tp::embedding_lookup(id.h, w.h, start, out.h, nullptr);
        tp::embedding_lookup(id.d(), w.d(), start, out.d(), nullptr);
        EXPECT_TRUE(same(out, 0)) << "lookup is a copy: exact";
        Pair dw(to_bytes(std::vector<float>(vocab_local * dim, 0.5f), dt), dt,
                Shape{vocab_local, dim}, device);
        Pair dy(to_bytes(tptest::random_floats(5, n * dim), dt), dt,
                Shape{n, dim}, device);
        Pair acc(DType::kFloat32, Shape{vocab_local, dim}, device);
        tp::embedding_grad(id.h, dy.h, start, dw.h, acc.h, nullptr);
        tp::embedding_grad(id.d(), dy.d(), start, dw.d(), acc.d(), nullptr);
        // Float32 sums in another order, then one rounding to dt.
        EXPECT_TRUE(same(dw, tolerance(dt))) << "grad";
      }
}

// Thousands of one token: float16 atomics would stall at 2048 (bfloat16 at
// 256); the float32 accumulation gives the closed form exactly.
TEST_F(Gpu, EmbeddingGradOfRepeatedTokensIsExact) {
  const int64_t n = 4098, dim = 40, rows = 6, start = 12;
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<int64_t> ids(n, start + 1);
    ids[0] = start + 5;
    ids[1] = 0;  // held by another rank
    std::vector<unsigned char> id_bytes(n * 8);
    std::memcpy(id_bytes.data(), ids.data(), id_bytes.size());
    Pair id(id_bytes, DType::kInt64, Shape{n}, device);
    std::vector<float> g(n * dim, 1.0f);
    for (int64_t h = 0; h < dim; ++h) g[h] = 0.5f;
    Pair dy(to_bytes(g, dt), dt, Shape{n, dim}, device);
    Pair dw(to_bytes(std::vector<float>(rows * dim, 0.0f), dt), dt,
            Shape{rows, dim}, device);
    Pair acc(DType::kFloat32, Shape{rows, dim}, device);  // poisoned
    tp::embedding_grad(id.d(), dy.d(), start, dw.d(), acc.d(), nullptr);
    const auto got = dw.device_floats();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < dim; ++h)
        ASSERT_EQ(got[r * dim + h], r == 1 ? 4096.0f : r == 5 ? 0.5f : 0.0f)
            << "row " << r << " col " << h;
  }
}

// tp_grad_norm_squared's reduction: the same inputs give the same bits on
// every run (no atomics), and match the CPU twin.
TEST_F(Gpu, SumOfSquaresIsBitwiseDeterministic) {
  std::vector<Pair> grads;
  std::vector<Tensor> dev_views, host_views;
  int seed = 20;
  for (int64_t n : {1, 255, 4097, 1 << 20, 3000001})
    for (DType dt : kFloatTypes) {
      grads.emplace_back(to_bytes(tptest::random_floats(seed++, n), dt), dt,
                         Shape{n}, device);
    }
  for (const Pair& p : grads) {
    dev_views.push_back(p.d());
    host_views.push_back(p.h);
  }
  std::vector<double> first(grads.size()), again(grads.size()),
      host(grads.size());
  tp::sum_squares(dev_views, first.data(), nullptr);
  for (int run = 0; run < 3; ++run) {
    tp::sum_squares(dev_views, again.data(), nullptr);
    ASSERT_EQ(std::memcmp(first.data(), again.data(), first.size() * 8), 0)
        << "run " << run;
  }
  tp::sum_squares(host_views, host.data(), nullptr);
  for (size_t i = 0; i < host.size(); ++i)
    EXPECT_NEAR(first[i], host[i], 1e-9 * host[i]) << "tensor " << i;
}

// GEMMs on two streams from two fresh threads at once: each stream has its
// own cuBLAS handle and workspace (a shared workspace would let the two
// race), and each thread's device is set by the GEMM itself.
TEST_F(Gpu, GemmsOnTwoStreamsFromTwoThreadsMatchTheCpu) {
  const int64_t m = 192, n = 160, k = 320;
  const DType f32 = DType::kFloat32;
  Pair a(to_bytes(tptest::random_floats(31, m * k), f32), f32, Shape{m, k}, device);
  Pair b(to_bytes(tptest::random_floats(32, k * n), f32), f32, Shape{k, n}, device);
  Pair want(to_bytes(std::vector<float>(m * n, 0.0f), f32), f32, Shape{m, n}, device);
  blas::gemm(a.h, false, b.h, false, want.h);
  const auto expected = want.host_floats();
  std::vector<double> expect(expected.begin(), expected.end());
  cuda::Stream s0(device), s1(device);
  Pair c0(f32, Shape{m, n}, device), c1(f32, Shape{m, n}, device);
  std::string errors[2];
  auto work = [&](const Pair& c, cudaStream_t s, std::string* error) {
    try {
      for (int rep = 0; rep < 50; ++rep)
        blas::gemm(a.d(), false, b.d(), false, c.d(), 1.0f, 0.0f, s);
      TUTTI_CUDA_CHECK(cudaStreamSynchronize(s));
    } catch (const std::exception& e) {
      *error = e.what();
    }
  };
  std::thread t0(work, std::cref(c0), s0.get(), &errors[0]),
      t1(work, std::cref(c1), s1.get(), &errors[1]);
  t0.join();
  t1.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  // float32 sums of k products in [-1, 1], in another order than OpenBLAS.
  const double tol = k * std::ldexp(1.0, -23);
  EXPECT_TRUE(tptest::near(c0.device_floats(), expect, tol)) << "stream 0";
  EXPECT_TRUE(tptest::near(c1.device_floats(), expect, tol)) << "stream 1";
}

TEST_F(Gpu, CrossEntropyKernelsMatchTheCpuTwins) {
  for (DType dt : kFloatTypes)
    for (int64_t n : {1, 5, 70})
      for (int64_t v : {3, 257, 5000}) {
        SCOPED_TRACE(detail::cat(dtype_name(dt), " n ", n, " v_local ", v));
        const int64_t start = v, vocab = 3 * v, ignore = -100;
        auto z = tptest::random_floats(6, n * v, -8.0f, 8.0f);
        z[0] = 1e4f;  // a large logit
        Pair logits(to_bytes(z, dt), dt, Shape{n, v}, device);
        std::vector<int64_t> t(n);
        for (int64_t i = 0; i < n; ++i)
          t[i] = i % 4 == 3 ? ignore : (i * 7) % vocab;
        std::vector<unsigned char> tb(n * 8);
        std::memcpy(tb.data(), t.data(), tb.size());
        Pair targets(tb, DType::kInt64, Shape{n}, device);
        Pair max(DType::kFloat32, Shape{n}, device),
            stats(DType::kFloat32, Shape{2 * n}, device);
        tp::ce_local_max(logits.h, max.h, nullptr);
        tp::ce_local_max(logits.d(), max.d(), nullptr);
        EXPECT_TRUE(same(max, 0)) << "max is exact";
        tp::ce_local_sums(logits.h, targets.h, start, ignore, max.h, stats.h,
                          nullptr);
        tp::ce_local_sums(logits.d(), targets.d(), start, ignore, max.d(),
                          stats.d(), nullptr);
        EXPECT_TRUE(same(stats, 1e-5)) << "sums";
        Pair losses(DType::kFloat32, Shape{n}, device),
            mc(DType::kFloat32, Shape{2}, device);
        tp::ce_finalize(stats.h, targets.h, vocab, ignore, losses.h, mc.h,
                        nullptr);
        tp::ce_finalize(stats.d(), targets.d(), vocab, ignore, losses.d(),
                        mc.d(), nullptr);
        EXPECT_TRUE(same(losses, 1e-5)) << "losses";
        EXPECT_TRUE(same(mc, 1e-5)) << "mean and count";
        Pair grad(dt, Shape{n, v}, device);
        tp::ce_backward(logits.h, targets.h, start, ignore, max.h, stats.h,
                        mc.h, 0.5f, grad.h, nullptr);
        tp::ce_backward(logits.d(), targets.d(), start, ignore, max.d(),
                        stats.d(), mc.d(), 0.5f, grad.d(), nullptr);
        EXPECT_TRUE(same(grad, tolerance(dt))) << "grad";
      }
}

// Column -> Row on CUDA against the same layers on the CPU, on the world's
// mesh (tp_size = world size).
TEST_F(Gpu, LinearLayersOnCudaMatchTheCpuLayers) {
  auto mesh = std::make_shared<ProcessMesh>(world(), world()->size());
  const int p = mesh->tp_size();
  const int64_t rows = 7, h = 64, f = 128;
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    auto w1 = tptest::random_floats(11, f * h, -0.1f, 0.1f),
         w2 = tptest::random_floats(12, h * f, -0.1f, 0.1f);
    auto b1 = tptest::random_floats(13, f), b2 = tptest::random_floats(14, h);
    auto build = [&](Device dev) {
      ColumnParallelLinearOptions co;
      co.gather_output = false;
      co.dtype = dt;
      co.device = dev;
      RowParallelLinearOptions ro;
      ro.input_is_parallel = true;
      ro.dtype = dt;
      ro.device = dev;
      auto fc1 = std::make_unique<ColumnParallelLinear>(mesh, h, f, co);
      auto fc2 = std::make_unique<RowParallelLinear>(mesh, f, h, ro);
      fc1->load_from_full(tptest::view(w1, {f, h}), tptest::view(b1, {f}));
      fc2->load_from_full(tptest::view(w2, {h, f}), tptest::view(b2, {h}));
      return std::make_pair(std::move(fc1), std::move(fc2));
    };
    auto cpu = build(Device::cpu());
    auto gpu = build(Device::cuda(device));
    Pair x(to_bytes(tptest::random_floats(15, rows * h), dt), dt,
           Shape{rows, h}, device);
    Pair dy(to_bytes(tptest::random_floats(16, rows * h), dt), dt,
            Shape{rows, h}, device);
    Pair mid(dt, Shape{rows, f / p}, device), y(dt, Shape{rows, h}, device);
    Pair dmid(dt, Shape{rows, f / p}, device), dx(dt, Shape{rows, h}, device);
    for (int pass = 0; pass < 2; ++pass) {
      const bool on_gpu = pass == 1;
      auto& l = on_gpu ? gpu : cpu;
      auto t = [&](Pair& q) { return on_gpu ? q.d() : q.h; };
      l.first->forward(t(x), t(mid));
      l.second->forward(t(mid), t(y));
      l.second->backward(t(mid), t(dy), t(dmid));
      l.first->backward(t(x), t(dmid), t(dx));
    }
    const double tol = tolerance(dt) * 4;
    EXPECT_TRUE(same(y, tol)) << "output";
    EXPECT_TRUE(same(dx, tol)) << "input grad";
    for (int layer = 0; layer < 2; ++layer) {
      auto pc = layer == 0 ? cpu.first->parameters() : cpu.second->parameters();
      auto pg = layer == 0 ? gpu.first->parameters() : gpu.second->parameters();
      for (size_t i = 0; i < pc.size(); ++i) {
        std::vector<unsigned char> hb(pc[i].grad.nbytes()),
            gb(pg[i].grad.nbytes());
        std::memcpy(hb.data(), pc[i].grad.data(), hb.size());
        tp::copy_to_host(gb.data(), pg[i].grad);
        const auto hv = to_floats(hb, dt), gv = to_floats(gb, dt);
        EXPECT_TRUE(tptest::near(gv, std::vector<double>(hv.begin(), hv.end()),
                                 tol * 4))
            << pc[i].name;
      }
    }
  }
}

TEST_F(Gpu, CrossEntropyLayerOnCudaMatchesTheCpuLayer) {
  auto mesh = std::make_shared<ProcessMesh>(world(), world()->size());
  const int p = mesh->tp_size();
  const int64_t n = 9, vocab = 1000 * p, vl = vocab / p;
  auto z = tptest::random_floats(21, n * vl, -5.0f, 5.0f);
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i == 4 ? -100 : (i * 337) % vocab;
  std::vector<unsigned char> tb(n * 8);
  std::memcpy(tb.data(), t.data(), tb.size());
  Pair logits(to_bytes(z, DType::kFloat32), DType::kFloat32, Shape{n, vl},
              device);
  Pair targets(tb, DType::kInt64, Shape{n}, device);
  Pair losses(DType::kFloat32, Shape{n}, device),
      mean(DType::kFloat32, Shape{1}, device);
  Pair grad(DType::kFloat32, Shape{n, vl}, device);
  VocabParallelCrossEntropy cpu(mesh, vocab), gpu(mesh, vocab);
  cpu.forward(logits.h, targets.h, losses.h, mean.h);
  cpu.backward(logits.h, targets.h, grad.h);
  gpu.forward(logits.d(), targets.d(), losses.d(), mean.d());
  gpu.backward(logits.d(), targets.d(), grad.d());
  EXPECT_TRUE(same(losses, 1e-5));
  EXPECT_TRUE(same(mean, 1e-5));
  EXPECT_TRUE(same(grad, 1e-5));
}

#else

TEST(Gpu, NotBuiltWithCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace tutti
