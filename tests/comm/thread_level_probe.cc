// Run with TUTTI_MPI_THREAD_LEVEL=funneled under mpiexec: tutti asks MPI for
// MPI_THREAD_FUNNELED only, so init() must refuse with kUnsupported naming
// the granted and the needed level.  Prints "PROBE-OK" when it does.
#include <mpi.h>

#include <cstdio>
#include <string>

#include "tutti/tutti.h"

int main() {
  int code = 1;
  try {
    tutti::init();
    std::printf("PROBE-FAIL: init() accepted MPI_THREAD_FUNNELED\n");
  } catch (const tutti::Error& e) {
    const std::string m = e.what();
    if (e.code() == tutti::ErrorCode::kUnsupported &&
        m.find("MPI granted MPI_THREAD_FUNNELED but tutti needs MPI_THREAD_MULTIPLE") !=
            std::string::npos) {
      std::printf("PROBE-OK: %s\n", m.c_str());
      code = 0;
    } else {
      std::printf("PROBE-FAIL: unexpected error: %s\n", m.c_str());
    }
  }
  std::fflush(stdout);
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Finalize();
  return code;
}
