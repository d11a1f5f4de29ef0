// ProcessMesh's state, shared with the tensor-parallel layers.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "tensor_parallel/memory.h"
#include "tutti/mesh.h"

namespace tutti {

class MeshImpl {
 public:
  ProcessGroupPtr world;
  ProcessGroupPtr tp;
  ProcessGroupPtr dp;
  int tp_size = 1;
  int dp_size = 1;
  int tp_rank = 0;
  int dp_rank = 0;
  bool tp_within_node = true;

  // Scratch for the free region operators (the layers have their own);
  // region_mu serialises them.
  std::mutex region_mu;
  tp::Workspace region_ws;

  void count(CollectiveKind kind, uint64_t bytes);
  CommStats stats() const;
  void reset_stats();

 private:
  enum { kArCalls, kArBytes, kAgCalls, kAgBytes, kRsCalls, kRsBytes, kNum };
  std::atomic<uint64_t> counters_[kNum] = {};
};

}  // namespace tutti
