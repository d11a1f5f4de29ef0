// Driven by stall_test.sh: the stall inspector (TUTTI_STALL_WARN_S).
//   stall_probe LATE DELAY_S [op|bucket]
// op: every rank runs a barrier, then the last LATE ranks sleep DELAY_S
// outside tutti before an all-reduce of 1000 floats named 'stall.probe',
// each rank contributing rank + 1; every rank checks the closed-form sum
// n(n+1)/2 in every element.
// bucket: the same through the data-parallel reducer (one 1000-float
// gradient, one bucket, average): the late ranks sleep before grad_ready();
// the others wait in synchronize() while the bucket's all-reduce stalls;
// the gradient must be (n+1)/2 everywhere.
// split: the late ranks sleep before a split_group of the world (a split is
// numbered, agreed and watched like a collective); the all-reduce on the
// child then gives the same closed-form sum.
// The waiting ranks log the stall warnings (checked by the script from
// stderr); each rank prints "PROBE-OK rank R" (or PROBE-FAIL and why).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tutti/tutti.h"

int main(int argc, char** argv) {
  const int late = argc > 1 ? std::atoi(argv[1]) : 1;
  const double delay_s = argc > 2 ? std::atof(argv[2]) : 2.5;
  const std::string mode = argc > 3 ? argv[3] : "op";
  tutti::init();
  int rc = 0;
  {
    auto w = tutti::world();
    const int rank = w->rank();
    const int n = w->size();
    try {
      std::vector<float> v(1000, static_cast<float>(rank + 1));
      float want = static_cast<float>(n * (n + 1) / 2);
      const auto pause = [&] {
        if (rank >= n - late) usleep(static_cast<useconds_t>(delay_s * 1e6));
      };
      if (mode == "bucket") {
        std::vector<float> param(v.size(), 0.0f);
        tutti::ReducerOptions o;
        o.op = tutti::ReduceOp::kAvg;
        tutti::Reducer reducer(w, o);
        reducer.add_parameter("stall.weight", tutti::Tensor::of(param),
                              tutti::Tensor::of(v));
        reducer.build();
        pause();
        reducer.grad_ready(0);
        reducer.synchronize();
        want = static_cast<float>(n + 1) / 2;
      } else if (mode == "split") {
        w->barrier();
        pause();
        auto child = w->split_group(0, rank, "stall.child");
        child->allreduce(tutti::Tensor::of(v), tutti::ReduceOp::kSum);
      } else {
        w->barrier();
        pause();
        w->allreduce(tutti::Tensor::of(v), tutti::ReduceOp::kSum, {"stall.probe"});
      }
      size_t bad = 0;
      for (float x : v) bad += x != want;
      if (bad) {
        std::printf("PROBE-FAIL rank %d: %zu elements differ from %g (first %g)\n",
                    rank, bad, want, v[0]);
        rc = 1;
      } else {
        std::printf("PROBE-OK rank %d\n", rank);
      }
    } catch (const tutti::Error& e) {
      std::printf("PROBE-FAIL rank %d: %s\n", rank, e.what());
      rc = 1;
    }
    std::fflush(stdout);
  }
  tutti::shutdown();
  return rc;
}
