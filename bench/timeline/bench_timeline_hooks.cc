// The cost of one timeline hook, load-independent enough to bound the
// overhead on any job: ns per hook with no timeline recording (the one
// relaxed load), ns to record one event (the calling thread), and ns to
// format and write one event (the background writer, timed through
// stop()'s final flush).  bench/RESULTS.md turns them into the overhead on
// the demo with the demo's events per step.
//
//   bench_timeline_hooks [events_per_batch=10000] [batches=20]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <unistd.h>

#include "core/timeline.h"

namespace tl = tutti::timeline;
using Clock = std::chrono::steady_clock;

static double ns_since(Clock::time_point t0, long n) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n;
}

// A hook like the collectives': a complete event with a few args.
static void hook(long i) {
  TUTTI_TIMELINE(complete(tl::kCompute, "bench", "allreduce bench bucket 3", i, i + 1000,
                          &tl::Args().i("bytes", 4096).i("seq", i).s("group", "world")));
}

int main(int argc, char** argv) {
  const long batch = argc > 1 ? std::atol(argv[1]) : 10000;
  const int batches = argc > 2 ? std::atoi(argv[2]) : 20;
  // Off: the load and the branch.
  const long off_n = 50000000;
  auto t0 = Clock::now();
  for (long i = 0; i < off_n; ++i) hook(i);
  const double off_ns = ns_since(t0, off_n);

  const std::string path = "/tmp/bench_timeline_hooks." + std::to_string(getpid());
  double record_ns = 0, write_ns = 0;
  for (int b = 0; b < batches; ++b) {
    tl::start(path);
    t0 = Clock::now();
    for (long i = 0; i < batch; ++i) hook(i);
    record_ns += ns_since(t0, batch) / batches;
    t0 = Clock::now();
    tl::stop();  // joins the writer (its pass may have taken part) + final flush
    write_ns += ns_since(t0, batch) / batches;
  }
  std::remove((path + ".rank0.json").c_str());
  std::printf("| hook, timeline off | %.2f ns |\n", off_ns);
  std::printf("| record one event (calling thread) | %.0f ns |\n", record_ns);
  std::printf("| format + write one event (writer) | %.0f ns |\n", write_ns);
  return 0;
}
