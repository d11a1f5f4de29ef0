#include "comm/nccl/nccl_communicator.h"

#include "core/check.h"

#if TUTTI_WITH_NCCL
#include <nccl.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "comm/mpi/mpi_communicator.h"
#include "comm/op_desc.h"
#include "comm/progress_engine.h"
#include "comm/staged_work.h"
#include "core/cuda_utils.h"
#include "tutti/config.h"
#include "tutti/log.h"
#endif

namespace tutti {
namespace nccl {

#if TUTTI_WITH_NCCL

#define TUTTI_NCCL_CHECK(expr)                                             \
  do {                                                                     \
    ncclResult_t tutti_nr_ = (expr);                                       \
    if (tutti_nr_ != ncclSuccess)                                          \
      TUTTI_THROW(kNccl, #expr, " failed: ", ncclGetErrorString(tutti_nr_), \
                  " (", ncclGetLastError(nullptr), ")");                    \
  } while (0)

namespace {

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat64: return ncclFloat64;
    case DType::kInt8: return ncclInt8;
    case DType::kUInt8: return ncclUint8;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
  }
  TUTTI_THROW(kInternal, "no NCCL type for dtype ", static_cast<int>(d));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProd: return ncclProd;
  }
  TUTTI_THROW(kInternal, "no NCCL op for ", reduce_op_name(op));
}

}  // namespace

// Work of one NCCL operation: started (enqueued) by the engine, completed by
// the GPU.
class CudaWork : public comm::StagedWork {
 public:
  CudaWork(NcclCommunicatorImpl* owner, cudaStream_t user_stream,
           double timeout_s)
      : owner_(owner), user_stream_(user_stream), timeout_s_(timeout_s) {}

  void wait() override;
  void synchronize() override;
  bool test() override;

  cuda::Event ready;  // recorded on the caller's stream at submission
  cuda::Event done;   // recorded on the communication stream

 private:
  NcclCommunicatorImpl* owner_;
  cudaStream_t user_stream_;
  double timeout_s_;
};

class NcclCommunicatorImpl {
 public:
  NcclCommunicatorImpl(std::shared_ptr<mpi::MpiCommunicator> host, int device,
                       std::string name)
      : host(std::move(host)), device(device), name(std::move(name)),
        engine(this->name + "-nccl", true) {
    int lo = 0, hi = 0;
    cuda::DeviceGuard g(device);
    TUTTI_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    stream.reset(new cuda::Stream(device, hi));  // highest priority
    TUTTI_CUDA_CHECK(cudaMalloc(&scratch, 16));
    if (this->host) {
      TUTTI_MPI_CHECK(MPI_Comm_dup(this->host->comm(), &check));
      MPI_Comm_set_errhandler(check, MPI_ERRORS_RETURN);
    }
  }
  ~NcclCommunicatorImpl() { close(); }

  void close() {
    std::lock_guard<std::mutex> lock(close_mu);
    if (closed) return;
    closed = true;
    engine.stop();
    if (comm) {
      if (poisoned)
        ncclCommAbort(comm);
      else
        ncclCommDestroy(comm);
      comm = nullptr;
    }
    if (scratch) {
      cuda::DeviceGuard g(device);
      cudaFree(scratch);
      scratch = nullptr;
    }
    if (check != MPI_COMM_NULL && mpi::is_initialized()) MPI_Comm_free(&check);
    check = MPI_COMM_NULL;
  }

  void abort_after_timeout(const std::string& desc, uint64_t seq,
                           double seconds) {
    poisoned = true;
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
    if (host) host->fail_timeout(comm::OpLabel(desc), seq, seconds, "waiting for NCCL");
    TUTTI_THROW(kTimeout, desc, " did not complete within ", seconds,
                " s (TUTTI_TIMEOUT); the NCCL communicator was aborted");
  }

  void execute(const OpRequest& r, CudaWork& work);
  void enqueue(const OpRequest& r);

  std::shared_ptr<mpi::MpiCommunicator> host;
  int device;
  std::string name;
  int rank = 0;
  int size = 1;
  ncclComm_t comm = nullptr;
  std::unique_ptr<cuda::Stream> stream;
  void* scratch = nullptr;
  MPI_Comm check = MPI_COMM_NULL;
  comm::ProgressEngine engine;
  uint64_t next_seq = 0;      // collectives
  uint64_t next_p2p_seq = 0;  // send/recv, numbered apart (two ranks only)
  std::atomic<bool> poisoned{false};
  bool closed = false;
  std::mutex close_mu;
};

void CudaWork::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  wait_started(lock);
  TUTTI_CUDA_CHECK(cudaStreamWaitEvent(user_stream_, done.get(), 0));
}

bool CudaWork::test() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stage_ == kQueued) return false;
    if (error_) std::rethrow_exception(error_);
  }
  return done.query();
}

void CudaWork::synchronize() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    wait_started(lock);
  }
  mpi::Deadline deadline(timeout_s_);
  for (;;) {
    if (done.query()) return;
    ncclResult_t async = ncclSuccess;
    if (owner_->comm) ncclCommGetAsyncError(owner_->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      TUTTI_THROW(kNccl, desc_, ": NCCL reported ", ncclGetErrorString(async));
    if (deadline.expired())
      owner_->abort_after_timeout(desc_, seq_, timeout_s_);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclCommunicatorImpl::execute(const OpRequest& r, CudaWork& work) {
  const bool p2p =
      r.kind == CollectiveKind::kSend || r.kind == CollectiveKind::kRecv;
  const uint64_t seq = p2p ? ++next_p2p_seq : ++next_seq;
  const comm::OpLabel desc(r, seq, name);
  try {
    if (poisoned || closed || !comm)
      TUTTI_THROW(kAborted, desc, ": NCCL communicator '", name,
                  "' is unusable after an earlier failure");
    std::exception_ptr local_error;
    try {
      comm::validate(r, rank, size, desc);
      if (r.kind != CollectiveKind::kBarrier) {
        TUTTI_ARG_CHECK(r.input.device() == Device::cuda(device) &&
                            r.output.device() == Device::cuda(device),
                        desc, ": this NCCL communicator serves cuda:", device,
                        ", got ", r.input.str(), " -> ", r.output.str());
      }
    } catch (const Error&) {
      local_error = std::current_exception();
    }
    if (host && size > 1 && config::get_bool("TUTTI_CHECK_COLLECTIVES") &&
        r.kind != CollectiveKind::kSend && r.kind != CollectiveKind::kRecv) {
      const double timeout = r.options.timeout_s;
      mpi::MpiCommunicator::check_agreement(
          check, comm::make_wire(r, seq), local_error != nullptr, desc,
          mpi::Deadline(timeout), [&] {
            host->fail_timeout(desc, seq, timeout, "agreeing on the operation");
          });
    }
    if (local_error) std::rethrow_exception(local_error);
    cuda::DeviceGuard g(device);
    TUTTI_CUDA_CHECK(cudaStreamWaitEvent(stream->get(), work.ready.get(), 0));
    enqueue(r);
    work.done.record(stream->get());
    work.started(seq, desc.str());
  } catch (...) {
    work.failed(std::current_exception(), seq, desc.str());
  }
}

void NcclCommunicatorImpl::enqueue(const OpRequest& r) {
  const cudaStream_t s = stream->get();
  const Tensor& in = r.input;
  const Tensor& out = r.output;
  const ncclDataType_t t = nccl_type(in.dtype());
  const size_t es = in.element_size();
  switch (r.kind) {
    case CollectiveKind::kAllreduce:
      TUTTI_NCCL_CHECK(ncclAllReduce(in.data(), out.data(), in.numel(), t,
                                     nccl_op(r.op), comm, s));
      return;
    case CollectiveKind::kBroadcast:
      TUTTI_NCCL_CHECK(ncclBroadcast(in.data(), in.data(), in.numel(), t,
                                     r.root, comm, s));
      return;
    case CollectiveKind::kAllgather:
      TUTTI_NCCL_CHECK(
          ncclAllGather(in.data(), out.data(), in.numel(), t, comm, s));
      return;
    case CollectiveKind::kAllgatherv: {
      // NCCL has no allgatherv: one broadcast per rank, grouped.
      TUTTI_NCCL_CHECK(ncclGroupStart());
      int64_t off = 0;
      for (int i = 0; i < size; ++i) {
        char* dst = static_cast<char*>(out.data()) + off * es;
        const void* src = i == rank ? in.data() : dst;
        TUTTI_NCCL_CHECK(ncclBroadcast(src, dst, r.counts[i], t, i, comm, s));
        off += r.counts[i];
      }
      TUTTI_NCCL_CHECK(ncclGroupEnd());
      return;
    }
    case CollectiveKind::kReduceScatter:
      TUTTI_NCCL_CHECK(ncclReduceScatter(in.data(), out.data(), out.numel(), t,
                                         nccl_op(r.op), comm, s));
      return;
    case CollectiveKind::kAlltoall: {
      const int64_t block = in.numel() / size;
      TUTTI_NCCL_CHECK(ncclGroupStart());
      for (int p = 0; p < size; ++p) {
        TUTTI_NCCL_CHECK(ncclSend(static_cast<const char*>(in.data()) + p * block * es,
                                  block, t, p, comm, s));
        TUTTI_NCCL_CHECK(ncclRecv(static_cast<char*>(out.data()) + p * block * es,
                                  block, t, p, comm, s));
      }
      TUTTI_NCCL_CHECK(ncclGroupEnd());
      return;
    }
    case CollectiveKind::kBarrier:
      TUTTI_NCCL_CHECK(
          ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, comm, s));
      return;
    case CollectiveKind::kSend:
      TUTTI_NCCL_CHECK(ncclSend(in.data(), in.numel(), t, r.root, comm, s));
      return;
    case CollectiveKind::kRecv:
      TUTTI_NCCL_CHECK(ncclRecv(in.data(), in.numel(), t, r.root, comm, s));
      return;
  }
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<NcclCommunicatorImpl> impl)
    : impl_(std::move(impl)) {}
NcclCommunicator::~NcclCommunicator() { close(); }

std::shared_ptr<NcclCommunicator> NcclCommunicator::create(
    std::shared_ptr<mpi::MpiCommunicator> host, int device,
    const std::string& name) {
  auto impl = std::make_unique<NcclCommunicatorImpl>(host, device, name);
  impl->rank = host ? host->rank() : 0;
  impl->size = host ? host->size() : 1;
  ncclUniqueId id;
  if (impl->rank == 0) TUTTI_NCCL_CHECK(ncclGetUniqueId(&id));
  if (host) {
    Tensor t(&id, DType::kUInt8, Shape{static_cast<int64_t>(sizeof(id))});
    OpOptions o;
    o.name = "ncclUniqueId";
    host->broadcast(t, 0, o);
  }
  cuda::DeviceGuard g(device);
  TUTTI_NCCL_CHECK(ncclCommInitRank(&impl->comm, impl->size, id, impl->rank));
  TUTTI_LOG(kInfo) << "NCCL communicator '" << name << "' ready on cuda:"
                   << device << " (" << impl->size << " ranks)";
  return std::shared_ptr<NcclCommunicator>(new NcclCommunicator(std::move(impl)));
}

int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::size() const { return impl_->size; }
std::string NcclCommunicator::name() const { return impl_->name; }
int NcclCommunicator::device() const { return impl_->device; }
void NcclCommunicator::drain() { impl_->engine.drain(); }
void NcclCommunicator::close() { impl_->close(); }

WorkPtr NcclCommunicator::submit(const OpRequest& request, bool blocking) {
  NcclCommunicatorImpl* impl = impl_.get();
  OpRequest r = request;
  if (r.options.timeout_s <= 0)
    r.options.timeout_s = config::get_double("TUTTI_TIMEOUT");
  cuda::DeviceGuard g(impl->device);
  auto work = std::make_shared<CudaWork>(
      impl, static_cast<cudaStream_t>(r.options.stream), r.options.timeout_s);
  // Order the communication after the work already on the caller's stream.
  work->ready.record(static_cast<cudaStream_t>(r.options.stream));
  auto holder = std::make_shared<OpRequest>(std::move(r));
  impl->engine.submit([impl, holder, work] { impl->execute(*holder, *work); },
                      blocking);
  return work;
}

std::shared_ptr<Communicator> NcclCommunicator::split(int, int,
                                                      const std::string&) {
  TUTTI_THROW(kUnsupported,
              "split a ProcessGroup, not its NCCL communicator: the host "
              "communicator must split alongside");
}

std::shared_ptr<NcclCommunicator> NcclCommunicator::split_with(
    int color, int key, std::shared_ptr<mpi::MpiCommunicator> host_child,
    const std::string& name) {
  NcclCommunicatorImpl* parent = impl_.get();
  std::shared_ptr<NcclCommunicator> child;
  std::exception_ptr err;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  // ncclCommSplit is collective over the parent: run it in order with the
  // parent's operations.
  parent->engine.submit(
      [&] {
        try {
          cuda::DeviceGuard g(parent->device);
          ncclComm_t out = nullptr;
          TUTTI_NCCL_CHECK(ncclCommSplit(parent->comm,
                                         color < 0 ? NCCL_SPLIT_NOCOLOR : color,
                                         key, &out, nullptr));
          if (out) {
            auto impl = std::make_unique<NcclCommunicatorImpl>(
                host_child, parent->device, name);
            impl->comm = out;
            ncclCommUserRank(out, &impl->rank);
            ncclCommCount(out, &impl->size);
            child.reset(new NcclCommunicator(std::move(impl)));
          }
        } catch (...) {
          err = std::current_exception();
        }
        std::lock_guard<std::mutex> lock(mu);
        done = true;
        cv.notify_all();
      },
      true);
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (err) std::rethrow_exception(err);
  return child;
}

#else  // !TUTTI_WITH_NCCL

class NcclCommunicatorImpl {};

NcclCommunicator::NcclCommunicator(std::unique_ptr<NcclCommunicatorImpl> impl)
    : impl_(std::move(impl)) {}
NcclCommunicator::~NcclCommunicator() = default;

std::shared_ptr<NcclCommunicator> NcclCommunicator::create(
    std::shared_ptr<mpi::MpiCommunicator>, int device, const std::string&) {
  TUTTI_THROW(kUnsupported, "a tensor on cuda:", device,
              " needs NCCL, but this build of tutti has no CUDA/NCCL support "
              "(rebuild with -DTUTTI_WITH_CUDA=ON)");
}
int NcclCommunicator::rank() const { return 0; }
int NcclCommunicator::size() const { return 1; }
std::string NcclCommunicator::name() const { return ""; }
int NcclCommunicator::device() const { return -1; }
void NcclCommunicator::drain() {}
void NcclCommunicator::close() {}
WorkPtr NcclCommunicator::submit(const OpRequest&, bool) {
  TUTTI_THROW(kUnsupported, "this build of tutti has no NCCL support");
}
std::shared_ptr<Communicator> NcclCommunicator::split(int, int,
                                                      const std::string&) {
  TUTTI_THROW(kUnsupported, "this build of tutti has no NCCL support");
}
std::shared_ptr<NcclCommunicator> NcclCommunicator::split_with(
    int, int, std::shared_ptr<mpi::MpiCommunicator>, const std::string&) {
  TUTTI_THROW(kUnsupported, "this build of tutti has no NCCL support");
}

#endif

}  // namespace nccl
}  // namespace tutti
