// In-process recovery from killed ranks (ULFM; include/tutti/recovery.h) for
// tests/elastic/ulfm_test.py, under Open MPI 5's `mpiexec --with-ft ulfm`.
// Exits 77 where recovery is not available (an MPI without ULFM, or fault
// tolerance off).  Survivors write DIR/result.rank<R> (R: the rank at start).
//
//   ulfm_probe allreduce DIR KILLS   a loop of all-reduces; KILLS lists
//       "RANK:ITER" (ranks numbered at start): that rank SIGKILLs itself at
//       that iteration.  Each survivor checks that its op fails with
//       kRanksLost naming the dead world rank, recover()s, checks the new
//       world (size, order, an all-reduce's closed form, old groups refused)
//       and goes on to the next kill.
//   ulfm_probe idle DIR ""   init and shutdown only (a finalize check).
//   ulfm_probe elastic DIR KILLS STEPS   elastic_run over the memory tier, a
//       commit every step; the killed rank dies after the step's first
//       all-reduce (mid-step).  State: w (float64[4], replicated), step s does
//       w = w / 2 + s * size(); v (float64[12], sharded in equal slices),
//       v[i] += s * (i + 1).  Rank 0 at the end writes the state and the
//       size at every step.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tutti/tutti.h"
#include "ulfm_probe_util.h"

using namespace tutti;
using namespace ulfm_probe;

namespace {

// --- allreduce -------------------------------------------------------------

int run_allreduce(const std::string& dir, const std::vector<Kill>& kills, std::ofstream& res) {
  const int start_rank = rank();
  // Original ranks of the current world's members (in order).
  std::vector<int> members;
  for (int r = 0; r < size(); ++r) members.push_back(r);
  size_t next_kill = 0;
  for (int64_t it = 0; it < 200; ++it) {
    if (next_kill < kills.size() && kills[next_kill].at == it &&
        kills[next_kill].rank == start_rank)
      die(dir, start_rank);
    ProcessGroupPtr w = world();
    double v = static_cast<double>(start_rank + 1);
    try {
      w->allreduce(Tensor::of(&v, 1), ReduceOp::kSum, {"loop"});
      double want = 0;
      for (int m : members) want += m + 1;
      EXPECT(v == want, "iteration ", it, ": sum ", v, " expected ", want);
      continue;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kRanksLost) throw;
      EXPECT(next_kill < kills.size(), "unexpected kRanksLost: ", e.what());
      const Kill k = kills[next_kill];
      const double detected = wall_now() - killed_at(dir, k.rank);
      // The dead rank's number in the world that lost it.
      int dead_world_rank = -1;
      for (size_t i = 0; i < members.size(); ++i)
        if (members[i] == k.rank) dead_world_rank = static_cast<int>(i);
      const std::string named = "world rank " + std::to_string(dead_world_rank) + " died";
      EXPECT(std::string(e.what()).find(named) != std::string::npos, "message '", e.what(),
             "' does not name '", named, "'");
      EXPECT(it == k.at || it == k.at + 1, "the loss surfaced at iteration ", it, " (killed at ",
             k.at, ")");
      RecoveryResult r = recover();
      EXPECT(r.lost == std::vector<int>{dead_world_rank}, "recover() lost ", r.lost.size(),
             " ranks, the first ", r.lost.empty() ? -1 : r.lost[0]);
      EXPECT(r.old_size == static_cast<int>(members.size()), "old size ", r.old_size);
      members.erase(members.begin() + dead_world_rank);
      EXPECT(r.new_size == static_cast<int>(members.size()) && size() == r.new_size,
             "new size ", r.new_size, " / ", size());
      EXPECT(members[rank()] == start_rank, "rank ", rank(), " is start rank ",
             members[rank()], " not ", start_rank);
      EXPECT(local_size() == size(), "local_size ", local_size(), " on one host");
      // The old world refuses, the new one sums the survivors' start ranks.
      bool refused = false;
      try {
        double x = 1;
        w->allreduce(Tensor::of(&x, 1), ReduceOp::kSum);
      } catch (const Error& old) {
        refused = old.code() == ErrorCode::kAborted;
      }
      EXPECT(refused, "an op on the old world was not refused with kAborted");
      double sum = start_rank;
      world()->allreduce(Tensor::of(&sum, 1), ReduceOp::kSum, {"after"});
      double want = 0;
      for (int m : members) want += m;
      EXPECT(sum == want, "after recovery the sum of start ranks is ", sum, " expected ", want);
      auto half = world()->split_group(rank() % 2, rank(), "half");
      double one = 1;
      half->allreduce(Tensor::of(&one, 1), ReduceOp::kSum);
      EXPECT(one == half->size(), "a split of the new world sums ", one);
      res << "recovered lost=" << k.rank << " iteration=" << it << " detect_s=" << detected
          << " recover_s=" << r.seconds << " size=" << r.new_size << std::endl;
      ++next_kill;
    }
  }
  EXPECT(next_kill == kills.size(), "only ", next_kill, " of ", kills.size(), " losses seen");
  return 0;
}

// --- elastic ---------------------------------------------------------------

constexpr int64_t kLen = SlicedState::kLen;

struct Model : SlicedState {
  Model() : SlicedState(1.0) {}
};

int run_elastic(const std::string& dir, const std::vector<Kill>& kills, int64_t steps,
                std::ofstream& res) {
  const int start_rank = rank();
  Model model;
  model.shard();
  ElasticState state(world(), {{"model", &model}});
  int resets = 0;
  state.on_reset([&] {  // before the load, over the new world: re-slice v
    ++resets;
    model.shard();
  });
  std::vector<int> sizes(static_cast<size_t>(steps + 1), 0);  // size at each step
  int64_t calls = 0;
  int64_t redone = 0;
  int64_t high = 0;  // the highest step this rank started
  const int rc = elastic_run(state, [&](ElasticState& s) {
    ++calls;
    if (calls > 1) res << "resumed step=" << s.step() << " size=" << size() << std::endl;
    for (int64_t step = s.step() + 1; step <= steps; ++step) {
      if (step <= high) ++redone;
      high = std::max(high, step);
      std::vector<double> sum(model.w);
      world()->allreduce(Tensor::of(sum), ReduceOp::kSum, {"check"});
      for (size_t i = 0; i < sum.size(); ++i)
        EXPECT(sum[i] == model.w[i] * size(), "w differs between ranks at step ", step);
      for (const Kill& k : kills)
        if (k.rank == start_rank && k.at == step) die(dir, start_rank);
      sizes[static_cast<size_t>(step)] = size();
      for (double& x : model.w) x = x / 2 + static_cast<double>(step * size());
      for (size_t i = 0; i < model.v.size(); ++i)
        model.v[i] += static_cast<double>(step) * static_cast<double>(model.offset + i + 1);
      // Every step's size must be in the commit: the reference replays it.
      s.commit(step, "{\"step\": " + std::to_string(step) + "}");
    }
  });
  // The full v, gathered, and the sizes the steps ran at (committed steps
  // only matter: a step redone after a loss ran again at the new size).
  std::vector<double> full(kLen, 0.0);
  for (size_t i = 0; i < model.v.size(); ++i) full[model.offset + i] = model.v[i];
  world()->allreduce(Tensor::of(full), ReduceOp::kSum, {"gather v"});
  res << "calls=" << calls << " resets=" << resets << " redone=" << redone
      << " final_size=" << size() << " pid=" << getpid() << "\n";
  if (rank() == 0) {
    std::ofstream out(dir + "/state.json");
    char buf[64];
    out << "{\"w\": [";
    for (size_t i = 0; i < model.w.size(); ++i) {
      std::snprintf(buf, sizeof(buf), "%.17g", model.w[i]);
      out << (i ? ", " : "") << buf;
    }
    out << "], \"v\": [";
    for (size_t i = 0; i < full.size(); ++i) {
      std::snprintf(buf, sizeof(buf), "%.17g", full[i]);
      out << (i ? ", " : "") << buf;
    }
    out << "], \"sizes\": [";
    for (size_t i = 1; i < sizes.size(); ++i) out << (i > 1 ? ", " : "") << sizes[i];
    out << "]}\n";
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: ulfm_probe allreduce|elastic DIR KILLS [STEPS]\n");
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  const std::vector<Kill> kills = parse_kills(argv[3]);
  return probe_main("ulfm_probe", dir, [&](std::ofstream& res) {
    if (mode == "idle") return 0;  // init and shutdown only
    if (mode == "allreduce") {
      RecoveryScope scope;
      return run_allreduce(dir, kills, res);
    }
    return run_elastic(dir, kills, argc > 4 ? std::atoll(argv[4]) : 8, res);
  });
}
