// The staged device transport on CUDA buffers (label gpu; np 1, 2 and 3,
// ranks may share a GPU: device local_rank() % cuda_device_count()).  Most
// tests build a StagedCommunicator with the CUDA copier over the world's MPI
// communicator themselves, so they exercise the staged path whether or not
// NCCL could serve the ranks:
//  * every op kind x dtype x size on device buffers equals the same op on
//    host buffers through the world's MPI communicator, bit for bit (random
//    floats: the reductions round), and a closed form;
//  * ordering: each input is written on the caller's stream after a 2 ms
//    hold (over a poison) and each result read back on that stream right
//    after wait() (a copy not ordered after the stream, or a stream not
//    made to wait for the result, reads stale bytes); a stream held 300 ms
//    keeps the op from completing, and synchronize() waits for it;
//  * send/recv with tags, an op from a thread that set no device (under
//    TUTTI_CHECK_DEVICE=1);
//  * the ProcessGroup picks the transport mpi_test_main.cc announced
//    (test::gpu_transport(): staged where ranks share a GPU) for the world
//    and its splits;
//  * AMP: one rank's overflow skips the step on every rank, and a clean
//    step's reduced, unscaled CUDA gradients equal the host path's bit for
//    bit where the staged transport serves the group.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "tutti/amp.h"

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>

#include "comm/mpi/mpi_communicator.h"
#include "comm/staged/staged_communicator.h"
#include "core/cuda_utils.h"

namespace tutti {
namespace {

using staged::StagedCommunicator;
using test::Buffer;
using test::rank_value;

void CUDART_CB hold_300ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }
void CUDART_CB hold_2ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }

::testing::AssertionResult same_bits(const Buffer& got, const Buffer& want) {
  if (got.bytes == want.bytes) return ::testing::AssertionSuccess();
  if (got.bytes.size() != want.bytes.size())
    return ::testing::AssertionFailure() << "sizes differ";
  const size_t es = dtype_size(got.dtype);
  for (size_t i = 0; i < got.bytes.size(); i += es)
    if (std::memcmp(&got.bytes[i], &want.bytes[i], es))
      return ::testing::AssertionFailure()
             << dtype_name(got.dtype) << "[" << got.numel() << "] element " << i / es
             << ": device " << got.get(static_cast<int64_t>(i / es)) << ", host "
             << want.get(static_cast<int64_t>(i / es));
  return ::testing::AssertionSuccess();
}

class StagedGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    TUTTI_REQUIRE_GPU();
    dev = local_rank() % cuda_device_count();
    guard_.emplace(dev);  // this thread's device, as the discipline asks
    stream_.reset(new cuda::Stream(dev));
    s = StagedCommunicator::create(
        std::dynamic_pointer_cast<mpi::MpiCommunicator>(w->cpu_communicator()), dev,
        "world-staged-cuda");
  }
  void TearDown() override {
    if (s) s->close();
    buffers_.clear();
    guard_.reset();
  }

  cudaStream_t st() const { return stream_->get(); }
  OpOptions on(const std::string& name = "") const {
    OpOptions o;
    o.name = name;
    o.stream = stream_->get();
    return o;
  }
  // A device tensor that will hold `b` once the caller's stream gets there:
  // it holds a 0xff poison until the stream, after a 2 ms host function,
  // copies `b` in (from a device copy made now).  An op not ordered after
  // the stream reads the poison.
  Tensor upload(const Buffer& b) {
    const size_t bytes = b.bytes.size();
    buffers_.emplace_back(dev, bytes);
    buffers_.emplace_back(dev, bytes);
    void* d = buffers_[buffers_.size() - 2].data();
    void* src = buffers_.back().data();
    if (bytes) {
      TUTTI_CUDA_CHECK(cudaMemcpyAsync(src, b.bytes.data(), bytes, cudaMemcpyHostToDevice, st()));
      TUTTI_CUDA_CHECK(cudaStreamSynchronize(st()));
      TUTTI_CUDA_CHECK(cudaMemsetAsync(d, 0xff, bytes, st()));
      TUTTI_CUDA_CHECK(cudaLaunchHostFunc(st(), hold_2ms, nullptr));
      TUTTI_CUDA_CHECK(cudaMemcpyAsync(d, src, bytes, cudaMemcpyDeviceToDevice, st()));
    }
    return Tensor(bytes ? d : nullptr, b.dtype, Shape{b.numel()}, Device::cuda(dev));
  }
  // Frees the uploads once the stream is idle.
  void recycle() {
    TUTTI_CUDA_CHECK(cudaStreamSynchronize(st()));
    buffers_.clear();
  }
  // Reads `t` back on the stream, right behind whatever the stream waits for.
  Buffer download(const Tensor& t) {
    Buffer b(t.dtype(), t.numel());
    if (!b.bytes.empty())
      TUTTI_CUDA_CHECK(cudaMemcpyAsync(b.bytes.data(), t.data(), b.bytes.size(),
                                       cudaMemcpyDeviceToHost, st()));
    TUTTI_CUDA_CHECK(cudaStreamSynchronize(st()));
    return b;
  }

  ProcessGroupPtr w = world();
  int rank = w->rank();
  int size = w->size();
  int dev = 0;
  std::shared_ptr<StagedCommunicator> s;

 private:
  std::optional<cuda::DeviceGuard> guard_;
  std::unique_ptr<cuda::Stream> stream_;
  std::vector<cuda::DeviceBuffer> buffers_;
};

// Rank-distinct values: random (so that floating sums round) for floating
// types, small integers otherwise.
Buffer values(DType d, int64_t n, int rank, int salt) {
  Buffer b(d, n);
  std::mt19937 rng(static_cast<uint32_t>(1000 * rank + salt));
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  if (dtype_is_floating(d))
    b.fill([&](int64_t) { return u(rng); });
  else
    b.fill([&](int64_t i) { return std::fabs(rank_value(rank, i + salt)); });
  return b;
}

TEST_F(StagedGpu, EveryOpIsTheHostPathBitForBit) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                  DType::kInt32, DType::kUInt8}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, (int64_t{1} << 18) + 3}) {
      SCOPED_TRACE(detail::cat(dtype_name(d), " n=", n));
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                          ReduceOp::kProd}) {
        Buffer in = values(d, n, rank, 1), host_out(d, n), host_in = in;
        Tensor din = upload(in), dout = upload(Buffer(d, n));
        s->allreduce(din, dout, op, on("grad"));
        Buffer got = download(dout);
        w->allreduce(in.tensor(), host_out.tensor(), op);
        EXPECT_TRUE(same_bits(got, host_out)) << reduce_op_name(op) << " out of place";
        EXPECT_TRUE(same_bits(download(din), in)) << "the input was written";
        s->allreduce(din, op, on());
        w->allreduce(host_in.tensor(), op);
        EXPECT_TRUE(same_bits(download(din), host_in)) << reduce_op_name(op) << " in place";
      }
      Buffer b = values(d, n, rank, 2), hb = b;
      Tensor db = upload(b);
      s->broadcast(db, size - 1, on());
      w->broadcast(hb.tensor(), size - 1);
      EXPECT_TRUE(same_bits(download(db), hb)) << "broadcast";

      Buffer g(d, n * size), hg(d, n * size);
      Tensor dg = upload(g);
      s->allgather(db, dg, on());
      w->allgather(hb.tensor(), hg.tensor());
      EXPECT_TRUE(same_bits(download(dg), hg)) << "allgather";
      // In place: this rank's block of the output is the input.
      Buffer inplace = values(d, n * size, rank, 3);
      Tensor dip = upload(inplace);
      s->allgather(dip.slice(rank * n, (rank + 1) * n), dip, on());
      Buffer hip = inplace;
      w->allgather(hip.tensor().slice(rank * n, (rank + 1) * n), hip.tensor());
      EXPECT_TRUE(same_bits(download(dip), hip)) << "allgather in place";

      std::vector<int64_t> counts;
      int64_t total = 0;
      for (int r = 0; r < size; ++r) total += counts.emplace_back((n + r) % 5 + r * (n > 0));
      Buffer v = values(d, counts[static_cast<size_t>(rank)], rank, 4), hv(d, total);
      Tensor dv = upload(Buffer(d, total));
      s->allgatherv(upload(v), dv, counts, on());
      w->allgatherv(v.tensor(), hv.tensor(), counts);
      EXPECT_TRUE(same_bits(download(dv), hv)) << "allgatherv";

      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        Buffer rs = values(d, n * size, rank, 5), hrs(d, n);
        Tensor drs = upload(Buffer(d, n));
        s->reduce_scatter(upload(rs), drs, op, on());
        w->reduce_scatter(rs.tensor(), hrs.tensor(), op);
        EXPECT_TRUE(same_bits(download(drs), hrs)) << "reduce_scatter " << reduce_op_name(op);
      }

      Buffer a = values(d, n * size, rank, 6), ha(d, n * size);
      Tensor da = upload(Buffer(d, n * size));
      s->alltoall(upload(a), da, on());
      w->alltoall(a.tensor(), ha.tensor());
      EXPECT_TRUE(same_bits(download(da), ha)) << "alltoall";
      recycle();
    }
  }
  // A closed form as well (the host path has its own elsewhere).
  Buffer x(DType::kInt32, 1001);
  x.fill([&](int64_t i) { return rank_value(rank, i); });
  Tensor dx = upload(x);
  s->allreduce(dx, ReduceOp::kSum, on());
  EXPECT_TRUE(test::matches(download(dx), [&](int64_t i) {
    double sum = 0;
    for (int r = 0; r < size; ++r) sum += rank_value(r, i);
    return sum;
  }));
}

// A 64 MiB result: the caller's stream must wait for its host-to-device
// copy (Work::wait()), or the read-back on that stream races with it.  Then
// a stream held 300 ms before the op: the op cannot complete before, test()
// says so, synchronize() waits for it.
TEST_F(StagedGpu, TheOpFollowsTheStreamAndTheStreamFollowsTheResult) {
  const int64_t n = int64_t{1} << 24;
  Buffer x(DType::kFloat32, n);
  x.fill([&](int64_t i) { return rank_value(rank, i); });
  Tensor dx = upload(x);
  WorkPtr work = s->allreduce_async(dx, ReduceOp::kSum, on("big"));
  work->wait();
  EXPECT_TRUE(test::matches(download(dx), [&](int64_t i) {
    double sum = 0;
    for (int r = 0; r < size; ++r) sum += rank_value(r, i);
    return sum;
  }));
  EXPECT_TRUE(work->test());

  Buffer y(DType::kFloat32, 1000);
  y.fill([&](int64_t i) { return rank_value(rank, i); });
  Tensor dy = upload(y);
  TUTTI_CUDA_CHECK(cudaLaunchHostFunc(st(), hold_300ms, nullptr));
  WorkPtr held = s->allreduce_async(dy, ReduceOp::kSum, on("held"));
  EXPECT_FALSE(held->test()) << "completed before the caller's stream reached it";
  s->synchronize();
  EXPECT_TRUE(held->test()) << "synchronize() returned before the op completed";
  held->wait();
  EXPECT_TRUE(test::matches(download(dy), [&](int64_t i) {
    double sum = 0;
    for (int r = 0; r < size; ++r) sum += rank_value(r, i);
    return sum;
  }));
}

TEST_F(StagedGpu, SendRecvRingWithTags) {
  if (size < 2) GTEST_SKIP() << "needs two ranks";
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  Buffer a(DType::kFloat32, 100000), b(DType::kInt64, 5);
  a.fill([&](int64_t i) { return rank_value(rank, i); });
  b.fill([&](int64_t i) { return 1000.0 * rank + static_cast<double>(i); });
  Tensor ra = upload(Buffer(DType::kFloat32, 100000)), rb = upload(Buffer(DType::kInt64, 5));
  WorkPtr wb = s->recv_async(rb, prev, 9, on());
  WorkPtr wa = s->recv_async(ra, prev, 4, on());
  WorkPtr sa = s->send_async(upload(a), next, 4, on());
  WorkPtr sb = s->send_async(upload(b), next, 9, on());
  wa->wait();
  while (!wb->test()) {
  }
  wb->wait();  // the stream waits for its copy too
  sa->wait();
  sb->synchronize();
  EXPECT_TRUE(test::matches(download(ra), [&](int64_t i) { return rank_value(prev, i); }));
  EXPECT_TRUE(test::matches(download(rb), [&](int64_t i) {
    return 1000.0 * prev + static_cast<double>(i);
  }));
}

// The engine's and a waiting thread's CUDA calls set the device themselves:
// an op submitted from a thread that never set one works (and under
// TUTTI_CHECK_DEVICE=1 nothing complains).
TEST_F(StagedGpu, AnOpFromAThreadThatSetNoDevice) {
  Buffer x(DType::kFloat64, 777);
  x.fill([&](int64_t i) { return rank_value(rank, i); });
  Tensor dx = upload(x);
  const OpOptions o = on("fresh thread");
  std::exception_ptr error;
  std::thread t([&] {
    try {
      s->allreduce(dx, ReduceOp::kMax, o);
      s->synchronize();
    } catch (...) {
      error = std::current_exception();
    }
  });
  t.join();
  if (error) std::rethrow_exception(error);
  EXPECT_TRUE(test::matches(download(dx), [&](int64_t i) {
    double m = rank_value(0, i);
    for (int r = 1; r < size; ++r) m = std::max(m, rank_value(r, i));
    return m;
  }));
}

// The world's CUDA tensors go where mpi_test_main.cc said they would
// (staged where ranks share a GPU), and a split follows its parent.
TEST_F(StagedGpu, TheGroupTakesTheAnnouncedTransportAndSplitsKeepIt) {
  ASSERT_EQ(w->cuda_communicator(dev)->backend(), test::gpu_transport());
  Buffer x(DType::kFloat32, 10);
  x.fill([&](int64_t) { return 1.0; });
  Tensor dx = upload(x);
  w->allreduce(dx, ReduceOp::kSum, on());
  EXPECT_TRUE(test::matches(download(dx), [&](int64_t) { return static_cast<double>(size); }));
  auto parity = w->split_group(rank % 2, rank, "parity");
  EXPECT_EQ(parity->cuda_communicator(dev)->backend(), test::gpu_transport());
  Tensor dy = upload(x);
  parity->allreduce(dy, ReduceOp::kSum, on());
  EXPECT_TRUE(test::matches(download(dy), [&](int64_t) {
    return static_cast<double>(parity->size());
  }));
  w->synchronize();
}

// One rank's gradient overflows: every rank skips the step and backs off
// alike, on the device as on the host.  Then a clean step: the gradients
// summed over the world's CUDA communicator and unscaled on the device
// equal the host path's bit for bit where the staged transport serves it
// (NCCL sums in its own order).
TEST_F(StagedGpu, OneRanksOverflowIsAgreedAndACleanStepMatchesTheHost) {
  const int64_t n = 4099;
  amp::LossScalerOptions lo;
  lo.init_scale = 1024.0f;
  amp::DynamicLossScaler on_dev(lo), on_host(lo);
  amp::StepCheckOptions dev_check, host_check;
  dev_check.groups = host_check.groups = {w.get()};
  dev_check.stream = st();
  for (int step = 0; step < 2; ++step) {
    Buffer g(DType::kFloat16, n);
    std::mt19937 rng(static_cast<uint32_t>(7 * rank + step));
    std::uniform_real_distribution<double> u(-900.0, 900.0);
    g.fill([&](int64_t) { return u(rng); });
    if (step == 0 && rank == size - 1) g.set(17, INFINITY);
    Tensor dg = upload(g);
    if (step == 0) {  // the local check: only the last rank sees the Inf
      EXPECT_TRUE(on_dev.unscale_and_check({dg}, dev_check)) << "step 0 on the device";
      EXPECT_TRUE(on_host.unscale_and_check({g.tensor()}, host_check)) << "step 0 on the host";
    } else {
      w->allreduce(dg, ReduceOp::kSum, on("grads"));
      w->allreduce(g.tensor(), ReduceOp::kSum);
      EXPECT_FALSE(on_dev.unscale_and_check({dg}, dev_check)) << "step 1 on the device";
      EXPECT_FALSE(on_host.unscale_and_check({g.tensor()}, host_check)) << "step 1 on the host";
      if (test::gpu_transport() == "staged")
        EXPECT_TRUE(same_bits(download(dg), g)) << "the reduced, unscaled gradients";
    }
    const amp::ScaleUpdate du = on_dev.update(), hu = on_host.update();
    EXPECT_EQ(du.skipped, step == 0);
    EXPECT_EQ(hu.skipped, step == 0);
    EXPECT_EQ(du.new_scale, hu.new_scale);
  }
  EXPECT_EQ(on_dev.scale(), 512.0f);
}

}  // namespace
}  // namespace tutti

#else

TEST(StagedGpu, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }

#endif  // TUTTI_WITH_CUDA
