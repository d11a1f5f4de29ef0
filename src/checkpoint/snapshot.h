// The in-memory copy of a rank's state that an async save persists.
//
// describe_state() validates the state; take_snapshot() lays the pieces
// this rank writes (election.h: whole tensors, or element ranges of them)
// out back to back in one pooled host buffer in exactly the order and
// layout of the shard's data region, and copies them: host tensors by
// memcpy, CUDA tensors by cudaMemcpyAsync into pinned memory on a copy
// stream ordered after the caller's stream (which in turn waits for the
// copies, so the caller may overwrite the state without a host
// synchronisation).  The writer thread calls SnapshotCopier::wait() before
// reading the buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/election.h"
#include "checkpoint/shard_geometry.h"
#include "core/host_buffer.h"
#include "tutti/state.h"

namespace tutti {
namespace ckpt {

struct SnapshotTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  Placement placement;
  std::string group;
  uint64_t offset = 0;  // into the buffer == into the shard's data region
  uint64_t bytes = 0;
};

// The data starts kSnapshotAlign-aligned inside the pooled buffer, so the
// shard writer can hand it to O_DIRECT writes.
constexpr size_t kSnapshotAlign = 4096;

struct Snapshot {
  std::vector<SnapshotTensor> tensors;
  HostBuffer buffer;
  size_t pad = 0;  // bytes skipped at the start of `buffer` for alignment
  uint64_t total = 0;
  const unsigned char* data() const { return buffer.as<const unsigned char>() + pad; }
};

// Copies tensors into host memory; owns the CUDA streams and events.
class SnapshotCopier {
 public:
  // user_stream: the cudaStream_t producing the state (nullptr: legacy).
  explicit SnapshotCopier(void* user_stream);
  ~SnapshotCopier();
  SnapshotCopier(const SnapshotCopier&) = delete;
  SnapshotCopier& operator=(const SnapshotCopier&) = delete;
  // Host tensors are copied at once; CUDA tensors are enqueued.
  void copy(const Tensor& src, void* dst);
  // Ends a snapshot: the user stream waits for the enqueued copies.
  void finish();
  // Blocks until every enqueued copy has landed in host memory.
  void wait();

 private:
  struct Cuda;
  std::unique_ptr<Cuda> cuda_;
  void* user_stream_;
};

// Flattens components into one StateDict ("<component>/<name>").
StateDict flatten_components(const std::vector<std::pair<std::string, Stateful*>>& components);

// Validates `state` (unique, valid names; memory; consistent ShardInfo; a
// CUDA build for CUDA tensors) and returns each tensor's placement.  Errors
// are kInvalidArgument (kUnsupported for CUDA without CUDA) naming the step
// and the tensor.
std::vector<Placement> describe_state(const StateDict& state, int64_t step);

// Copies the `items` of `state` (every tensor whole: write_everything()).
Snapshot take_snapshot(const StateDict& state, const std::vector<WriteItem>& items,
                       HostBufferPool& pool, SnapshotCopier& copier);
std::vector<WriteItem> write_everything(const StateDict& state,
                                        const std::vector<Placement>& placements);

}  // namespace ckpt
}  // namespace tutti
