// Driven by stall_test.sh: the stall inspector (TUTTI_STALL_WARN_S).
//   stall_probe LATE DELAY_S
// Every rank runs a barrier (#1), then the last LATE ranks sleep DELAY_S
// outside tutti before an all-reduce (#2) of 1000 floats named
// 'stall.probe', each rank contributing rank + 1.  The waiting ranks log the
// stall warnings (checked by the script from stderr); every rank checks the
// closed-form sum n(n+1)/2 in every element and prints
// "PROBE-OK rank R" (or PROBE-FAIL with the reason).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tutti/tutti.h"

int main(int argc, char** argv) {
  const int late = argc > 1 ? std::atoi(argv[1]) : 1;
  const double delay_s = argc > 2 ? std::atof(argv[2]) : 2.5;
  tutti::init();
  int rc = 0;
  {
    auto w = tutti::world();
    const int rank = w->rank();
    const int n = w->size();
    try {
      w->barrier();
      if (rank >= n - late) usleep(static_cast<useconds_t>(delay_s * 1e6));
      std::vector<float> v(1000, static_cast<float>(rank + 1));
      w->allreduce(tutti::Tensor::of(v), tutti::ReduceOp::kSum, {"stall.probe"});
      const float want = static_cast<float>(n * (n + 1) / 2);
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
