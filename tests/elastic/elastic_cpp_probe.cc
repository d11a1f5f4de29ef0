// A C++ program on tutti::ElasticState / elastic_run (include/tutti/elastic.h)
// for tests/elastic/elastic_cpp_test.py.  State: w (float64[4], replicated)
// and a per-rank counter; step s does w = w / 2 + s (closed form in the
// test) after an all-reduce that checks every rank holds the same w.
// Commits every 3 steps with {"step": s} as metadata.
//
//   elastic_cpp_probe --steps N --out DIR [--kill RANK:STEP [--wipe-memory 1]]
//                     [--notice RANK:STEP] [--n ELEMENTS] [--commit-every K] [--step-ms MS]
// --n: w has that many elements (default 4), all alike, so that with a small
// TUTTI_CKPT_CHUNK_MB every rank writes a chunk of it (tests/elastic/
// memtier_test.py); --commit-every: default 3; --step-ms: a sleep per step.
// Rank 0 rewrites DIR/committed with the step of each commit.
// --kill: that rank _exit(9)s before that step (first attempt only);
// --wipe-memory 1: with --kill, that rank first removes this user's memory
// tier (TUTTI_MEM_DIR/tutti-<uid>), as a host reboot would;
// --notice: that rank raises a stop notice before that step's work (first
// attempt only), so every rank stops at the next commit.
// Writes DIR/events.rank<R> lines "start <restart> <step>", "reset", and
// rank 0 DIR/result.json {"w": [...], "step": N} at the end.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tutti/tutti.h"

using namespace tutti;

namespace {

struct Model : Stateful {
  explicit Model(size_t n) : w(n, 1.0) {}
  std::vector<double> w;
  StateDict state_dict() override { return {{"w", Tensor::of(w), ShardInfo()}}; }
};

bool at(const char* spec, int rank, int64_t step) {
  if (!spec) return false;
  int r = -1;
  long long s = -1;
  return std::sscanf(spec, "%d:%lld", &r, &s) == 2 && r == rank && s == step;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 12;
  std::string out = ".";
  const char* kill = nullptr;
  bool wipe_memory = false;
  const char* notice = nullptr;
  size_t n = 4;
  int64_t every = 3;
  int step_ms = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--out")) out = argv[i + 1];
    if (!std::strcmp(argv[i], "--kill")) kill = argv[i + 1];
    if (!std::strcmp(argv[i], "--wipe-memory")) wipe_memory = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--notice")) notice = argv[i + 1];
    if (!std::strcmp(argv[i], "--n")) n = static_cast<size_t>(std::atoll(argv[i + 1]));
    if (!std::strcmp(argv[i], "--commit-every")) every = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--step-ms")) step_ms = std::atoi(argv[i + 1]);
  }
  init();
  const int rank = tutti::rank();
  const int restart = static_cast<int>(config::get_int("TUTTI_RESTART_COUNT"));
  std::ofstream ev(out + "/events.rank" + std::to_string(rank), std::ios::app);
  Model model(n);
  ElasticState state(world(), {{"model", &model}});
  state.on_reset([&] { ev << "reset" << std::endl; });
  int rc = elastic_run(state, [&](ElasticState& s) {
    ev << "start " << restart << " " << s.step() << std::endl;
    for (int64_t step = s.step() + 1; step <= steps; ++step) {
      if (restart == 0 && at(kill, rank, step)) {
        if (wipe_memory)
          std::filesystem::remove_all(config::get_string("TUTTI_MEM_DIR") + "/tutti-" +
                                      std::to_string(::getuid()));
        _exit(9);
      }
      if (restart == 0 && at(notice, rank, step)) {
        // As a SIGUSR1 from tutti-run would: every rank stops at the next commit.
        ::kill(::getpid(), SIGUSR1);
      }
      std::vector<double> sum(model.w);
      world()->allreduce(Tensor::of(sum), ReduceOp::kSum, {"check"});
      for (size_t i = 0; i < sum.size(); ++i)
        if (sum[i] != model.w[i] * world()->size()) {
          std::fprintf(stderr, "rank %d: w differs between ranks at step %lld\n", rank,
                       static_cast<long long>(step));
          std::exit(3);
        }
      for (double& x : model.w) x = x / 2 + static_cast<double>(step);
      if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
      if (step % every == 0) {
        s.commit(step, "{\"step\": " + std::to_string(step) + "}");
        if (rank == 0) {
          std::ofstream(out + "/committed.tmp") << step << "\n";
          std::rename((out + "/committed.tmp").c_str(), (out + "/committed").c_str());
        }
      }
    }
  });
  if (rank == 0) {
    std::ofstream res(out + "/result.json");
    res << "{\"step\": " << steps << ", \"w\": [";
    char buf[64];
    for (size_t i = 0; i < model.w.size() && i < 4; ++i) {
      std::snprintf(buf, sizeof(buf), "%.17g", model.w[i]);
      res << (i ? ", " : "") << buf;
    }
    bool same = true;  // every element as its own (all start alike)
    for (size_t i = 4; i < model.w.size(); ++i) same = same && model.w[i] == model.w[i % 4];
    res << "], \"all_same\": " << (same ? "true" : "false") << "}\n";
  }
  shutdown();
  return rc;
}
