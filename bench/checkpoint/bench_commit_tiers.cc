// Elastic commits (tutti::ElasticState::commit) in the memory tier and the
// checkpoint directory (docs/elastic.md, "Commits: the memory tier and the
// directory"), side by side in one run (bench/RESULTS.md):
//
//   TUTTI_JOB_ID=x mpiexec -np P bench_commit_tiers --dir DIR [--mb N] [--commits K]
//
// Every rank holds N MiB (default 64) of a float32 tensor sharded over the
// ranks.  Four setups commit K times each (default 16, after one warm-up
// commit), in this order, each into fresh directories:
//   memory        the memory tier only (no directory)
//   memory+dir/1  the memory tier and DIR, every commit to both
//   memory+dir/8  the memory tier, and every 8th commit to DIR too
//   dir           DIR only (TUTTI_COMMIT_MEMORY=0: what a directory meant before)
// Each figure is the mean over the K commits of the slowest rank's commit()
// (the cost a training loop sees per commit), and the slowest single commit.
// Then restore() loads the last commit back (from the memory tier where it
// holds it), the slowest rank's time: warm, then cold, after the host's page
// cache was dropped (/proc/sys/vm/drop_caches, root; "-" where it cannot be),
// as on a replacement host whose directory is not in its cache.  The memory
// tier (tmpfs) is not affected by the drop.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

#include "tutti/tutti.h"

using namespace tutti;

namespace {

struct Shard : Stateful {
  std::vector<float> data;
  int64_t global = 0, offset = 0;
  StateDict state_dict() override {
    ShardInfo s;
    s.global_shape = {global};
    s.dim = 0;
    s.offset = offset;
    return {{"w", Tensor::of(data), s}};
  }
};

// Collective: the slowest rank's restore() in seconds.
double timed_restore(ElasticState& state) {
  world()->barrier();
  const auto t0 = std::chrono::steady_clock::now();
  state.restore();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  world()->allreduce(Tensor::of(&s, 1), ReduceOp::kMax, {"bench.slowest"});
  return s;
}

// Collective: drops this host's page cache (local rank 0); false on every
// rank when any could not.
bool drop_caches() {
  world()->barrier();
  int64_t failed = 0;
  if (local_rank() == 0) {
    ::sync();
    FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w");
    failed = !f || std::fputs("3\n", f) < 0;
    if (f) failed |= std::fclose(f) != 0;
  }
  world()->allreduce(Tensor::of(&failed, 1), ReduceOp::kMax, {"bench.drop"});
  return failed == 0;
}

struct Setup {
  const char* name;
  bool dir;
  int durable_every;
  int memory;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t mb = 64;
  int commits = 16;
  std::string dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--mb")) mb = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--commits")) commits = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--dir")) dir = argv[i + 1];
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: bench_commit_tiers --dir DIR [--mb N] [--commits K]\n");
    return 2;
  }
  init();
  const int rank = tutti::rank(), size = tutti::size();
  Shard shard;
  const int64_t n = mb * (1 << 20) / 4;
  shard.data.assign(static_cast<size_t>(n), static_cast<float>(rank));
  shard.global = n * size;
  shard.offset = n * rank;
  const Setup setups[] = {{"memory", false, 1, 1},
                          {"memory+dir/1", true, 1, 1},
                          {"memory+dir/8", true, 8, 1},
                          {"dir", true, 1, 0}};
  if (rank == 0)
    std::printf("%d ranks, %lld MiB per rank, %d commits per setup, directory %s\n", size,
                static_cast<long long>(mb), commits, dir.c_str());
  int idx = 0;
  for (const Setup& su : setups) {
    ElasticOptions o;
    if (su.dir) o.ckpt_dir = dir + "/" + std::to_string(idx++);
    o.durable_every = su.durable_every;
    o.memory_tier = su.memory;
    o.keep_last = 2;
    double total = 0, worst = 0, warm = 0, cold = -1;
    {
      ElasticState state(world(), {{"model", &shard}}, o);
      state.commit(1);  // warm-up: directories made, pages touched
      for (int k = 0; k < commits; ++k) {
        world()->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        state.commit(2 + k);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        world()->allreduce(Tensor::of(&s, 1), ReduceOp::kMax, {"bench.slowest"});
        total += s;
        worst = std::max(worst, s);
      }
      warm = timed_restore(state);
      if (drop_caches()) cold = timed_restore(state);
    }
    world()->barrier();
    if (local_rank() == 0) remove_memory_tier();  // the next setup starts empty
    char cold_ms[32] = "-";
    if (cold >= 0) std::snprintf(cold_ms, sizeof cold_ms, "%.1f", 1e3 * cold);
    if (rank == 0)
      std::printf("RESULT setup=%s mean_ms=%.1f max_ms=%.1f restore_ms=%.1f cold_restore_ms=%s\n",
                  su.name, 1e3 * total / commits, 1e3 * worst, 1e3 * warm, cold_ms);
  }
  shutdown();
  return 0;
}
