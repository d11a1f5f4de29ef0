// All-reduce sweep in the manner of nccl-tests, with raw MPI_Allreduce on the
// same buffers in the same run as the peer.
//
//   mpirun -np 2 build/bench/comm/bench_allreduce [--min 1K] [--max 256M]
//          [--dtype float32] [--check 1|0|both]
//
// Columns: size, time per op (us), algbw = bytes / time, busbw = algbw *
// 2(n-1)/n (the bytes each rank must move in a ring all-reduce, so busbw is
// comparable across rank counts), wrong = elements differing from the
// closed-form sum after the last iteration.  "ratio" is tutti busbw / MPI
// busbw; "added" is tutti time - MPI time.  With --check both, tutti runs with
// TUTTI_CHECK_COLLECTIVES=1 and =0 so the cost of the agreement check shows.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tutti/tutti.h"

namespace {

int64_t parse_size(const std::string& s) {
  char unit = s.empty() ? 0 : s.back();
  int64_t mult = 1;
  std::string num = s;
  if (unit == 'K' || unit == 'k') mult = 1 << 10;
  if (unit == 'M' || unit == 'm') mult = 1 << 20;
  if (unit == 'G' || unit == 'g') mult = int64_t{1} << 30;
  if (mult != 1) num.pop_back();
  return std::stoll(num) * mult;
}

std::string human(int64_t bytes) {
  char buf[32];
  if (bytes >= (1 << 20))
    std::snprintf(buf, sizeof(buf), "%lldM", static_cast<long long>(bytes >> 20));
  else if (bytes >= (1 << 10))
    std::snprintf(buf, sizeof(buf), "%lldK", static_cast<long long>(bytes >> 10));
  else
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(bytes));
  return buf;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Time per op (seconds): the max over ranks of each rank's mean, after a
// warm-up, so one slow rank is not hidden.
template <typename F>
double time_op(F op, int iters) {
  for (int i = 0; i < std::max(2, iters / 10); ++i) op();
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now();
  for (int i = 0; i < iters; ++i) op();
  double t = (now() - t0) / iters;
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t min_bytes = 1 << 10, max_bytes = int64_t{256} << 20;
  std::string check = "both";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--min") min_bytes = parse_size(v);
    else if (a == "--max") max_bytes = parse_size(v);
    else if (a == "--check") check = v;
  }
  tutti::init();
  auto world = tutti::world();
  const int rank = world->rank(), n = world->size();
  MPI_Comm raw;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  if (rank == 0) {
    std::printf("# tutti all-reduce vs MPI_Allreduce, float32 sum, %d ranks, out-of-place\n", n);
    std::printf("# %8s %11s %9s %9s %11s %9s %9s %7s %9s %6s\n", "size", "mpi_us",
                "mpi_busbw", "", "tutti_us", "algbw", "busbw", "ratio", "added_us", "wrong");
  }
  const bool modes[2] = {true, false};
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const int64_t count = bytes / 4;
    std::vector<float> in(count), out(count);
    for (int64_t i = 0; i < count; ++i) in[i] = static_cast<float>((i % 97) + rank);
    // Iterations: about 0.2 s of data movement at ~5 GB/s, at least 20.
    const int iters = static_cast<int>(std::max<int64_t>(20, std::min<int64_t>(20000, (int64_t{1} << 30) / std::max<int64_t>(bytes, 1))));
    const double t_mpi = time_op([&] {
      MPI_Allreduce(in.data(), out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, raw);
    }, iters);
    const double busf = 2.0 * (n - 1) / n;
    for (bool checked : modes) {
      if ((check == "1" && !checked) || (check == "0" && checked)) continue;
      setenv("TUTTI_CHECK_COLLECTIVES", checked ? "1" : "0", 1);
      tutti::config::reload();
      std::fill(out.begin(), out.end(), -1.0f);
      const tutti::Tensor tin = tutti::Tensor::of(in), tout = tutti::Tensor::of(out);
      const double t = time_op([&] { world->allreduce(tin, tout, tutti::ReduceOp::kSum); }, iters);
      int64_t wrong = 0;
      for (int64_t i = 0; i < count; ++i) {
        const float expect = static_cast<float>(n * (i % 97) + n * (n - 1) / 2);
        if (out[i] != expect) ++wrong;
      }
      int64_t wrong_all = 0;
      MPI_Allreduce(&wrong, &wrong_all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
      if (rank == 0) {
        const double mpi_bus = bytes / t_mpi / 1e9 * busf;
        const double alg = bytes / t / 1e9, bus = alg * busf;
        std::printf("  %8s %11.2f %9.3f %9s %11.2f %9.3f %9.3f %7.3f %9.2f %6lld\n",
                    human(bytes).c_str(), t_mpi * 1e6, mpi_bus,
                    checked ? "check=1" : "check=0", t * 1e6, alg, bus,
                    bus / mpi_bus, (t - t_mpi) * 1e6, static_cast<long long>(wrong_all));
        std::fflush(stdout);
      }
    }
  }
  MPI_Comm_free(&raw);
  tutti::shutdown();
  return 0;
}
