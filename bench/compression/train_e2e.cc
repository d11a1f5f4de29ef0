// End-to-end benchmark: data-parallel training of an MLP (tests/compression/
// mlp.h) with one compressor, timed until the training loss reaches a
// target.  Run one rank per host, e.g. on the network-namespace cluster of
// scripts/netns_cluster.sh with a tc rate limit:
//
//   scripts/netns_cluster.sh up 2 --rate 1gbit
//   scripts/netns_cluster.sh run -- -x OPENBLAS_NUM_THREADS=1 \
//       build/bench/compression/bench_compression_train --compressor powersgd
//
// Before training it times all-reduces of a probe buffer (the link's
// algorithm bandwidth, and bus bandwidth = algbw * 2(W-1)/W, the per-rank
// wire rate of a ring all-reduce).  Rank 0 prints progress and one RESULT
// line: steps and seconds until the loss (an exponential moving average of
// the rank-averaged training loss) first reaches the target, seconds per
// step, and the compressor's wire bytes per step.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "compression/mlp.h"
#include "tutti/tutti.h"

namespace {

struct Args {
  std::string compressor = "none";
  std::vector<int64_t> sizes = {1024, 4096, 4096, 10};
  int64_t batch = 32;
  float lr = 0.01f;
  float momentum = 0.9f;
  int64_t max_steps = 600;
  double target = 0.5;
  double ema = 0.9;
  double bucket_mb = 25;
  double probe_mb = 32;
  int64_t print_every = 20;
};

void usage(const char* msg) {
  std::fprintf(stderr,
               "%s\nusage: bench_compression_train [--compressor NAME] "
               "[--sizes 1024,4096,4096,10] [--batch 32] [--lr 0.01] "
               "[--momentum 0.9] [--max-steps 600] [--target 0.5] [--ema 0.9] "
               "[--bucket-mb 25] [--probe-mb 32] [--print-every 20]\n"
               "Compressor options come from TUTTI_* settings "
               "(TUTTI_TOPK_RATIO, TUTTI_POWERSGD_RANK, ...).\n",
               msg);
}

// False (after printing why) on a bad command line.
bool parse(int argc, char** argv, Args* out) {
  Args& a = *out;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      usage(("missing value for " + k).c_str());
      return false;
    }
    const char* v = argv[++i];
    if (k == "--compressor") a.compressor = v;
    else if (k == "--sizes") {
      a.sizes.clear();
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) a.sizes.push_back(std::atoll(item.c_str()));
      if (a.sizes.size() < 2) {
        usage("--sizes needs at least inputs,classes");
        return false;
      }
    } else if (k == "--batch") a.batch = std::atoll(v);
    else if (k == "--lr") a.lr = std::strtof(v, nullptr);
    else if (k == "--momentum") a.momentum = std::strtof(v, nullptr);
    else if (k == "--max-steps") a.max_steps = std::atoll(v);
    else if (k == "--target") a.target = std::strtod(v, nullptr);
    else if (k == "--ema") a.ema = std::strtod(v, nullptr);
    else if (k == "--bucket-mb") a.bucket_mb = std::strtod(v, nullptr);
    else if (k == "--probe-mb") a.probe_mb = std::strtod(v, nullptr);
    else if (k == "--print-every") a.print_every = std::atoll(v);
    else {
      usage(("unknown option " + k).c_str());
      return false;
    }
  }
  return true;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, &a)) return 2;
  tutti::init();
  auto w = tutti::world();
  const int rank = w->rank(), size = w->size();

  // Link probe: the best of 3 timed all-reduces (after one warm-up).
  double best = 1e30;
  if (a.probe_mb > 0 && size > 1) {
    std::vector<float> probe(static_cast<size_t>(a.probe_mb * 262144), 1.0f);
    for (int i = 0; i < 4; ++i) {
      w->barrier();
      const double t0 = now();
      w->allreduce(tutti::Tensor::of(probe), tutti::ReduceOp::kSum);
      if (i > 0) best = std::min(best, now() - t0);
    }
  }
  const double probe_bytes = a.probe_mb * 1048576.0;
  const double algbw = size > 1 ? probe_bytes / best / 1e9 : 0;
  const double busbw = algbw * 2.0 * (size - 1) / size;

  auto comp = tutti::make_compressor(a.compressor);
  tutti::test::TrainOptions o;
  o.sizes = a.sizes;
  o.batch = a.batch;
  o.steps = a.max_steps;
  o.lr = a.lr;
  o.lr_decay = false;
  o.momentum = a.momentum;
  o.bucket_cap_bytes = static_cast<int64_t>(a.bucket_mb * 1048576.0);
  o.eval_samples = 0;
  int64_t params = 0;
  for (size_t l = 0; l + 1 < a.sizes.size(); ++l) params += a.sizes[l] * a.sizes[l + 1] + a.sizes[l + 1];
  if (rank == 0)
    std::printf("world %d, compressor %s, MLP %zu layers, %lld parameters (%.1f MB), "
                "batch %lld/rank, lr %g, momentum %g, target loss %g (EMA %g)\n"
                "link probe: all-reduce of %.0f MB in %.3f s: algbw %.3f GB/s, "
                "busbw %.3f GB/s (%.2f Gbit/s per rank)\n",
                size, a.compressor.c_str(), a.sizes.size() - 1,
                static_cast<long long>(params), params * 4 / 1e6,
                static_cast<long long>(a.batch), a.lr, a.momentum, a.target, a.ema,
                a.probe_mb, size > 1 ? best : 0.0, algbw, busbw, busbw * 8);

  w->barrier();
  const double t0 = now();
  double ema = -1, t_target = -1;
  int64_t s_target = -1, steps_run = 0;
  o.on_step = [&](int64_t step, float loss) {
    ema = ema < 0 ? loss : a.ema * ema + (1 - a.ema) * loss;
    steps_run = step + 1;
    if (rank == 0 && a.print_every > 0 && step % a.print_every == 0)
      std::printf("  step %5lld  %8.2f s  loss %.4f  ema %.4f\n",
                  static_cast<long long>(step), now() - t0, loss, ema);
    if (ema <= a.target && s_target < 0) {
      s_target = step + 1;
      t_target = now() - t0;
      return true;
    }
    return false;
  };
  tutti::test::train(comp, w, o);
  const double total = now() - t0;
  const tutti::CompressStats st = comp->stats();
  if (rank == 0) {
    std::printf("RESULT compressor=%s world=%d reached=%s steps_to_target=%lld "
                "seconds_to_target=%.2f steps_run=%lld seconds=%.2f sec_per_step=%.4f "
                "final_ema=%.4f wire_MB_per_step=%.3f uncompressed_MB_per_step=%.3f "
                "encode_s_per_step=%.4f comm_s_per_step=%.4f decode_s_per_step=%.4f "
                "busbw_GBps=%.3f\n",
                a.compressor.c_str(), size, s_target > 0 ? "yes" : "no",
                static_cast<long long>(s_target), t_target,
                static_cast<long long>(steps_run), total, total / steps_run, ema,
                st.wire_bytes / 1e6 / steps_run, st.uncompressed_bytes / 1e6 / steps_run,
                st.encode_seconds / steps_run, st.comm_seconds / steps_run,
                st.decode_seconds / steps_run, busbw);
    std::fflush(stdout);
  }
  tutti::shutdown();
  return 0;
}
