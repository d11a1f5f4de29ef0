// The time an async checkpoint of CUDA state holds the training loop
// (CheckpointManager::save with async = true: the D2H snapshot into pooled
// pinned buffers, ordered after the producing stream) against a pinned
// cudaMemcpy of the same bytes in the same process.
//
//   mpirun -np 1 build/bench/gpu/bench_gpu_snapshot [--dir /tmp/tutti-snap]
//          [--mb 64,256,1024] [--tensors 8] [--reps 5]
//
// Each repetition saves a new step (keep_last = 1, so the disk holds at most
// two checkpoints), waits for the commit outside the timing, then times the
// peer: cudaMemcpyAsync of every tensor into one pinned buffer and a stream
// sync.  The first save of a size (it fills the buffer pool) is a warm-up.
// Columns: save() blocking time (SaveStats::blocking_s), its snapshot part
// (snapshot_s), the peer, GB/s of each, ratio = peer time / blocking time
// (1.0: the loop is held exactly for one copy).  Medians.
// Exit 77 without a CUDA device.
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "bench/gpu/gpu_bench.h"

using namespace tutti;
using gpubench::median;

int main(int argc, char** argv) {
  std::string dir = "/tmp/tutti-bench-snapshot";
  std::vector<int64_t> mbs{64, 256, 1024};
  int tensors = 8, reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--dir") dir = v;
    else if (a == "--mb") mbs = gpubench::parse_sizes(v);
    else if (a == "--tensors") tensors = std::stoi(v);
    else if (a == "--reps") reps = std::stoi(v);
    else { std::fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
  }
  return gpubench::run("bench_gpu_snapshot", [&](int dev, const ProcessGroupPtr& world,
                                                 cudaStream_t s) {
    std::printf("## bench_gpu_snapshot: %s (cuda:%d), %d rank(s), %d tensors, "
                "median of %d saves\n\n", gpubench::device_name(dev).c_str(), dev,
                world->size(), tensors, reps);
    std::printf("| state | save() blocks ms | snapshot ms | pinned cudaMemcpy ms | "
                "save GB/s | memcpy GB/s | ratio |\n|---:|---:|---:|---:|---:|---:|---:|\n");
    int64_t step = 0;
    for (int64_t mb : mbs) {
      gpubench::CudaState cs(dev, mb, tensors);
      const size_t per = cs.per;
      const gpubench::DeviceBuffer& state = cs.buffer;
      const StateDict& sd = cs.dict;
      CheckpointOptions o;
      o.dir = dir + "/" + std::to_string(mb) + "mb";
      o.keep_last = 1;
      o.async = true;
      o.cuda_stream = s;
      CheckpointManager mgr(world, o);
      void* pinned = nullptr;
      GB_CUDA(cudaMallocHost(&pinned, per * tensors));
      std::vector<double> blocks, snaps, peers;
      for (int r = 0; r <= reps; ++r) {
        mgr.save(++step, sd);
        const SaveStats st = mgr.last_save_stats();
        mgr.wait();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < tensors; ++i)
          GB_CUDA(cudaMemcpyAsync(static_cast<char*>(pinned) + i * per, state.at(i * per),
                                  per, cudaMemcpyDeviceToHost, s));
        GB_CUDA(cudaStreamSynchronize(s));
        const double peer =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r == 0) continue;  // warm-up: the pool's first fill
        blocks.push_back(st.blocking_s * 1e3);
        snaps.push_back(st.snapshot_s * 1e3);
        peers.push_back(peer * 1e3);
      }
      cudaFreeHost(pinned);
      const double b = median(blocks), sn = median(snaps), p = median(peers);
      const double bytes = static_cast<double>(per) * tensors;
      std::printf("| %s | %.2f | %.2f | %.2f | %.1f | %.1f | %.2f |\n",
                  gpubench::human(bytes).c_str(), b, sn, p, bytes / (b * 1e6),
                  bytes / (p * 1e6), p / b);
      std::fflush(stdout);
    }
  });
}
