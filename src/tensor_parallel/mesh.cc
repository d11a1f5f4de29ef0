#include "tutti/mesh.h"

#include <cstdint>

#include "core/check.h"
#include "tensor_parallel/mesh_impl.h"
#include "tutti/log.h"

namespace tutti {

void MeshImpl::count(CollectiveKind kind, uint64_t bytes) {
  int calls = -1;
  switch (kind) {
    case CollectiveKind::kAllreduce:
      calls = kArCalls;
      break;
    case CollectiveKind::kAllgather:
      calls = kAgCalls;
      break;
    case CollectiveKind::kReduceScatter:
      calls = kRsCalls;
      break;
    default:
      TUTTI_CHECK(false, "uncounted collective ", collective_kind_name(kind));
  }
  counters_[calls].fetch_add(1, std::memory_order_relaxed);
  counters_[calls + 1].fetch_add(bytes, std::memory_order_relaxed);
}

CommStats MeshImpl::stats() const {
  CommStats s;
  s.allreduce_calls = counters_[kArCalls].load();
  s.allreduce_bytes = counters_[kArBytes].load();
  s.allgather_calls = counters_[kAgCalls].load();
  s.allgather_bytes = counters_[kAgBytes].load();
  s.reduce_scatter_calls = counters_[kRsCalls].load();
  s.reduce_scatter_bytes = counters_[kRsBytes].load();
  return s;
}

void MeshImpl::reset_stats() {
  for (auto& c : counters_) c.store(0);
}

ProcessMesh::ProcessMesh(ProcessGroupPtr world, int tp_size)
    : impl_(std::make_unique<MeshImpl>()) {
  TUTTI_ARG_CHECK(world != nullptr,
                  "ProcessMesh needs a world group (got null)");
  const int size = world->size();
  const int rank = world->rank();
  // Agree on tp_size before validating it, so that a rank with a different
  // value fails on every rank instead of leaving the others in a split.
  int64_t agree[2] = {tp_size, -static_cast<int64_t>(tp_size)};
  world->allreduce(Tensor::of(agree, 2), ReduceOp::kMin,
                   OpOptions{"ProcessMesh tp_size agreement"});
  const int64_t lo = agree[0], hi = -agree[1];
  if (lo != hi)
    TUTTI_THROW(kMismatch, "ProcessMesh over group '", world->name(),
                "': ranks passed different tp_size values (between ", lo,
                " and ", hi, "; this rank passed ", tp_size, ")");
  TUTTI_ARG_CHECK(tp_size >= 1 && size % tp_size == 0,
                  "ProcessMesh over group '", world->name(), "' of ", size,
                  " ranks: tp_size ", tp_size,
                  " must be positive and divide the group size (valid: the "
                  "divisors of ",
                  size, ")");
  MeshImpl& m = *impl_;
  m.world = world;
  m.tp_size = tp_size;
  m.dp_size = size / tp_size;
  m.tp_rank = rank % tp_size;
  m.dp_rank = rank / tp_size;
  // TP innermost: consecutive ranks form a TP group.
  m.tp = world->split_group(m.dp_rank, m.tp_rank, "tp");
  m.dp = world->split_group(m.tp_rank, m.dp_rank, "dp");
  TUTTI_CHECK(m.tp && m.dp && m.tp->size() == tp_size &&
                  m.dp->size() == m.dp_size && m.tp->rank() == m.tp_rank &&
                  m.dp->rank() == m.dp_rank,
              "mesh split produced unexpected groups");
  // A node is named by the world rank of its first process; a TP group is
  // within one node when all its members name the same node.
  const int64_t node = world->node_group()->world_rank(0);
  int64_t span[2] = {node, -node};
  m.tp->allreduce(Tensor::of(span, 2), ReduceOp::kMin,
                  OpOptions{"ProcessMesh node check"});
  int32_t within = span[0] == -span[1] ? 1 : 0;
  world->allreduce(Tensor::of(&within, 1), ReduceOp::kMin,
                   OpOptions{"ProcessMesh node agreement"});
  m.tp_within_node = within == 1;
  if (!m.tp_within_node && rank == 0)
    TUTTI_LOG(kWarn)
        << "ProcessMesh " << str()
        << ": a TP group spans more than one node, so every "
           "tensor-parallel layer communicates across the network; "
           "place tp_size ranks per node (or a multiple)";
}

ProcessMesh::~ProcessMesh() = default;

int ProcessMesh::tp_size() const { return impl_->tp_size; }
int ProcessMesh::dp_size() const { return impl_->dp_size; }
int ProcessMesh::tp_rank() const { return impl_->tp_rank; }
int ProcessMesh::dp_rank() const { return impl_->dp_rank; }
const ProcessGroupPtr& ProcessMesh::world() const { return impl_->world; }
const ProcessGroupPtr& ProcessMesh::tp_group() const { return impl_->tp; }
const ProcessGroupPtr& ProcessMesh::dp_group() const { return impl_->dp; }
bool ProcessMesh::tp_within_node() const { return impl_->tp_within_node; }

int ProcessMesh::rank_of(int dp_rank, int tp_rank) const {
  TUTTI_ARG_CHECK(dp_rank >= 0 && dp_rank < impl_->dp_size && tp_rank >= 0 &&
                      tp_rank < impl_->tp_size,
                  "mesh ", str(), " has no position (dp ", dp_rank, ", tp ",
                  tp_rank, ")");
  return dp_rank * impl_->tp_size + tp_rank;
}

std::string ProcessMesh::str() const {
  return detail::cat("TP ", impl_->tp_size, " x DP ", impl_->dp_size);
}

CommStats ProcessMesh::comm_stats() const { return impl_->stats(); }
void ProcessMesh::reset_comm_stats() { impl_->reset_stats(); }

}  // namespace tutti
