// Checkpoint benchmarks (figures in bench/RESULTS.md).
//
// Common options: --dir D, --reps K, --direct-io 0|1 (default 1).
//   bench_checkpoint blocking   [--dir D] [--max-mb N]
//       time save() holds the caller (async snapshot into pooled host
//       memory) vs a plain memcpy of the same bytes, per state size
//   bench_checkpoint throughput [--dir D] [--mb N]
//       a synchronous save's write rate (hash + write + fsync of the shard)
//       vs `dd conv=fsync` and `dd oflag=direct conv=fsync` writing the same
//       number of bytes to the same directory, in the same run; and the
//       xxHash64 rate over the same bytes
//   mpiexec -np R bench_checkpoint notice [--dir D] [--mb N] [--reps K]
//       notice-to-commit latency: rank 0 sends SIGUSR1 to every rank (as
//       mpirun forwards it) at a random moment inside a training step; the
//       ranks stop at the next step boundary, save N MiB each and wait for
//       the commit.  Target: 1 GiB per rank within 10 s.
//   bench_checkpoint load [--dir D] [--mb N] [--tensors T] [--reps K]
//       load_latest of N MiB of host state in T float32 tensors (default 8),
//       saved once into D (/dev/shm: the memory tier's medium), against a
//       plain memcpy of the same bytes into the same tensors and the
//       xxHash64 rate over them, measured in the same run.
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
  int max_mb = 1024, mb = 1024, reps = 3, tensors = 8;
};

bool g_direct = true;  // --direct-io 0 compares with buffered writes

CheckpointOptions opts(const std::string& dir, bool async) {
  CheckpointOptions o;
  o.dir = dir;
  o.async = async;
  o.keep_last = 1;
  o.direct_io = g_direct;
  return o;
}

void bench_blocking(const Args& a) {
  std::printf("| state (MiB) | save() blocks, median (best) ms | memcpy, median (best) ms "
              "| ratio of medians (bests) | snapshot GB/s (best) |\n"
              "|---:|---:|---:|---:|---:|\n");
  for (int mb : {1, 16, 128, 512, 1024}) {
    if (mb > a.max_mb) break;
    const size_t bytes = static_cast<size_t>(mb) << 20;
    State s(bytes);
    CheckpointManager m(world(), opts(a.dir + "/blocking-" + std::to_string(mb), true));
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
    const double bb = *std::min_element(block.begin(), block.end());
    const double cb = *std::min_element(copy.begin(), copy.end());
    std::printf("| %d | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) | %.2f |\n", mb, b * 1e3,
                bb * 1e3, c * 1e3, cb * 1e3, b / c, bb / cb, static_cast<double>(bytes) / bb / 1e9);
    std::fflush(stdout);
  }
}

void bench_throughput(const Args& a) {
  const size_t bytes = static_cast<size_t>(a.mb) << 20;
  State s(bytes);
  std::vector<double> save_w, save_c, dd, hash;
  // One manager, its buffer pool warmed by a first save, as in a training
  // run; dd files are removed outside the timing; the order of the three
  // writers rotates so that none always follows another's write-back.
  CheckpointManager m(world(), opts(a.dir + "/throughput", false));
  m.save(0, {{"model", &s}});
  std::vector<double> dd_direct;
  auto run_dd = [&](const char* flags, std::vector<double>& out, int r) {
    const std::string ddfile = a.dir + "/dd.bin";
    const std::string cmd = "dd if=/dev/zero of=" + ddfile + " bs=4M count=" +
                            std::to_string(bytes >> 22) + " " + flags + " status=none";
    const auto t0 = Clock::now();
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "dd failed\n");
    out.push_back(secs(t0, Clock::now()));
    if (std::getenv("BENCH_VERBOSE")) std::printf("rep %d dd %s %.2f\n", r, flags, out.back());
    ckpt::remove_file(ddfile);
  };
  for (int r = 0; r < a.reps; ++r) {
    for (int k = 0; k < 3; ++k) {
      const int which = (k + r) % 3;
      if (which == 0) {
        m.save(r + 1, {{"model", &s}});
        save_w.push_back(m.last_save_stats().write_s);
        save_c.push_back(m.last_save_stats().commit_s);
        if (std::getenv("BENCH_VERBOSE")) std::printf("rep %d tutti write %.2f\n", r, save_w.back());
      } else if (which == 1) {
        run_dd("conv=fsync", dd, r);
      } else {
        run_dd("oflag=direct conv=fsync", dd_direct, r);
      }
    }
    const auto h0 = Clock::now();
    uint64_t acc = 0;
    for (auto& t : s.ts) acc ^= XXH64(t.data(), t.size() * sizeof(float), 0);
    hash.push_back(secs(h0, Clock::now()));
    if (acc == 42) std::printf(" ");
  }
  // The disk is shared with other work: report the best run (what the
  // path can do) beside the median (what it did).
  const double gb = static_cast<double>(bytes) / 1e9;
  auto best = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  std::printf("| what (%d MiB, %d runs) | best s | best GB/s | median s | median GB/s |\n"
              "|---|---:|---:|---:|---:|\n", a.mb, a.reps);
  auto row = [&](const char* what, const std::vector<double>& v) {
    std::printf("| %s | %.2f | %.2f | %.2f | %.2f |\n", what, best(v), gb / best(v), median(v),
                gb / median(v));
  };
  row(m.last_save_stats().direct_io ? "tutti shard (O_DIRECT): hash + write + fsync + rename"
                                    : "tutti shard (buffered): hash + write + fsync + rename",
      save_w);
  row("tutti save, committed (+ manifest, latest, retention)", save_c);
  row("dd bs=4M conv=fsync, same directory", dd);
  row("dd bs=4M oflag=direct conv=fsync, same directory", dd_direct);
  row("xxHash64 of the same bytes (in memory)", hash);
  std::printf("\ntutti / dd write rate: %.2f (best runs), %.2f (medians); "
              "tutti / dd oflag=direct: %.2f (best runs), %.2f (medians)\n",
              best(dd) / best(save_w), median(dd) / median(save_w),
              best(dd_direct) / best(save_w), median(dd_direct) / median(save_w));
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
      const SaveStats st = m.last_save_stats();
      std::printf("rep %d: notice in step %lld, committed %.3f s after the notice "
                  "(snapshot %.2f s, shard write %.2f s, commit %.2f s)\n", r,
                  static_cast<long long>(step), lat.back(), st.snapshot_s, st.write_s,
                  st.commit_s);
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

// T equal float32 tensors of N MiB in all (bench_gpu_recovery's layout).
struct Flat : Stateful {
  std::vector<std::vector<float>> ts;
  Flat(size_t bytes, int n) {
    for (int i = 0; i < n; ++i) {
      ts.emplace_back(bytes / static_cast<size_t>(n) / sizeof(float));
      std::mt19937 g(static_cast<unsigned>(i));
      for (auto& x : ts.back()) x = static_cast<float>(g()) * 1e-9f;
    }
  }
  StateDict state_dict() override {
    StateDict out;
    for (size_t i = 0; i < ts.size(); ++i)
      out.push_back({"t" + std::to_string(i), Tensor::of(ts[i]), {}});
    return out;
  }
};

void bench_load(const Args& a) {
  const size_t bytes = static_cast<size_t>(a.mb) << 20;
  Flat s(bytes, a.tensors);
  Flat src(bytes, a.tensors);  // the memcpy's source, as the files' bytes
  CheckpointOptions o = opts(a.dir + "/load", false);
  o.fresh_start = FreshStart::kAllow;
  CheckpointManager m(world(), o);
  m.save(1, {{"model", &s}});
  std::vector<double> load, copy, hash;
  uint64_t acc = 0;
  for (int r = 0; r < a.reps; ++r) {
    auto t0 = Clock::now();
    if (m.load_latest({{"model", &s}}) != 1) std::fprintf(stderr, "load failed\n");
    load.push_back(secs(t0, Clock::now()));
    t0 = Clock::now();
    for (size_t i = 0; i < s.ts.size(); ++i)
      std::memcpy(s.ts[i].data(), src.ts[i].data(), s.ts[i].size() * sizeof(float));
    copy.push_back(secs(t0, Clock::now()));
    t0 = Clock::now();
    for (auto& t : src.ts) acc ^= XXH64(t.data(), t.size() * sizeof(float), 0);
    hash.push_back(secs(t0, Clock::now()));
  }
  if (acc == 42) std::printf(" ");
  const double l = median(load), c = median(copy), h = median(hash);
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("| state | directory | load_latest ms | GB/s | memcpy ms | xxh64 ms "
              "| load / memcpy | load / (memcpy + xxh64) |\n"
              "|---:|---|---:|---:|---:|---:|---:|---:|\n");
  std::printf("| %d MiB in %d tensors | %s | %.1f | %.2f | %.1f | %.1f | %.2f | %.2f |\n",
              a.mb, a.tensors, a.dir.c_str(), l * 1e3, gb / l, c * 1e3, h * 1e3, l / c,
              l / (c + h));
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
    else if (k == "--tensors") a.tensors = std::max(1, std::stoi(v));
    else if (k == "--direct-io") g_direct = v != "0";
  }
  tutti::init();
  if (world()->rank() == 0) ckpt::make_dirs(a.dir);
  world()->barrier();
  if (a.mode == "blocking") bench_blocking(a);
  else if (a.mode == "throughput") bench_throughput(a);
  else if (a.mode == "notice") bench_notice(a);
  else if (a.mode == "load") bench_load(a);
  else std::fprintf(stderr, "usage: bench_checkpoint blocking|throughput|notice|load [...]\n");
  world()->barrier();
  if (world()->rank() == 0) ckpt::remove_tree(a.dir);
  tutti::shutdown();
  return 0;
}
