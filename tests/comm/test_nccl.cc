// NCCL path (label gpu): collectives on CUDA tensors ordered against the
// caller's stream.  One rank per GPU (TUTTI_TEST_NEEDS_NCCL): skipped
// without a device, or when ranks share a GPU (the staged transport would
// serve them: tests/comm/test_staged_gpu.cc tests that one).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "common/test_util.h"

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>

namespace tutti {
namespace {

using test::Buffer;
using test::rank_value;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

// This file tests NCCL's communicator (its stream ordering, its split).
TUTTI_TEST_NEEDS_NCCL();

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    TUTTI_REQUIRE_GPU();
    if (cuda_device_count() < local_size()) GTEST_SKIP() << "fewer GPUs than ranks on this host";
    device = local_rank() % cuda_device_count();
    ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream) cudaStreamDestroy(stream);
    for (void* p : allocations) cudaFree(p);
  }
  // A device copy of `b`, written on `stream` after a long-running copy so
  // that an unordered reader would see stale data.
  Tensor upload(Buffer& b) {
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(b.bytes.size(), 1)), cudaSuccess);
    allocations.push_back(d);
    EXPECT_EQ(cudaMemsetAsync(d, 0xff, b.bytes.size(), stream), cudaSuccess);
    big_busy_copy();
    EXPECT_EQ(cudaMemcpyAsync(d, b.bytes.data(), b.bytes.size(), cudaMemcpyHostToDevice, stream), cudaSuccess);
    return Tensor(b.bytes.empty() ? nullptr : d, b.dtype, Shape{b.numel()}, Device::cuda(device));
  }
  void download(const Tensor& t, Buffer& b) {
    EXPECT_EQ(cudaMemcpyAsync(b.bytes.data(), t.data(), b.bytes.size(), cudaMemcpyDeviceToHost, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  void big_busy_copy() {
    if (!busy) {
      EXPECT_EQ(cudaMalloc(&busy, kBusy), cudaSuccess);
      allocations.push_back(busy);
    }
    EXPECT_EQ(cudaMemsetAsync(busy, 1, kBusy, stream), cudaSuccess);
  }
  OpOptions on_stream(const char* name = "") {
    OpOptions o;
    o.name = name;
    o.stream = stream;
    return o;
  }

  static constexpr size_t kBusy = size_t{256} << 20;
  int device = 0;
  cudaStream_t stream = nullptr;
  void* busy = nullptr;
  std::vector<void*> allocations;
  ProcessGroupPtr w = world();
  int rank = w->rank(), size = w->size();
};

TEST_F(Nccl, AllreduceEveryDTypeOrderedOnTheCallersStream) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                  DType::kInt8, DType::kUInt8, DType::kInt32, DType::kInt64}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1} << 20}) {
      Buffer host(d, n);
      host.fill([&](int64_t i) { return std::max(0.0, rank_value(rank, i)); });
      Tensor t = upload(host);
      w->allreduce(t, ReduceOp::kSum, on_stream("grad"));
      Buffer back(d, n);
      download(t, back);
      EXPECT_TRUE(test::matches(back, [&](int64_t i) {
        double s = 0;
        for (int r = 0; r < size; ++r) s += std::max(0.0, rank_value(r, i));
        return s;
      })) << dtype_name(d) << " n=" << n;
    }
  }
}

TEST_F(Nccl, AsyncWorkSynchronizeAndOtherCollectives) {
  const int64_t n = 1000;
  Buffer host(DType::kFloat32, n);
  host.fill([&](int64_t i) { return rank_value(rank, i); });
  Tensor t = upload(host);
  WorkPtr work = w->broadcast_async(t, size - 1, on_stream());
  work->synchronize();
  EXPECT_TRUE(work->test());
  Buffer back(DType::kFloat32, n);
  download(t, back);
  EXPECT_TRUE(test::matches(back, [&](int64_t i) { return rank_value(size - 1, i); }));

  // allgather
  Buffer gathered(DType::kFloat32, n * size);
  Tensor gout = upload(gathered);
  Tensor gin = upload(host);
  w->allgather(gin, gout, on_stream());
  download(gout, gathered);
  EXPECT_TRUE(test::matches(gathered, [&](int64_t j) { return rank_value(static_cast<int>(j / n), j % n); }));

  // reduce_scatter: input block b holds rank + b
  Buffer rs_in(DType::kFloat32, n * size), rs_out(DType::kFloat32, n);
  rs_in.fill([&](int64_t j) { return rank + static_cast<double>(j / n); });
  Tensor din = upload(rs_in), dout = upload(rs_out);
  w->reduce_scatter(din, dout, ReduceOp::kAvg, on_stream());
  download(dout, rs_out);
  EXPECT_TRUE(test::matches(rs_out, [&](int64_t) { return (size - 1) / 2.0 + rank; }, 1e-6));

  // alltoall and allgatherv
  Buffer a2a(DType::kInt32, 3 * size), a2a_out(DType::kInt32, 3 * size);
  a2a.fill([&](int64_t j) { return 100.0 * rank + static_cast<double>(j / 3); });
  Tensor ain = upload(a2a), aout = upload(a2a_out);
  w->alltoall(ain, aout, on_stream());
  download(aout, a2a_out);
  EXPECT_TRUE(test::matches(a2a_out, [&](int64_t j) { return 100.0 * static_cast<double>(j / 3) + rank; }));
  std::vector<int64_t> counts(size);
  int64_t total = 0;
  for (int r = 0; r < size; ++r) total += counts[r] = r + 1;
  Buffer vin(DType::kInt64, rank + 1), vout(DType::kInt64, total);
  vin.fill([&](int64_t) { return static_cast<double>(rank); });
  Tensor vi = upload(vin), vo = upload(vout);
  w->allgatherv(vi, vo, counts, on_stream());
  download(vo, vout);
  std::vector<double> expect;
  for (int r = 0; r < size; ++r)
    for (int k = 0; k <= r; ++k) expect.push_back(r);
  EXPECT_TRUE(test::matches(vout, [&](int64_t j) { return expect[j]; }));
  w->barrier();
}

void CUDART_CB hold_300ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

// ProcessGroup::synchronize() waits until NCCL work completed on the GPU,
// not only until it was enqueued: the input's stream is held 300 ms (a host
// function) before the all-reduce may start, so an all-reduce merely
// enqueued cannot have completed when synchronize() returns.
TEST_F(Nccl, GroupSynchronizeWaitsForTheGpu) {
  Buffer host(DType::kFloat32, 1000);
  host.fill([&](int64_t i) { return rank_value(rank, i); });
  Tensor t = upload(host);
  CUDA_OK(cudaLaunchHostFunc(stream, hold_300ms, nullptr));
  WorkPtr work = w->allreduce_async(t, ReduceOp::kSum, on_stream());
  w->synchronize();
  EXPECT_TRUE(work->test()) << "ProcessGroup::synchronize() returned before the all-reduce completed";
}

TEST_F(Nccl, SplitUsesNcclSplit) {
  Buffer host(DType::kFloat32, 16);
  host.fill([&](int64_t) { return 1.0; });
  Tensor t = upload(host);
  w->allreduce(t, ReduceOp::kSum, on_stream());  // creates the NCCL communicator
  auto g = w->split_group(rank % 2, rank, "parity-cuda");
  Tensor t2 = upload(host);
  g->allreduce(t2, ReduceOp::kSum, on_stream());
  Buffer back(DType::kFloat32, 16);
  download(t2, back);
  EXPECT_TRUE(test::matches(back, [&](int64_t) { return static_cast<double>(g->size()); }));
  // A mismatch on NCCL aborts the communicator (the check overlaps with
  // the op): nccl_watchdog_probe.cc 'mismatch' tests it in its own job.
}

// Two splits of one parent back to back, then ops on the parent and both
// children: a non-blocking split can leave the parent "in progress" after
// its child is ready, and the next NCCL call on the parent then fails
// ("Attempt to use communicator before the previous operation returned
// ncclSuccess": tutti.ProcessMesh's second split, on an H100, 2026-11-27).
TEST_F(Nccl, SplitsBackToBackThenOpsOnParentAndChildren) {
  Buffer host(DType::kFloat32, 16);
  host.fill([&](int64_t) { return 1.0; });
  Tensor t = upload(host);
  w->allreduce(t, ReduceOp::kSum, on_stream());  // creates the NCCL communicator
  auto a = w->split_group(0, rank, "all-a");
  auto b = w->split_group(rank % 2, rank, "parity-b");
  auto c = w->split_group(0, size - 1 - rank, "all-reversed-c");
  for (const ProcessGroupPtr& g : {w, a, b, c}) {
    Tensor x = upload(host);
    g->allreduce(x, ReduceOp::kSum, on_stream());
    Buffer back(DType::kFloat32, 16);
    download(x, back);
    EXPECT_TRUE(test::matches(back, [&](int64_t) { return static_cast<double>(g->size()); }))
        << g->name();
  }
}

}  // namespace
}  // namespace tutti

#else
TEST(Nccl, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif
