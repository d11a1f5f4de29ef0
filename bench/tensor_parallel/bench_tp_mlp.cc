// Tensor-parallel MLP block (ColumnParallelLinear H->F, then
// RowParallelLinear F->H, Megatron's layout) forward + backward time, and the
// bytes the layers pass to TP collectives against the analytic count.
//
//   mpirun -np 2 build/bench/tensor_parallel/bench_tp_mlp [--hidden 512]
//          [--ffn 2048] [--rows 16,128,512] [--iters 10] [--sp 0|1]
//          [--device cpu|cuda]
//
// One mesh with tp_size = the world size (run with -np 1 for the dense
// peer: the same layers at TP 1 on one rank).  Columns:
//   time     forward + backward of both layers, ms (max over ranks of the
//            per-rank mean after a warm-up)
//   GFLOP/s  12 rows H F / time: three GEMMs (forward, input grad, weight
//            grad) of 2 rows H F flops per layer, over the whole TP group
//   counted  bytes passed to TP collectives per step (ProcessMesh::comm_stats)
//   analytic 2 rows H e without sequence parallelism (the row layer's
//            forward all-reduce of Y and the column layer's backward
//            all-reduce of dX), 5 rows H e with it (forward all-gather and
//            reduce-scatter; backward all-gather of dY, all-gather of X again,
//            reduce-scatter of dX); e = element size; 0 at TP 1
//   wire     bytes each rank sends in ring algorithms: 2 (p-1)/p of an
//            all-reduce's buffer, (p-1)/p of an all-gather's or
//            reduce-scatter's
//   maxdiff  largest |TP - dense| of the output over |dense|, the dense
//            output computed on every rank with TP-1 layers over a one-rank
//            group (a correctness check, like nccl-tests' "wrong")
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/cuda_utils.h"
#include "tensor_parallel/memory.h"
#include "tutti/tensor_parallel.h"
#include "tutti/tutti.h"

namespace {

using namespace tutti;

double now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoll(item));
  return v;
}

struct Mlp {
  std::unique_ptr<ColumnParallelLinear> fc1;
  std::unique_ptr<RowParallelLinear> fc2;
  Mlp(const ProcessMeshPtr& mesh, int64_t h, int64_t f, bool sp, Device dev) {
    ColumnParallelLinearOptions co;
    co.name = "fc1";
    co.gather_output = false;
    co.sequence_parallel = sp;
    co.device = dev;
    RowParallelLinearOptions ro;
    ro.name = "fc2";
    ro.input_is_parallel = true;
    ro.sequence_parallel = sp;
    ro.device = dev;
    fc1 = std::make_unique<ColumnParallelLinear>(mesh, h, f, co);
    fc2 = std::make_unique<RowParallelLinear>(mesh, f, h, ro);
    fc1->init_from_seed(1);
    fc2->init_from_seed(2);
  }
};

// Activation buffers for one configuration, on `dev`.
struct Acts {
  tp::OwnedTensor x, mid, y, dy, dmid, dx;
  Acts(int64_t rows_in, int64_t rows, int64_t h, int64_t f_local, Device dev)
      : x(DType::kFloat32, Shape{rows_in, h}, dev),
        mid(DType::kFloat32, Shape{rows, f_local}, dev),
        y(DType::kFloat32, Shape{rows_in, h}, dev),
        dy(DType::kFloat32, Shape{rows_in, h}, dev),
        dmid(DType::kFloat32, Shape{rows, f_local}, dev),
        dx(DType::kFloat32, Shape{rows_in, h}, dev) {}
  void step(Mlp& m) {
    m.fc1->forward(x.tensor(), mid.tensor());
    m.fc2->forward(mid.tensor(), y.tensor());
    m.fc2->backward(mid.tensor(), dy.tensor(), dmid.tensor());
    m.fc1->backward(x.tensor(), dmid.tensor(), dx.tensor());
  }
};

// Global data row g, column c (the same on every rank).
float data(int64_t g, int64_t c, int salt) {
  return static_cast<float>(((g * 131 + c * 31 + salt * 17) % 97) / 97.0 - 0.5);
}

// CUDA work is asynchronous: wait for it before reading the clock.
void sync(Device dev) {
#if TUTTI_WITH_CUDA
  if (dev.is_cuda()) TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

void fill_rows(const Tensor& t, int64_t first_row, int salt) {
  const int64_t cols = t.shape()[1];
  std::vector<float> v(t.numel());
  for (int64_t r = 0; r < t.shape()[0]; ++r)
    for (int64_t c = 0; c < cols; ++c)
      v[r * cols + c] = data(first_row + r, c, salt);
  tp::copy_from_host(t, v.data());
}

}  // namespace

int main(int argc, char** argv) {
  int64_t h = 512, f = 2048;
  std::vector<int64_t> rows_list{16, 128, 512};
  int iters = 10;
  bool sp = false;
  std::string device = "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--hidden")
      h = std::stoll(v);
    else if (a == "--ffn")
      f = std::stoll(v);
    else if (a == "--rows")
      rows_list = parse_list(v);
    else if (a == "--iters")
      iters = std::stoi(v);
    else if (a == "--sp")
      sp = v == "1";
    else if (a == "--device")
      device = v;
  }
  tutti::init();
  auto world = tutti::world();
  const int rank = world->rank(), p = world->size();
  const Device dev =
      device == "cuda" ? Device::cuda(local_rank()) : Device::cpu();
  auto mesh = std::make_shared<ProcessMesh>(world, p);
  auto self =
      std::make_shared<ProcessMesh>(world->split_group(rank, 0, "self"), 1);
  Mlp tp_mlp(mesh, h, f, sp, dev), dense(self, h, f, false, dev);
  if (rank == 0) {
    std::printf(
        "# tensor-parallel MLP H=%lld F=%lld, %s, sequence_parallel=%d, "
        "%d iters, float32 on %s\n",
        static_cast<long long>(h), static_cast<long long>(f),
        mesh->str().c_str(), sp ? 1 : 0, iters, dev.str().c_str());
    std::printf("%8s %10s %9s %12s %12s %12s %10s\n", "rows", "time_ms",
                "GFLOP/s", "counted_B", "analytic_B", "wire_B/rank", "maxdiff");
  }
  for (int64_t rows : rows_list) {
    if (sp && rows % p != 0) continue;
    const int64_t rows_in = sp ? rows / p : rows;
    Acts a(rows_in, rows, h, f / p, dev);
    const int64_t first = sp ? rank * rows_in : 0;
    fill_rows(a.x.tensor(), first, 0);
    fill_rows(a.dy.tensor(), first, 1);
    for (int i = 0; i < 2; ++i) a.step(tp_mlp);  // warm-up (scratch grows)
    sync(dev);
    mesh->reset_comm_stats();
    world->barrier();
    const double t0 = now();
    for (int i = 0; i < iters; ++i) a.step(tp_mlp);
    sync(dev);
    double t = (now() - t0) / iters;
    world->allreduce(Tensor::of(&t, 1), ReduceOp::kMax);
    const uint64_t counted = mesh->comm_stats().bytes() / iters;
    const uint64_t act = static_cast<uint64_t>(rows) * h * sizeof(float);
    const uint64_t analytic = p == 1 ? 0 : (sp ? 5 : 2) * act;
    const double wire = p == 1 ? 0 : (sp ? 5.0 : 4.0) * (p - 1) / p * act;
    // Correctness: the dense output for the rows this rank holds.
    Acts d(rows, rows, h, f, dev);
    fill_rows(d.x.tensor(), 0, 0);
    dense.fc1->forward(d.x.tensor(), d.mid.tensor());
    dense.fc2->forward(d.mid.tensor(), d.y.tensor());
    std::vector<float> got(a.y.tensor().numel()), want(d.y.tensor().numel());
    tp::copy_to_host(got.data(), a.y.tensor());
    tp::copy_to_host(want.data(), d.y.tensor());
    double maxdiff = 0, scale = 1e-30;
    for (size_t i = 0; i < got.size(); ++i) {
      const double w = want[first * h + i];
      maxdiff = std::max(maxdiff, std::fabs(got[i] - w));
      scale = std::max(scale, std::fabs(w));
    }
    maxdiff /= scale;
    world->allreduce(Tensor::of(&maxdiff, 1), ReduceOp::kMax);
    if (rank == 0)
      std::printf("%8lld %10.3f %9.2f %12llu %12llu %12.0f %10.2e%s\n",
                  static_cast<long long>(rows), t * 1e3,
                  12.0 * rows * h * f / t / 1e9,
                  static_cast<unsigned long long>(counted),
                  static_cast<unsigned long long>(analytic), wire, maxdiff,
                  counted == analytic ? "" : "  COUNT MISMATCH");
  }
  tutti::shutdown();
  return 0;
}
