// The memory tier's commit across hosts with buddy copies against the same
// commit without them, side by side in one run (bench/RESULTS.md;
// docs/checkpoint.md, "Several hosts: buddy copies").
//
//   TUTTI_JOB_ID=x mpiexec <hosts> bench_ckpt_memtier [--mb N] [--reps K]
//
// Every rank holds N MiB (default 64) of a float32 tensor sharded over the
// ranks, so each writes N MiB per commit.  Two CheckpointManagers on the
// memory tier (<tier>/commits-off, <tier>/commits-buddy), one made with
// TUTTI_MEM_BUDDY_EVERY=0 and one with 1, commit alternately K times each
// (after one warm-up commit each); each figure is the median over the
// repetitions of the slowest rank's save().  Beside them, in the same run:
// the same bytes sent once round the ring of ranks with tutti's MPI
// point-to-point, the copy's floor on this network.  On one host both are the same
// (no copies): run it on several (tests/elastic/memtier_agent.sh's fake
// hosts, or the netns rig).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/file_util.h"
#include "tutti/tutti.h"

using namespace tutti;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::unique_ptr<CheckpointManager> manager(const std::string& dir, const char* every) {
  ::setenv("TUTTI_MEM_BUDDY_EVERY", every, 1);
  config::reload();
  CheckpointOptions o;
  o.dir = dir;
  o.keep_last = 1;
  o.async = false;
  return std::make_unique<CheckpointManager>(world(), o);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mb = 64;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--mb")) mb = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  init();
  const int rank = tutti::rank(), size = tutti::size();
  const MemoryTier tier = open_memory_tier();
  const int64_t n = mb * (1 << 20) / 4;
  std::vector<float> mine(static_cast<size_t>(n), static_cast<float>(rank));
  ShardInfo shard;
  shard.global_shape = {n * size};
  shard.dim = 0;
  shard.offset = n * rank;
  StateDict state = {{"w", Tensor::of(mine), shard}};
  if (local_rank() == 0)  // an earlier run's commits (it was killed)
    for (const char* d : {"/commits-off", "/commits-buddy"}) ckpt::remove_tree(tier.dir + d);
  world()->barrier();
  auto off = manager(tier.dir + "/commits-off", "0");
  auto buddy = manager(tier.dir + "/commits-buddy", "1");
  std::vector<double> t_off, t_buddy;
  auto timed = [&](CheckpointManager& m, int64_t step) {
    world()->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    m.save(step, state);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    world()->allreduce(Tensor::of(&s, 1), ReduceOp::kMax, {"bench.max"});
    return s;
  };
  // The copy's floor: the same bytes sent once round the ring of ranks
  // (each to the next, from the previous) with tutti's MPI point-to-point.
  std::vector<float> in(mine.size());
  std::vector<double> t_ring;
  auto ring = [&] {
    world()->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    auto s = world()->send_async(Tensor::of(mine), (rank + 1) % size, 7);
    world()->recv(Tensor::of(in), (rank + size - 1) % size, 7);
    s->wait();
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    world()->allreduce(Tensor::of(&t, 1), ReduceOp::kMax, {"bench.max"});
    return t;
  };
  timed(*off, 0);
  timed(*buddy, 0);
  ring();
  for (int r = 1; r <= reps; ++r) {
    t_off.push_back(timed(*off, r));
    t_buddy.push_back(timed(*buddy, r));
    t_ring.push_back(ring());
  }
  if (rank == 0) {
    const double a = median(t_off), b = median(t_buddy);
    std::printf("memory-tier commit, %lld MiB per rank, %d ranks on %d host(s), median of %d: "
                "without buddy copies %.1f ms, with %.1f ms (%.2fx, +%.1f ms)\n",
                static_cast<long long>(mb), size, size / local_size(), reps, a * 1e3, b * 1e3,
                b / a, (b - a) * 1e3);
    std::printf("  the same bytes once round the ring of ranks (MPI send/recv, no files): "
                "%.1f ms\n", median(t_ring) * 1e3);
  }
  off.reset();
  buddy.reset();
  world()->barrier();
  if (local_rank() == 0) remove_memory_tier();
  shutdown();
  return 0;
}
