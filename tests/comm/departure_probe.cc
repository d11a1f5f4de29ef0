// Driven by departure_test.sh (TUTTI_TIMEOUT=60): a rank that leaves a
// communicator while the others wait in an op it will never enter must make
// them fail at once, naming it and the op; ops submitted before a
// shutdown() run on every rank alike.
//   departure_probe shutdown  rank 1 calls tutti::shutdown() while rank 0
//                             waits in an all-reduce 'probe' on the world
//                             (ranks >= 2 enter it after the departure): they
//                             fail with kCommFailure "rank 1 shut down ..."
//                             well before TUTTI_TIMEOUT, and a later op on
//                             the world is kAborted
//   departure_probe dropped   the same on a split group 'probe', which rank
//                             1 destroys (its last reference) instead:
//                             "rank 1 closed this group"
//   departure_probe drain     every rank submits 8 async all-reduces and
//                             rank 1 calls shutdown() at once, while rank 0
//                             is still asleep (so rank 1's ops 2..8 are
//                             queued behind op 1, which waits for rank 0):
//                             every op completes with its closed-form sum on
//                             every rank (shutdown() used to refuse queued
//                             ops, and rank 0 then waited for op 2 until
//                             TUTTI_TIMEOUT)
// Each rank that sees the expected outcome prints "PROBE-OK rank R: ..."
// with the seconds it took; anything else prints PROBE-FAIL.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "tutti/tutti.h"

namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// The waiters' side of shutdown/dropped: op on `g` must fail at once.
void expect_departure(const tutti::ProcessGroupPtr& g, int world_rank, const std::string& mode) {
  std::vector<float> v(1000, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    g->allreduce(tutti::Tensor::of(v), tutti::ReduceOp::kSum, {"probe"});
    std::printf("PROBE-FAIL rank %d: the all-reduce completed\n", world_rank);
    return;
  } catch (const tutti::Error& e) {
    const std::string m = e.what();
    const double s = since(t0);
    const char* said = mode == "shutdown" ? "rank 1 shut down" : "rank 1 closed this group";
    if (e.code() == tutti::ErrorCode::kCommFailure && has(m, said) &&
        has(m, "allreduce #") && has(m, "'probe'") && has(m, "will never enter #") &&
        s < 20)
      std::printf("PROBE-OK rank %d: failed after %.1f s: %s\n", world_rank, s, m.c_str());
    else
      std::printf("PROBE-FAIL rank %d: after %.1f s: %s\n", world_rank, s, m.c_str());
  }
  std::fflush(stdout);
  try {
    g->barrier();
    std::printf("PROBE-FAIL rank %d: barrier after the departure succeeded\n", world_rank);
  } catch (const tutti::Error& e) {
    if (e.code() != tutti::ErrorCode::kAborted)
      std::printf("PROBE-FAIL rank %d: later op: %s\n", world_rank, e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "shutdown";
  tutti::init();
  auto w = tutti::world();
  const int rank = w->rank(), n = w->size();
  if (mode == "drain") {
    if (rank == 0) sleep(1);
    const auto t0 = std::chrono::steady_clock::now();
    constexpr int kOps = 8;
    std::vector<std::vector<float>> bufs;
    std::vector<tutti::WorkPtr> works;
    for (int k = 0; k < kOps; ++k) bufs.emplace_back(1000, static_cast<float>(rank + k));
    for (int k = 0; k < kOps; ++k)
      works.push_back(w->allreduce_async(tutti::Tensor::of(bufs[static_cast<size_t>(k)]),
                                         tutti::ReduceOp::kSum,
                                         {"drain." + std::to_string(k)}));
    if (rank == 1) tutti::shutdown();
    std::string bad;
    for (int k = 0; k < kOps; ++k) {
      try {
        works[static_cast<size_t>(k)]->wait();
        const float want = static_cast<float>(n * (n - 1) / 2 + n * k);
        for (float x : bufs[static_cast<size_t>(k)])
          if (x != want) {
            bad = "op " + std::to_string(k) + " holds " + std::to_string(x) +
                  ", expected " + std::to_string(want);
            break;
          }
      } catch (const tutti::Error& e) {
        bad = "op " + std::to_string(k) + ": " + e.what();
      }
      if (!bad.empty()) break;
    }
    if (bad.empty() && since(t0) < 20)
      std::printf("PROBE-OK rank %d: %d ops completed in %.1f s\n", rank, kOps, since(t0));
    else
      std::printf("PROBE-FAIL rank %d: after %.1f s: %s\n", rank, since(t0),
                  bad.empty() ? "too slow" : bad.c_str());
    std::fflush(stdout);
    tutti::shutdown();
    return 0;
  }
  tutti::ProcessGroupPtr g = mode == "dropped" ? w->split_group(0, rank, "probe") : w;
  if (rank == 1) {
    sleep(1);  // rank 0 is waiting in the op by now
    if (mode == "dropped") {
      g.reset();  // the group's communicators close: the others learn it
      sleep(30);  // mpirun ends the job when the others exit
    } else {
      w.reset();
      tutti::shutdown();
    }
    return 0;
  }
  if (rank != 0) sleep(2);  // ranks >= 2 enter the op after the departure
  expect_departure(g, rank, mode);
  std::fflush(stdout);
  // The first rank to exit without MPI_Finalize makes mpiexec kill the
  // rest: give the other waiters a moment to print their verdict.
  sleep(2);
  g.reset();
  w.reset();
  tutti::shutdown();
  return 0;
}
