// What a GPU adds to recovering from a lost rank (issue 28, docs/elastic.md
// "What a GPU cluster adds"): the costs a restarted GPU process pays before
// its first step, and the NCCL operations an in-process recovery would use
// instead of a restart, at one rank on one GPU.
//
//   mpirun -np 1 build/bench/gpu/bench_gpu_recovery [--mb 256,1024] [--reps 5]
//          [--dirs /dev/shm/tutti-bench-recovery,/tmp/tutti-bench-recovery]
//
// Rows (medians of --reps, except the cold ones, which a process pays once):
//   cold   the process's first CUDA call (context creation), tutti::init
//          (MPI_Init), the first ncclCommInitRank, the first all-reduce
//   NCCL   ncclGetUniqueId + ncclCommInitRank again, ncclCommSplit,
//          ncclCommShrink (nothing excluded: at one rank there is nothing to
//          exclude, so this is the call's fixed cost) with NCCL_SHRINK_DEFAULT
//          and NCCL_SHRINK_ABORT, ncclCommRevoke + ncclCommShrink, and
//          ncclCommAbort / ncclCommDestroy of an idle communicator.  Shrink
//          and Revoke are looked up at run time: an older libnccl on the
//          target lacks them (the row says so)
//   tutti  a new ProcessGroup (split of the world) and its NCCL communicator
//          through the public API (the unique id goes over MPI) up to its
//          first all-reduce
//   load   CheckpointManager::load_latest of CUDA state saved in each of
//          --dirs (/dev/shm: the memory tier's medium), against a pinned
//          cudaMemcpy H2D of the same bytes
// Exit 77 without a CUDA device.
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/gpu/gpu_bench.h"

namespace {

using namespace tutti;
using Clock = std::chrono::steady_clock;
using gpubench::median;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void nccl_ok(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

ncclComm_t init_one(int dev) {
  ncclUniqueId id;
  nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
  GB_CUDA(cudaSetDevice(dev));
  ncclComm_t c = nullptr;
  nccl_ok(ncclCommInitRank(&c, 1, id, 0), "ncclCommInitRank");
  return c;
}

void allreduce_one(ncclComm_t c, float* buf, cudaStream_t s) {
  nccl_ok(ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, c, s), "ncclAllReduce");
  GB_CUDA(cudaStreamSynchronize(s));
}

using ShrinkFn = ncclResult_t (*)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int);
using RevokeFn = ncclResult_t (*)(ncclComm_t, int);

void row(const std::string& what, const std::string& value, const std::string& note) {
  std::printf("| %s | %s | %s |\n", what.c_str(), value.c_str(), note.c_str());
  std::fflush(stdout);
}
std::string fmt_ms(double ms) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", ms);
  return b;
}

// Median of `reps` timings of f (ms); a failure becomes the row's text.
std::string timed(int reps, const std::function<double()>& f) {
  try {
    std::vector<double> v;
    for (int r = 0; r < reps; ++r) v.push_back(f());
    return fmt_ms(median(v));
  } catch (const std::exception& e) {
    return std::string("failed: ") + e.what();
  }
}

class Blob : public Stateful {
 public:
  explicit Blob(StateDict sd) : sd_(std::move(sd)) {}
  StateDict state_dict() override { return sd_; }

 private:
  StateDict sd_;
};

}  // namespace

int main(int argc, char** argv) {
  const auto t_main = Clock::now();
  std::vector<int64_t> mbs{256, 1024};
  std::vector<std::string> dirs{"/dev/shm/tutti-bench-recovery", "/tmp/tutti-bench-recovery"};
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--mb") mbs = gpubench::parse_sizes(v);
    else if (a == "--reps") reps = std::stoi(v);
    else if (a == "--dirs") {
      dirs.clear();
      size_t p = 0;
      while (p <= v.size()) {
        size_t e = v.find(',', p);
        if (e == std::string::npos) e = v.size();
        if (e > p) dirs.push_back(v.substr(p, e - p));
        p = e + 1;
      }
    } else { std::fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
  }

  // ---- cold: what every (re)started process pays once ----------------------
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device: skipped\n");
    return gpubench::kSkipExitCode;
  }
  auto t = Clock::now();
  GB_CUDA(cudaFree(nullptr));
  const double ctx_ms = ms_since(t), ctx_from_main = ms_since(t_main);
  t = Clock::now();
  tutti::init();
  const double init_ms = ms_since(t);
  int rc = 0;
  try {
    const int dev = gpubench::pick_device();
    cudaStream_t s;
    GB_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    gpubench::DeviceBuffer buf(1024 * sizeof(float));
    GB_CUDA(cudaMemset(buf.get(), 0, buf.bytes()));
    float* fb = static_cast<float*>(buf.get());
    std::printf("## bench_gpu_recovery: %s (cuda:%d), %d rank(s), NCCL %d (runtime)\n\n",
                gpubench::device_name(dev).c_str(), dev, tutti::size(), [] {
                  int v = 0;
                  ncclGetVersion(&v);
                  return v;
                }());
    std::printf("| step | ms | note |\n|---|---:|---|\n");
    row("cold: first CUDA call (context)", fmt_ms(ctx_ms),
        "main() to context: " + fmt_ms(ctx_from_main) + " ms");
    row("cold: tutti::init (MPI_Init, world)", fmt_ms(init_ms), "");
    t = Clock::now();
    ncclComm_t first = init_one(dev);
    const double first_init = ms_since(t);
    t = Clock::now();
    allreduce_one(first, fb, s);
    const double first_ar = ms_since(t);
    row("cold: first ncclCommInitRank (1 rank)", fmt_ms(first_init), "includes NCCL's own set-up");
    row("cold: first all-reduce (4 KiB)", fmt_ms(first_ar), "");
    nccl_ok(ncclCommDestroy(first), "ncclCommDestroy");

    // ---- NCCL operations a recovery would use (warm) -----------------------
    row("ncclGetUniqueId + ncclCommInitRank (warm)", timed(reps, [&] {
          const auto t0 = Clock::now();
          ncclComm_t c = init_one(dev);
          const double ms = ms_since(t0);
          ncclCommDestroy(c);
          return ms;
        }), "median of " + std::to_string(reps));
    row("init + first all-reduce (warm)", timed(reps, [&] {
          const auto t0 = Clock::now();
          ncclComm_t c = init_one(dev);
          allreduce_one(c, fb, s);
          const double ms = ms_since(t0);
          ncclCommDestroy(c);
          return ms;
        }), "");
    // The teardown of an idle communicator that ran one all-reduce.
    auto teardown_ms = [&](ncclResult_t (*end)(ncclComm_t), const char* name) {
      return timed(reps, [&] {
        ncclComm_t c = init_one(dev);
        allreduce_one(c, fb, s);
        const auto t0 = Clock::now();
        nccl_ok(end(c), name);
        return ms_since(t0);
      });
    };
    row("ncclCommAbort (idle, after one all-reduce)", teardown_ms(ncclCommAbort, "ncclCommAbort"), "");
    row("ncclCommDestroy (idle, after one all-reduce)",
        teardown_ms(ncclCommDestroy, "ncclCommDestroy"), "");
    row("ncclCommSplit (color 0) + first all-reduce", timed(reps, [&] {
          ncclComm_t c = init_one(dev);
          const auto t0 = Clock::now();
          ncclComm_t sub = nullptr;
          nccl_ok(ncclCommSplit(c, 0, 0, &sub, nullptr), "ncclCommSplit");
          allreduce_one(sub, fb, s);
          const double ms = ms_since(t0);
          ncclCommDestroy(sub);
          ncclCommDestroy(c);
          return ms;
        }), "");
    auto shrink = reinterpret_cast<ShrinkFn>(dlsym(RTLD_DEFAULT, "ncclCommShrink"));
    auto revoke = reinterpret_cast<RevokeFn>(dlsym(RTLD_DEFAULT, "ncclCommRevoke"));
    for (int flag : {NCCL_SHRINK_DEFAULT, NCCL_SHRINK_ABORT}) {
      const std::string name = std::string("ncclCommShrink (") +
                               (flag == NCCL_SHRINK_ABORT ? "NCCL_SHRINK_ABORT" : "NCCL_SHRINK_DEFAULT") +
                               ", none excluded) + first all-reduce";
      if (!shrink) { row(name, "-", "this libnccl has no ncclCommShrink"); continue; }
      row(name, timed(reps, [&] {
            ncclComm_t c = init_one(dev);
            allreduce_one(c, fb, s);
            const auto t0 = Clock::now();
            ncclComm_t sub = nullptr;
            nccl_ok(shrink(c, nullptr, 0, &sub, nullptr, flag), "ncclCommShrink");
            allreduce_one(sub, fb, s);
            const double ms = ms_since(t0);
            ncclCommDestroy(sub);
            ncclCommAbort(c);
            return ms;
          }), "");
    }
    if (!revoke || !shrink) {
      row("ncclCommRevoke + ncclCommShrink", "-", "this libnccl has no ncclCommRevoke");
    } else {
      row("ncclCommRevoke + ncclCommShrink + first all-reduce", timed(reps, [&] {
            ncclComm_t c = init_one(dev);
            allreduce_one(c, fb, s);
            const auto t0 = Clock::now();
            nccl_ok(revoke(c, NCCL_REVOKE_DEFAULT), "ncclCommRevoke");
            ncclResult_t st = ncclInProgress;
            while (st == ncclInProgress) nccl_ok(ncclCommGetAsyncError(c, &st), "ncclCommGetAsyncError");
            ncclComm_t sub = nullptr;
            nccl_ok(shrink(c, nullptr, 0, &sub, nullptr, NCCL_SHRINK_DEFAULT), "ncclCommShrink");
            allreduce_one(sub, fb, s);
            const double ms = ms_since(t0);
            ncclCommDestroy(sub);
            ncclCommAbort(c);
            return ms;
          }), "");
    }

    // ---- tutti: a new group and its NCCL communicator ----------------------
    auto world = tutti::world();
    row("tutti: split_group + cuda_communicator + first all-reduce", timed(reps, [&] {
          const auto t0 = Clock::now();
          auto g = world->split_group(0, world->rank(), "rebuilt");
          Tensor x(fb, DType::kFloat32, Shape{1024}, Device::cuda(dev));
          g->cuda_communicator(dev)->allreduce(x);
          const double ms = ms_since(t0);
          g.reset();
          return ms;
        }), "the unique id travels over MPI; backend " + world->cuda_communicator(dev)->backend());

    // ---- load of CUDA state from each directory ----------------------------
    std::printf("\n| state | directory | load_latest ms | GB/s | pinned H2D ms | ratio H2D/load |\n"
                "|---:|---|---:|---:|---:|---:|\n");
    for (int64_t mb : mbs) {
      gpubench::CudaState state(dev, mb, 8);
      const size_t bytes = state.bytes();
      Blob blob(state.dict);
      void* pinned = nullptr;
      GB_CUDA(cudaMallocHost(&pinned, bytes));
      std::vector<double> h2d;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        GB_CUDA(cudaMemcpyAsync(state.buffer.get(), pinned, bytes, cudaMemcpyHostToDevice, s));
        GB_CUDA(cudaStreamSynchronize(s));
        h2d.push_back(ms_since(t0));
      }
      cudaFreeHost(pinned);
      state.refill();
      for (const std::string& base : dirs) {
        const std::string d = base + "/" + std::to_string(mb) + "mb";
        std::error_code ec;
        std::filesystem::remove_all(d, ec);
        CheckpointOptions o;
        o.dir = d;
        o.keep_last = 1;
        o.async = false;
        o.cuda_stream = s;
        o.fresh_start = FreshStart::kAllow;
        try {
          CheckpointManager mgr(world, o);
          mgr.save(1, {{"m", &blob}});
          std::vector<double> v;
          for (int r = 0; r < reps; ++r) {
            GB_CUDA(cudaDeviceSynchronize());
            const auto t0 = Clock::now();
            mgr.load_latest({{"m", &blob}});
            GB_CUDA(cudaDeviceSynchronize());
            v.push_back(ms_since(t0));
          }
          const double m = median(v), h = median(h2d);
          char line[256];
          std::snprintf(line, sizeof line, "| %s | %s | %.1f | %.1f | %.1f | %.2f |\n",
                        gpubench::human(static_cast<double>(bytes)).c_str(),
                        base.c_str(), m, static_cast<double>(bytes) / (m * 1e6), h,
                        h / m);
          std::printf("%s", line);
        } catch (const std::exception& e) {
          std::printf("| %s | %s | failed: %s | | | |\n",
                      gpubench::human(static_cast<double>(bytes)).c_str(),
                      base.c_str(), e.what());
        }
        std::fflush(stdout);
        std::filesystem::remove_all(d, ec);
      }
    }
    GB_CUDA(cudaStreamSynchronize(s));
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_recovery: %s\n", e.what());
    rc = 1;
  }
  tutti::shutdown();
  return rc;
}
