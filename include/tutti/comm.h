// Communicators: collectives and point-to-point on tensors.
//
// Contract (the same as MPI's and NCCL's):
//  * Collectives on one communicator are issued in the same order on every
//    rank.  tutti numbers them (the sequence number in every message) and, by
//    default, checks before each collective that all ranks agree on the kind,
//    dtype, element count, reduce op and root: a disagreement is an
//    Error(kMismatch) on every rank naming the differing ranks.
//  * Every operation has an async form returning a Work; errors surface from
//    Work::wait().  The blocking forms are async + wait.
//  * An operation that does not complete within TUTTI_TIMEOUT seconds fails
//    with Error(kTimeout) naming the ranks that never arrived.  The
//    communicator is unusable afterwards (kAborted).
//  * With TUTTI_EXIT_ON_COMM_FAILURE=1 (tutti-run sets it), a communicator
//    that breaks because a peer or the network failed ends the process with
//    kCommFailureExitCode instead (docs/errors.md).
//  * Tensors are caller-owned and must stay alive until the Work completes.
//  * Several threads may use one communicator, but the *order* of collectives
//    must still be the same on every rank; the caller orders them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tutti/export.h"
#include "tutti/tensor.h"

namespace tutti {

// Exit status of a process that TUTTI_EXIT_ON_COMM_FAILURE ended after a
// peer or network failure; tutti-run restarts the job from its latest
// checkpoint.  (75 is kPreemptedExitCode.)
constexpr int kCommFailureExitCode = 76;

enum class ReduceOp : uint8_t { kSum = 0, kAvg = 1, kMin = 2, kMax = 3, kProd = 4 };
TUTTI_API const char* reduce_op_name(ReduceOp op);

enum class CollectiveKind : uint8_t {
  kAllreduce = 0,
  kBroadcast = 1,
  kAllgather = 2,
  kAllgatherv = 3,
  kReduceScatter = 4,
  kAlltoall = 5,
  kBarrier = 6,
  kSend = 7,
  kRecv = 8,
};
TUTTI_API const char* collective_kind_name(CollectiveKind kind);

struct OpOptions {
  // Names the tensor in error messages ("layer3.weight", "bucket 2").
  std::string name;
  // CUDA tensors only: the stream that produced the input and will consume
  // the output (a cudaStream_t).  nullptr is the legacy default stream.  The
  // operation runs on the communicator's own stream, ordered after `stream`
  // by an event; Work::wait() makes `stream` wait for the result.
  void* stream = nullptr;
  // Overrides TUTTI_TIMEOUT for this operation (seconds; <= 0: use the
  // setting).
  double timeout_s = 0;
};

// One submitted operation, as backends receive it.
struct OpRequest {
  CollectiveKind kind = CollectiveKind::kBarrier;
  Tensor input;            // the tensor for broadcast/send/recv
  Tensor output;           // == input for in-place operations
  ReduceOp op = ReduceOp::kSum;
  int root = 0;            // broadcast root, or send/recv peer
  int tag = 0;             // send/recv tag
  std::vector<int64_t> counts;  // allgatherv: elements contributed per rank
  OpOptions options;
};

// Handle of an operation in flight.
class TUTTI_API Work {
 public:
  virtual ~Work();
  // CPU: blocks until the operation completed; rethrows its error.
  // CUDA: blocks until the operation is enqueued on the communication
  // stream, then makes OpOptions::stream wait for it (the host does not wait
  // for the GPU, as in torch.distributed).  Errors found later (a timeout,
  // an NCCL error, a mismatch from the overlapped check) abort the NCCL
  // communicator and surface from synchronize(), test() and every later
  // operation on it.
  virtual void wait() = 0;
  // Blocks until the result is in memory (CUDA: the GPU finished it).
  virtual void synchronize() = 0;
  // True once the operation has completed (rethrows its error if it failed).
  virtual bool test() = 0;
  // Sequence number on its communicator (0 for work that never ran).
  virtual uint64_t seq() const = 0;
  // "allreduce #42 'layer3.weight' float32[1024]"
  virtual std::string description() const = 0;
};
using WorkPtr = std::shared_ptr<Work>;

class TUTTI_API Communicator {
 public:
  virtual ~Communicator();

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi", "nccl", "local" or "group" (a ProcessGroup routing by device).
  virtual std::string backend() const = 0;
  // The group's name in messages ("world", "tp", "dp", ...).
  virtual std::string name() const = 0;

  // Submits one operation.  `blocking` says the caller will wait at once, so
  // an idle communicator may run it on the calling thread.  All typed
  // methods below are built on this.
  virtual WorkPtr submit(const OpRequest& request, bool blocking) = 0;

  // Collective: ranks passing the same color form a new communicator,
  // ordered by (key, old rank).  A negative color takes part in the split
  // but receives nullptr.
  virtual std::shared_ptr<Communicator> split(int color, int key,
                                              const std::string& name) = 0;

  // ---- async forms -------------------------------------------------------
  // allreduce: output may equal input (in place).  Avg of integers divides
  // with truncation toward zero.
  WorkPtr allreduce_async(const Tensor& input, const Tensor& output,
                          ReduceOp op = ReduceOp::kSum, const OpOptions& o = {});
  WorkPtr allreduce_async(const Tensor& tensor, ReduceOp op = ReduceOp::kSum,
                          const OpOptions& o = {});
  // broadcast: in place; on `root` the tensor is the source.
  WorkPtr broadcast_async(const Tensor& tensor, int root,
                          const OpOptions& o = {});
  // allgather: output.numel() == size() * input.numel(), rank order.
  WorkPtr allgather_async(const Tensor& input, const Tensor& output,
                          const OpOptions& o = {});
  // allgatherv: rank r contributes counts[r] elements (input.numel() must
  // equal counts[rank()]); output.numel() == sum(counts).  Every rank passes
  // the same counts.
  WorkPtr allgatherv_async(const Tensor& input, const Tensor& output,
                           const std::vector<int64_t>& counts,
                           const OpOptions& o = {});
  // reduce_scatter: input.numel() == size() * output.numel(); rank r gets
  // the reduction of block r.
  WorkPtr reduce_scatter_async(const Tensor& input, const Tensor& output,
                               ReduceOp op = ReduceOp::kSum,
                               const OpOptions& o = {});
  // alltoall: equal blocks; block j of input goes to rank j, block i of
  // output comes from rank i.  input.numel() == output.numel(), divisible by
  // size().
  WorkPtr alltoall_async(const Tensor& input, const Tensor& output,
                         const OpOptions& o = {});
  WorkPtr barrier_async(const OpOptions& o = {});
  WorkPtr send_async(const Tensor& tensor, int peer, int tag = 0,
                     const OpOptions& o = {});
  WorkPtr recv_async(const Tensor& tensor, int peer, int tag = 0,
                     const OpOptions& o = {});

  // ---- blocking forms ----------------------------------------------------
  void allreduce(const Tensor& tensor, ReduceOp op = ReduceOp::kSum,
                 const OpOptions& o = {});
  void allreduce(const Tensor& input, const Tensor& output, ReduceOp op,
                 const OpOptions& o = {});
  void broadcast(const Tensor& tensor, int root, const OpOptions& o = {});
  void allgather(const Tensor& input, const Tensor& output,
                 const OpOptions& o = {});
  void allgatherv(const Tensor& input, const Tensor& output,
                  const std::vector<int64_t>& counts, const OpOptions& o = {});
  void reduce_scatter(const Tensor& input, const Tensor& output,
                      ReduceOp op = ReduceOp::kSum, const OpOptions& o = {});
  void alltoall(const Tensor& input, const Tensor& output,
                const OpOptions& o = {});
  void barrier(const OpOptions& o = {});
  void send(const Tensor& tensor, int peer, int tag = 0,
            const OpOptions& o = {});
  void recv(const Tensor& tensor, int peer, int tag = 0,
            const OpOptions& o = {});

 private:
  WorkPtr run(OpRequest&& request, bool blocking);
};

using CommunicatorPtr = std::shared_ptr<Communicator>;

// Adasum (Maleki et al., MLSys 2021): combines every rank's `tensors` in
// place into the adaptive sum, Horovod's op=Adasum.  Pairs combine as
//   adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b
// in a recursive-doubling tree (vector halving, distance doubling), with the
// dot products taken per tensor.  Collective and blocking; the size must be
// a power of two (Error(kInvalidArgument) naming it otherwise).  float32 and
// float64 (float16/bfloat16 are combined in float32); dot products
// accumulate in float64.  CUDA tensors are staged through host memory,
// ordered on OpOptions::stream.  Ranks must pass the same number of tensors
// with the same element counts and dtype (Error(kMismatch) otherwise).
// docs/communication.md has the details.
TUTTI_API void adasum_allreduce(Communicator& comm, const std::vector<Tensor>& tensors,
                                const OpOptions& options = {});

}  // namespace tutti
