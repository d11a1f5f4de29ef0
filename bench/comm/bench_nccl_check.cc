// What the collective agreement check adds to small NCCL all-reduces, as a
// ratio in one run (TUTTI_CHECK_COLLECTIVES=1 against =0, alternated so
// drift hits both alike).  The check overlaps with the op (the fingerprint
// all-reduce is posted over MPI and the NCCL call enqueued at once), so the
// ratio should stay near 1; a host round trip in series would show as
// +(MPI latency) per op.
//
//   mpirun -np 2 build/bench/comm/bench_nccl_check [--iters 2000] [--reps 3]
//
// Needs 2 ranks with one GPU each (exits 77 otherwise).  Two timings per
// size, each the max over ranks of the best of --reps means:
//   sync       allreduce_async + Work::synchronize() per op: the latency a
//              caller that waits for every op sees (GPU and check both done)
//   pipelined  bursts of 32 ops, one synchronize per burst: the issue rate
//              (what the overlapped bucket all-reduces of one step see)
// "wrong" counts elements differing from the closed-form sum after the run.
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tutti/tutti.h"

namespace {

double now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double max_over_ranks(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

constexpr int kBurst = 32;  // ops in flight at once, like a step's buckets

void set_check(bool on) {
  setenv("TUTTI_CHECK_COLLECTIVES", on ? "1" : "0", 1);
  tutti::config::reload();
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 2000, reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--iters") iters = std::max(10, std::atoi(argv[i + 1]));
    if (a == "--reps") reps = std::max(1, std::atoi(argv[i + 1]));
  }
  tutti::init();
  auto w = tutti::world();
  const int rank = w->rank(), size = w->size();
  if (size < 2 || tutti::cuda_device_count() < tutti::local_size()) {
    if (rank == 0)
      std::printf("bench_nccl_check: needs >= 2 ranks with one GPU each (world of %d, "
                  "%d GPU(s) for %d local rank(s)): skipping\n",
                  size, tutti::cuda_device_count(), tutti::local_size());
    tutti::shutdown();
    return 77;
  }
  const int device = tutti::local_rank();
  cudaSetDevice(device);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const std::vector<int64_t> counts = {1, 256, 4096, 65536};  // floats
  const int64_t max_count = counts.back();
  float *in = nullptr, *out = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&in), max_count * sizeof(float));
  cudaMalloc(reinterpret_cast<void**>(&out), max_count * sizeof(float));
  std::vector<float> host(max_count, static_cast<float>(rank + 1));
  cudaMemcpy(in, host.data(), max_count * sizeof(float), cudaMemcpyHostToDevice);
  tutti::OpOptions o;
  o.name = "bench";
  o.stream = stream;

  if (rank == 0) {
    std::printf("# NCCL all-reduce (float32, sum) with and without the agreement check, "
                "%d ranks, %d iters, best of %d\n", size, iters, reps);
    std::printf("%10s %-9s %12s %12s %8s %10s %6s\n", "bytes", "mode", "check=0 us",
                "check=1 us", "ratio", "added us", "wrong");
  }
  double worst_sync = 0, worst_pipe = 0;
  for (int64_t n : counts) {
    tutti::Tensor tin(in, tutti::DType::kFloat32, tutti::Shape{n}, tutti::Device::cuda(device));
    tutti::Tensor tout(out, tutti::DType::kFloat32, tutti::Shape{n},
                       tutti::Device::cuda(device));
    double best[2][2] = {{1e30, 1e30}, {1e30, 1e30}};  // [check][sync, pipelined]
    for (int rep = 0; rep < reps; ++rep) {
      for (int checked = 0; checked < 2; ++checked) {
        set_check(checked == 1);
        for (int i = 0; i < 20; ++i) w->allreduce_async(tin, tout, tutti::ReduceOp::kSum, o)->synchronize();
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        for (int i = 0; i < iters / 4; ++i)
          w->allreduce_async(tin, tout, tutti::ReduceOp::kSum, o)->synchronize();
        best[checked][0] = std::min(best[checked][0], (now() - t0) / (iters / 4));
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = now();
        for (int b = 0; b < iters / kBurst; ++b) {
          tutti::WorkPtr last;
          for (int i = 0; i < kBurst; ++i)
            last = w->allreduce_async(tin, tout, tutti::ReduceOp::kSum, o);
          last->synchronize();
        }
        best[checked][1] =
            std::min(best[checked][1], (now() - t0) / (iters / kBurst * kBurst));
      }
    }
    std::vector<float> back(n);
    cudaStreamSynchronize(stream);
    cudaMemcpy(back.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost);
    const float want = static_cast<float>(size * (size + 1) / 2);
    long long wrong = 0;
    for (float v : back) wrong += v != want;
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    const char* modes[2] = {"sync", "pipelined"};
    for (int m = 0; m < 2; ++m) {
      const double off = max_over_ranks(best[0][m]), on = max_over_ranks(best[1][m]);
      const double ratio = on / off;
      (m == 0 ? worst_sync : worst_pipe) = std::max(m == 0 ? worst_sync : worst_pipe, ratio);
      if (rank == 0)
        std::printf("%10lld %-9s %12.2f %12.2f %8.3f %10.2f %6lld\n",
                    static_cast<long long>(n * 4), modes[m], off * 1e6, on * 1e6, ratio,
                    (on - off) * 1e6, wrong);
    }
  }
  if (rank == 0) {
    std::printf("RATIO nccl_check_sync_worst %.3f (check=1 / check=0 time, small all-reduces)\n",
                worst_sync);
    std::printf("RATIO nccl_check_pipelined_worst %.3f\n", worst_pipe);
  }
  cudaFree(in);
  cudaFree(out);
  cudaStreamDestroy(stream);
  tutti::shutdown();
  return 0;
}
