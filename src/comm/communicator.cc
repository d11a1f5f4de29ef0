// The typed collective API, built on Communicator::submit().
#include "tutti/comm.h"

#include <utility>

namespace tutti {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProd: return "prod";
  }
  return "invalid";
}

const char* collective_kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce: return "allreduce";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kAllgather: return "allgather";
    case CollectiveKind::kAllgatherv: return "allgatherv";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAlltoall: return "alltoall";
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kSend: return "send";
    case CollectiveKind::kRecv: return "recv";
  }
  return "invalid";
}

Work::~Work() = default;
Communicator::~Communicator() = default;

WorkPtr Communicator::run(OpRequest&& request, bool blocking) {
  return submit(request, blocking);
}

namespace {
OpRequest make(CollectiveKind kind, const Tensor& in, const Tensor& out,
               const OpOptions& o) {
  OpRequest r;
  r.kind = kind;
  r.input = in;
  r.output = out;
  r.options = o;
  return r;
}
}  // namespace

WorkPtr Communicator::allreduce_async(const Tensor& input, const Tensor& output,
                                      ReduceOp op, const OpOptions& o) {
  OpRequest r = make(CollectiveKind::kAllreduce, input, output, o);
  r.op = op;
  return run(std::move(r), false);
}

WorkPtr Communicator::allreduce_async(const Tensor& tensor, ReduceOp op,
                                      const OpOptions& o) {
  return allreduce_async(tensor, tensor, op, o);
}

WorkPtr Communicator::broadcast_async(const Tensor& tensor, int root,
                                      const OpOptions& o) {
  OpRequest r = make(CollectiveKind::kBroadcast, tensor, tensor, o);
  r.root = root;
  return run(std::move(r), false);
}

WorkPtr Communicator::allgather_async(const Tensor& input, const Tensor& output,
                                      const OpOptions& o) {
  return run(make(CollectiveKind::kAllgather, input, output, o), false);
}

WorkPtr Communicator::allgatherv_async(const Tensor& input,
                                       const Tensor& output,
                                       const std::vector<int64_t>& counts,
                                       const OpOptions& o) {
  OpRequest r = make(CollectiveKind::kAllgatherv, input, output, o);
  r.counts = counts;
  return run(std::move(r), false);
}

WorkPtr Communicator::reduce_scatter_async(const Tensor& input,
                                           const Tensor& output, ReduceOp op,
                                           const OpOptions& o) {
  OpRequest r = make(CollectiveKind::kReduceScatter, input, output, o);
  r.op = op;
  return run(std::move(r), false);
}

WorkPtr Communicator::alltoall_async(const Tensor& input, const Tensor& output,
                                     const OpOptions& o) {
  return run(make(CollectiveKind::kAlltoall, input, output, o), false);
}

WorkPtr Communicator::barrier_async(const OpOptions& o) {
  return run(make(CollectiveKind::kBarrier, Tensor(), Tensor(), o), false);
}

WorkPtr Communicator::send_async(const Tensor& tensor, int peer, int tag,
                                 const OpOptions& o) {
  OpRequest r = make(CollectiveKind::kSend, tensor, tensor, o);
  r.root = peer;
  r.tag = tag;
  return run(std::move(r), false);
}

WorkPtr Communicator::recv_async(const Tensor& tensor, int peer, int tag,
                                 const OpOptions& o) {
  OpRequest r = make(CollectiveKind::kRecv, tensor, tensor, o);
  r.root = peer;
  r.tag = tag;
  return run(std::move(r), false);
}

// Blocking forms pass blocking=true so an idle communicator may run the
// operation on this thread instead of handing it to the progress thread.
void Communicator::allreduce(const Tensor& tensor, ReduceOp op,
                             const OpOptions& o) {
  allreduce(tensor, tensor, op, o);
}

void Communicator::allreduce(const Tensor& input, const Tensor& output,
                             ReduceOp op, const OpOptions& o) {
  OpRequest r = make(CollectiveKind::kAllreduce, input, output, o);
  r.op = op;
  run(std::move(r), true)->wait();
}

void Communicator::broadcast(const Tensor& tensor, int root,
                             const OpOptions& o) {
  OpRequest r = make(CollectiveKind::kBroadcast, tensor, tensor, o);
  r.root = root;
  run(std::move(r), true)->wait();
}

void Communicator::allgather(const Tensor& input, const Tensor& output,
                             const OpOptions& o) {
  run(make(CollectiveKind::kAllgather, input, output, o), true)->wait();
}

void Communicator::allgatherv(const Tensor& input, const Tensor& output,
                              const std::vector<int64_t>& counts,
                              const OpOptions& o) {
  OpRequest r = make(CollectiveKind::kAllgatherv, input, output, o);
  r.counts = counts;
  run(std::move(r), true)->wait();
}

void Communicator::reduce_scatter(const Tensor& input, const Tensor& output,
                                  ReduceOp op, const OpOptions& o) {
  OpRequest r = make(CollectiveKind::kReduceScatter, input, output, o);
  r.op = op;
  run(std::move(r), true)->wait();
}

void Communicator::alltoall(const Tensor& input, const Tensor& output,
                            const OpOptions& o) {
  run(make(CollectiveKind::kAlltoall, input, output, o), true)->wait();
}

void Communicator::barrier(const OpOptions& o) {
  run(make(CollectiveKind::kBarrier, Tensor(), Tensor(), o), true)->wait();
}

void Communicator::send(const Tensor& tensor, int peer, int tag,
                        const OpOptions& o) {
  OpRequest r = make(CollectiveKind::kSend, tensor, tensor, o);
  r.root = peer;
  r.tag = tag;
  run(std::move(r), true)->wait();
}

void Communicator::recv(const Tensor& tensor, int peer, int tag,
                        const OpOptions& o) {
  OpRequest r = make(CollectiveKind::kRecv, tensor, tensor, o);
  r.root = peer;
  r.tag = tag;
  run(std::move(r), true)->wait();
}

}  // namespace tutti
