// Checkpoint benchmarks (figures in bench/RESULTS.md).
//
//   bench_checkpoint blocking   [--dir D] [--max-mb N]
//       time save() holds the caller (async snapshot into pooled host
//       memory) vs a plain memcpy of the same bytes, per state size
//   bench_checkpoint throughput [--dir D] [--mb N]
//       a synchronous save's write rate (hash + write + fsync of the shard)
//       vs `dd conv=fsync` writing the same bytes to the same directory, in
//       the same run; and the xxHash64 rate over the same bytes
//   mpiexec -np R bench_checkpoint notice [--dir D] [--mb N] [--reps K]
//       notice-to-commit latency: rank 0 sends SIGUSR1 to every rank (as
//       mpirun forwards it) at a random moment inside a training step; the
//       ranks stop at the next step boundary, save N MiB each and wait for
//       the commit.  Target: 1 GiB per rank within 10 s.
// Each figure is the median of the repetitions.
#include <signal.h>
#include <unistd.h>

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/file_util.h"
#include "tutti/tutti.h"

using namespace tutti;
using Clock = std::chrono::steady_clock;

namespace {

double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A model-like state: 4 MiB float32 tensors (the last one smaller).
struct State : Stateful {
  std::vector<std::vector<float>> ts;
  explicit State(size_t bytes) {
    const size_t chunk = 4 << 20;
    for (size_t done = 0; done < bytes; done += chunk) {
      ts.emplace_back(std::min(chunk, bytes - done) / sizeof(float));
      std::mt19937 g(static_cast<unsigned>(done));
      for (auto& x : ts.back()) x = static_cast<float>(g()) * 1e-9f;
    }
  }
  StateDict state_dict() override {
    StateDict out;
    for (size_t i = 0; i < ts.size(); ++i)
      out.push_back({"p" + std::to_string(i), Tensor::of(ts[i]), {}});
    return out;
  }
};

struct Args {
  std::string mode, dir = "/tmp/tutti-bench";
  int max_mb = 1024, mb = 1024, reps = 3;
};

CheckpointOptions opts(const std::string& dir, bool async) {
  CheckpointOptions o;
  o.dir = dir;
  o.async = async;
  o.keep_last = 1;
  return o;
}

void bench_blocking(const Args& a) {
  std::printf("| state (MiB) | save() blocks (ms) | memcpy (ms) | ratio | snapshot GB/s |\n"
              "|---:|---:|---:|---:|---:|\n");
  for (int mb : {1, 16, 128, 512, 1024}) {
    if (mb > a.max_mb) break;
    const size_t bytes = static_cast<size_t>(mb) << 20;
    State s(bytes);
    CheckpointManager m(world(), opts(a.dir + "/blocking", true));
    m.save(0, {{"model", &s}});  // warms the buffer pool
    m.wait();
    std::vector<double> block, copy;
    std::vector<char> dst(bytes);
    std::memset(dst.data(), 1, bytes);  // fault the pages in, as the pool's are
    for (int r = 0; r < a.reps; ++r) {
      m.save(r + 1, {{"model", &s}});
      block.push_back(m.last_save_stats().blocking_s);
      m.wait();
      const auto t0 = Clock::now();
      size_t off = 0;
      for (auto& t : s.ts) {
        std::memcpy(dst.data() + off, t.data(), t.size() * sizeof(float));
        off += t.size() * sizeof(float);
      }
      copy.push_back(secs(t0, Clock::now()));
    }
    const double b = median(block), c = median(copy);
    std::printf("| %d | %.2f | %.2f | %.2f | %.2f |\n", mb, b * 1e3, c * 1e3, b / c,
                static_cast<double>(bytes) / b / 1e9);
    std::fflush(stdout);
  }
}

void bench_throughput(const Args& a) {
  const size_t bytes = static_cast<size_t>(a.mb) << 20;
  State s(bytes);
  std::vector<double> save_w, save_c, dd, hash;
  for (int r = 0; r < a.reps; ++r) {
    {
      CheckpointManager m(world(), opts(a.dir + "/throughput", false));
      m.save(r, {{"model", &s}});
      save_w.push_back(m.last_save_stats().write_s);
      save_c.push_back(m.last_save_stats().commit_s);
    }
    const std::string ddfile = a.dir + "/dd.bin";
    const std::string cmd = "dd if=/dev/zero of=" + ddfile + " bs=4M count=" +
                            std::to_string(bytes >> 22) + " conv=fsync status=none";
    const auto t0 = Clock::now();
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "dd failed\n");
    dd.push_back(secs(t0, Clock::now()));
    ckpt::remove_file(ddfile);
    const auto h0 = Clock::now();
    uint64_t acc = 0;
    for (auto& t : s.ts) acc ^= XXH64(t.data(), t.size() * sizeof(float), 0);
    hash.push_back(secs(h0, Clock::now()));
    if (acc == 42) std::printf(" ");
  }
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("| what (%d MiB) | seconds | GB/s |\n|---|---:|---:|\n", a.mb);
  std::printf("| tutti shard: hash + write + fsync + rename | %.2f | %.2f |\n", median(save_w),
              gb / median(save_w));
  std::printf("| tutti save, committed (incl. manifest, latest, retention) | %.2f | %.2f |\n",
              median(save_c), gb / median(save_c));
  std::printf("| dd bs=4M conv=fsync, same directory | %.2f | %.2f |\n", median(dd),
              gb / median(dd));
  std::printf("| xxHash64 of the same bytes (in memory) | %.2f | %.2f |\n", median(hash),
              gb / median(hash));
  std::printf("\ntutti/dd write-rate ratio: %.2f\n", median(dd) / median(save_w));
}

void bench_notice(const Args& a) {
  auto w = world();
  auto monitor = std::make_unique<PreemptionMonitor>();
  const size_t bytes = static_cast<size_t>(a.mb) << 20;
  State s(bytes);
  std::vector<int32_t> pids(static_cast<size_t>(w->size()));
  int32_t me = static_cast<int32_t>(::getpid());
  w->allgather(Tensor::of(&me, 1), Tensor::of(pids));
  CheckpointManager m(w, opts(a.dir + "/notice", true));
  // A first save outside the measurement allocates the snapshot buffers,
  // as the periodic checkpoints of a real run would have done.
  m.save(0, {{"model", &s}});
  m.wait();
  std::mt19937 rng(7);
  std::vector<double> lat;
  const double step_s = 0.2;  // a training step stand-in
  for (int r = 0; r < a.reps; ++r) {
    // The notice: rank 0 signals every rank at a random point of a step.
    std::thread notifier;
    Clock::time_point t0;
    if (w->rank() == 0) {
      const double delay = step_s * (1.0 + std::uniform_real_distribution<>(0, 1)(rng));
      notifier = std::thread([&, delay] {
        std::this_thread::sleep_for(std::chrono::duration<double>(delay));
        t0 = Clock::now();
        for (int32_t p : pids) ::kill(p, SIGUSR1);
      });
    }
    int64_t step = 0;
    for (;;) {
      ++step;
      std::this_thread::sleep_for(std::chrono::duration<double>(step_s));
      if (monitor->should_stop(*w)) break;
    }
    m.save(1000 + r, {{"model", &s}});
    m.wait();
    if (w->rank() == 0) {
      notifier.join();
      lat.push_back(secs(t0, Clock::now()));
      std::printf("rep %d: notice in step %lld, committed %.3f s after the notice\n", r,
                  static_cast<long long>(step), lat.back());
      std::fflush(stdout);
    }
    // A new monitor for the next repetition (a notice stays raised).
    monitor.reset();
    monitor = std::make_unique<PreemptionMonitor>();
    w->barrier();
  }
  if (w->rank() == 0)
    std::printf("\nnotice-to-commit, %d MiB per rank x %d ranks: median %.2f s (max %.2f s)\n",
                a.mb, w->size(), median(lat), *std::max_element(lat.begin(), lat.end()));
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  a.mode = argc > 1 ? argv[1] : "";
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") a.dir = v;
    else if (k == "--max-mb") a.max_mb = std::stoi(v);
    else if (k == "--mb") a.mb = std::stoi(v);
    else if (k == "--reps") a.reps = std::stoi(v);
  }
  tutti::init();
  if (world()->rank() == 0) ckpt::make_dirs(a.dir);
  world()->barrier();
  if (a.mode == "blocking") bench_blocking(a);
  else if (a.mode == "throughput") bench_throughput(a);
  else if (a.mode == "notice") bench_notice(a);
  else std::fprintf(stderr, "usage: bench_checkpoint blocking|throughput|notice [...]\n");
  world()->barrier();
  if (world()->rank() == 0) ckpt::remove_tree(a.dir);
  tutti::shutdown();
  return 0;
}
