#include "core/runtime_state.h"

#include <atomic>

namespace tutti {
namespace {
std::atomic<int> g_rank{-1};
std::atomic<int> g_size{-1};
}  // namespace

int runtime_world_rank() { return g_rank.load(std::memory_order_relaxed); }
int runtime_world_size() { return g_size.load(std::memory_order_relaxed); }
void set_runtime_world(int rank, int size) {
  g_rank.store(rank);
  g_size.store(size);
}

}  // namespace tutti
