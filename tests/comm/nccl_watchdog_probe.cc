// The NCCL watchdog on a device (label gpu), driven by nccl_watchdog_test.sh
// (and exit_code_test.sh for the exit status).  One rank per GPU; exits 77
// without a device or with fewer GPUs than ranks on this host.
//   held_stream     np 1: the caller's stream is held by a spinning kernel
//                   (stream_hold.h), so an all-reduce ordered after it can
//                   never complete: a hang on the device, as when a peer
//                   never arrives.  The caller only calls Work::wait()
//                   (which never blocks the host), yet the watchdog must
//                   abort the communicator within the op's timeout, the
//                   work must carry kTimeout naming "allreduce #1", later
//                   ops kAborted, and once released the caller's stream
//                   must drain.
//   stopped_peer    np 2: rank 1 stops submitting; rank 0's all-reduce must
//                   fail with kTimeout naming "allreduce #1" and rank 1
//                   as never arrived (asked over the MPI side channel).
//   mismatch        np 2: counts differ; the overlapped check must report
//                   kMismatch naming both ranks' descriptions, and abort.
// A rank that sees what it should prints "PROBE-OK rank R: <what>".
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "comm/nccl/nccl_communicator.h"
#include "stream_hold.h"
#include "tutti/tutti.h"

namespace {

using namespace tutti;
using Clock = std::chrono::steady_clock;

int rank_ = 0;

void ok(const std::string& what) {
  std::printf("PROBE-OK rank %d: %s\n", rank_, what.c_str());
  std::fflush(stdout);
}
void fail(const std::string& what) {
  std::printf("PROBE-FAIL rank %d: %s\n", rank_, what.c_str());
  std::fflush(stdout);
}
bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Runs `f`; checks it raises `code` with every part in its message.
template <typename F>
void expect_error(const char* what, ErrorCode code,
                  std::initializer_list<std::string> parts, F f) {
  try {
    f();
    fail(std::string(what) + ": no error");
  } catch (const Error& e) {
    bool all = e.code() == code;
    for (const auto& p : parts) all = all && has(e.message(), p);
    if (all)
      ok(std::string(what) + ": " + e.message());
    else
      fail(std::string(what) + ": unexpected " + e.what());
  }
}

struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) { cudaMalloc(&p, bytes); }
  ~DeviceBuffer() { cudaFree(p); }
  void* p = nullptr;
};

int run(const std::string& mode) {
  auto w = world();
  rank_ = w->rank();
  if (mode == "absent_peer_bootstrap") {
    // Rank 1 never makes a CUDA call on the group (it is gone, or took
    // another path): rank 0's NCCL bootstrap must end in kTimeout at
    // TUTTI_TIMEOUT (20 s in nccl_watchdog_test.sh), not block in an
    // MPI_Comm_dup.  Only rank 0 needs a GPU.
    if (cuda_device_count() == 0) {
      if (rank_ == 0) std::printf("fewer GPUs than ranks on this host: skipping\n");
      return 77;
    }
    if (rank_ == 1) {
      sleep(40);  // past rank 0's timeout; mpiexec ends the job later
      return 0;
    }
    cudaSetDevice(0);
    expect_error("the absent peer at the NCCL bootstrap", ErrorCode::kTimeout,
                 {"'ncclUniqueId'", "did not complete within 20 s"},
                 [&] { w->cuda_communicator(0); });
    sleep(1);
    return 0;
  }
  if (cuda_device_count() < local_size() || cuda_device_count() == 0) {
    if (rank_ == 0) std::printf("fewer GPUs than ranks on this host: skipping\n");
    return 77;
  }
  const int device = local_rank();
  cudaSetDevice(device);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  auto nccl = std::dynamic_pointer_cast<nccl::NcclCommunicator>(w->cuda_communicator(device));
  const double timeout = 3;
  OpOptions o;
  o.name = "probe";
  o.stream = stream;
  o.timeout_s = timeout;
  DeviceBuffer buf(4096);

  if (mode == "held_stream") {
    Tensor t(buf.p, DType::kFloat32, Shape{256}, Device::cuda(device));
    // Held for at most 60 s: past the 3 s timeout, short of the test's limit.
    tutti_test::StreamHold hold(stream, 60);
    if (hold.error() != cudaSuccess) {
      fail(std::string("the holding kernel did not launch: ") +
           cudaGetErrorString(hold.error()));
      return 1;
    }
    const auto submitted = Clock::now();
    WorkPtr work = w->allreduce_async(t, ReduceOp::kSum, o);
    try {
      work->wait();  // returns at once: only the stream waits
    } catch (const Error& e) {
      std::printf("note rank %d: wait() raised %s\n", rank_, e.what());
    }
    const auto give_up = Clock::now() + std::chrono::seconds(30);
    while (!nccl->broken() && Clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const double after_s =
        std::chrono::duration<double>(Clock::now() - submitted).count();
    if (nccl->broken() && after_s >= timeout - 0.1)
      ok("the watchdog aborted the communicator with nobody synchronising, after " +
         std::to_string(after_s) + " s");
    else if (nccl->broken())
      fail("the communicator was aborted after " + std::to_string(after_s) +
           " s, before the op's 3 s timeout");
    else
      fail("the communicator was not aborted within 30 s");
    expect_error("synchronize", ErrorCode::kTimeout,
                 {"allreduce #1 'probe'", "within 3 s", "was aborted"},
                 [&] { work->synchronize(); });
    expect_error("a later op", ErrorCode::kAborted,
                 {"allreduce #2", "is unusable after an earlier failure", "allreduce #1"},
                 [&] { w->allreduce_async(t, ReduceOp::kSum, o)->wait(); });
    hold.release();
    const cudaError_t drained = cudaStreamSynchronize(stream);
    if (drained == cudaSuccess)
      ok("the caller's stream drained once released");
    else
      fail(std::string("the caller's stream did not drain: ") + cudaGetErrorString(drained));
  } else if (mode == "stopped_peer") {
    Tensor t(buf.p, DType::kFloat32, Shape{1000}, Device::cuda(device));
    if (rank_ == 1) {
      sleep(static_cast<unsigned>(timeout) + 8);  // mpiexec ends the job later
      return 0;
    }
    WorkPtr work = w->allreduce_async(t, ReduceOp::kSum, o);
    expect_error("the stopped peer", ErrorCode::kTimeout,
                 {"allreduce #1 'probe'", "within 3 s", "never arrived: rank 1",
                  "was aborted"},
                 [&] {
                   work->wait();
                   work->synchronize();
                 });
  } else if (mode == "mismatch") {
    Tensor t(buf.p, DType::kFloat32, Shape{rank_ == 1 ? 17 : 16}, Device::cuda(device));
    WorkPtr work = w->allreduce_async(t, ReduceOp::kSum, o);
    expect_error("the mismatch", ErrorCode::kMismatch,
                 {"ranks disagree on the operation", "x17", "x16",
                  "the NCCL communicator was aborted"},
                 [&] { work->synchronize(); });
    expect_error("after the mismatch", ErrorCode::kAborted, {"allreduce #2"},
                 [&] { w->allreduce_async(t, ReduceOp::kSum, o)->synchronize(); });
  } else {
    fail("unknown mode " + mode);
  }
  sleep(1);  // let peers print before the first exit ends the job
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tutti::init();
  const int rc = run(argc > 1 ? argv[1] : "held_stream");
  std::fflush(stdout);
  if (rc == 77) tutti::shutdown();
  return rc;
}
