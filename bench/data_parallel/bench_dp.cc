// Data-parallel step benchmark: a synthetic backward pass where each layer's
// work is real GEMMs (the MLP of tests/data_parallel/mlp_model.h, float32,
// OpenBLAS) and gradients become ready layer by layer, as autograd hooks
// fire.  One process measures four phases of the same model, INTERLEAVED
// (measured iteration k runs phase k mod 4), so that load from other
// processes hits every phase alike and the phases can be compared:
//   step        forward + backward with grad_ready() from the hooks, then
//               synchronize() (tutti's normal, overlapped path)
//   compute     forward + backward under no_sync() (hooks fire, nothing is
//               reduced: the compute the step has to hide communication in)
//   comm        the reducer alone: every gradient ready at once, then
//               synchronize() (the same buckets' all-reduces and write-back)
//   sequential  forward + backward, then all gradients ready + synchronize
//               (no overlap: what a reducer without hooks does)
// Each iteration's time is the slowest rank's (a barrier starts each); each
// phase's figure is the median over its iterations.
//   overlap ratio = (compute + comm - step) / min(compute, comm)
// (1: communication fully hidden behind compute; 0: none hidden).
// Output: one JSON object on rank 0's stdout.
// --only PHASE (step, compute, comm or sequential) runs that phase alone,
// for profiling it (perf record -a while it runs); no ratio then.
//
// --bucket-view 1: ReducerOptions::gradient_as_bucket_view (DDP's
// gradient_as_bucket_view=True on the DDP side, ddp_peer.py).
//
//   mpiexec -np 2 bench_dp --widths 512,1024,1024,1024,1024,512,16 --batch 32
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "data_parallel/mlp_model.h"
#include "tutti/data_parallel.h"
#include "tutti/tutti.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::vector<int> widths = {512, 1024, 1024, 1024, 1024, 512, 16};
  int batch = 32;  // per rank
  int steps = 20;  // measured iterations per phase
  int warmup = 2;  // unmeasured cycles of all four phases
  double cap_mb = 25;
  double first_mb = 1;
  bool hierarchical = false;
  int only = -1;  // --only: run this phase alone
  bool bucket_view = false;  // --bucket-view 1: gradient_as_bucket_view
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--widths") {
      a.widths.clear();
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) a.widths.push_back(std::atoi(item.c_str()));
    } else if (k == "--batch") {
      a.batch = std::atoi(v.c_str());
    } else if (k == "--steps") {
      a.steps = std::atoi(v.c_str());
    } else if (k == "--warmup") {
      a.warmup = std::atoi(v.c_str());
    } else if (k == "--cap-mb") {
      a.cap_mb = std::atof(v.c_str());
    } else if (k == "--first-mb") {
      a.first_mb = std::atof(v.c_str());
    } else if (k == "--only") {
      const char* names[] = {"step", "compute", "comm", "sequential"};
      for (int p = 0; p < 4; ++p)
        if (v == names[p]) a.only = p;
      if (a.only < 0) {
        std::fprintf(stderr, "--only takes step, compute, comm or sequential\n");
        std::exit(2);
      }
    } else if (k == "--bucket-view") {
      a.bucket_view = v == "1";
    } else if (k == "--hierarchical") {
      a.hierarchical = v == "1";
    } else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  if (a.steps < 1 || a.batch < 1 || a.widths.size() < 2) {
    std::fprintf(stderr, "need --steps >= 1, --batch >= 1, two or more widths\n");
    std::exit(2);
  }
  return a;
}

double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

// CPU seconds of this process (every thread: compute, tutti's progress
// threads, MPI's), to show what communicating costs the cores.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

enum Phase { kStep, kCompute, kComm, kSequential, kPhases };

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  tutti::init();
  auto world = tutti::world();
  const int rank = world->rank(), n = world->size();
  tutti::test::Mlp<float> model(a.widths, 42);
  std::vector<float> x, y;
  tutti::test::make_samples<float>(static_cast<int64_t>(rank) * a.batch, a.batch, a.widths.front(),
                                   a.widths.back(), &x, &y);
  tutti::ReducerOptions o;
  o.bucket_cap_mb = a.cap_mb;
  o.first_bucket_cap_mb = a.first_mb;
  o.hierarchical = a.hierarchical;
  o.gradient_as_bucket_view = a.bucket_view;
  o.launch_channels = tutti::ReducerOptions::from_env().launch_channels;  // TUTTI_DP_LAUNCH_CHANNELS
  tutti::Reducer reducer(world, o);
  int64_t grad_bytes = 0;
  for (int i = 0; i < model.num_params(); ++i) {
    reducer.add_parameter(model.name(i), model.param(i), model.grad(i));
    grad_bytes += static_cast<int64_t>(model.grad(i).nbytes());
  }
  reducer.build();
  // Bucket views: the backward pass writes each gradient straight into its
  // bucket slice (no copy in, none out).  The slices move when the first
  // reducing step re-plans the buckets, so they are re-read every iteration.
  auto bind_views = [&] {
    if (!a.bucket_view) return;
    for (int i = 0; i < model.num_params(); ++i)
      model.use_grad_storage(i, static_cast<float*>(reducer.gradient(i).data()));
  };
  bind_views();
  reducer.broadcast_parameters(0);
  const float scale = 1.0f / static_cast<float>(a.batch);
  auto ready = [&](int i) { reducer.grad_ready(i); };
  auto all_ready = [&] {
    for (int i = model.num_params() - 1; i >= 0; --i) reducer.grad_ready(i);
  };
  auto backward = [&](const std::function<void(int)>& hook) {
    model.forward_backward(x.data(), y.data(), a.batch, scale, hook);
  };
  // The step phase's backward (hooks launching buckets) alone: compared with
  // the compute phase it shows what concurrent communication costs compute.
  double step_backward_s = 0;
  auto run_phase = [&](int phase) {
    switch (phase) {
      case kStep: {
        const auto t0 = Clock::now();
        backward(ready);
        step_backward_s = std::chrono::duration<double>(Clock::now() - t0).count();
        reducer.synchronize();
        break;
      }
        break;
      case kCompute: {
        auto guard = reducer.no_sync();
        backward(ready);
        reducer.synchronize();  // returns false: nothing reduced
        break;
      }
      case kComm:
        all_ready();
        reducer.synchronize();
        break;
      case kSequential:
        backward(nullptr);
        all_ready();
        reducer.synchronize();
        break;
    }
  };
  // The first reducing step learns the bucket order (a re-plan): outside
  // the measurement, like the warm-up cycles.
  // Per phase, per measured iteration: wall time (max over ranks, below),
  // then CPU time (this rank), then the step's backward and wait.
  const size_t per = static_cast<size_t>(kPhases * a.steps);
  std::vector<double> times(per), cpu(per), bwd(static_cast<size_t>(a.steps)),
      wait(static_cast<size_t>(a.steps));
  for (int it = 0; it < kPhases * (a.warmup + a.steps); ++it) {
    const int phase = it % kPhases;
    if (a.only >= 0 && phase != a.only) continue;
    world->barrier();
    bind_views();
    model.zero_grad();
    const tutti::ReducerStats before = reducer.stats();
    const double c0 = cpu_seconds();
    const auto t0 = Clock::now();
    run_phase(phase);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const double dc = cpu_seconds() - c0;
    const int k = it - kPhases * a.warmup;
    if (k < 0) continue;
    const size_t slot = static_cast<size_t>(phase * a.steps + k / kPhases);
    times[slot] = dt;
    cpu[slot] = dc;
    if (phase == kStep) {
      bwd[static_cast<size_t>(k / kPhases)] = step_backward_s;
      wait[static_cast<size_t>(k / kPhases)] =
          reducer.stats().wait_seconds - before.wait_seconds;
    }
  }
  world->allreduce(tutti::Tensor::of(times), tutti::ReduceOp::kMax);
  double med[kPhases], med_cpu[kPhases];
  for (int p = 0; p < kPhases; ++p) {
    med[p] = median(std::vector<double>(times.begin() + p * a.steps,
                                        times.begin() + (p + 1) * a.steps));
    med_cpu[p] = median(std::vector<double>(cpu.begin() + p * a.steps,
                                            cpu.begin() + (p + 1) * a.steps));
  }
  const double compute = med[kCompute], comm = med[kComm], step = med[kStep];
  const double hidden = compute + comm - step;
  if (rank == 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", hidden / std::min(compute, comm));
    const std::string ratio = a.only >= 0 ? "null" : buf;
    // --only comm or compute leaves the step phase unmeasured: no throughput.
    char sps[32] = "null";
    if (step > 0) std::snprintf(sps, sizeof sps, "%.1f", n * a.batch / step);
    std::string widths;
    for (size_t i = 0; i < a.widths.size(); ++i) widths += (i ? "," : "") + std::to_string(a.widths[i]);
    std::printf(
        "{\"impl\": \"tutti\", \"bucket_view\": %s, \"ranks\": %d, \"widths\": \"%s\", \"batch_per_rank\": %d, "
        "\"grad_mb\": %.3f, \"buckets\": %zu, \"cap_mb\": %g, \"first_mb\": %g, \"steps\": %d, "
        "\"compute_ms\": %.3f, \"comm_ms\": %.3f, \"sequential_ms\": %.3f, "
        "\"step_ms\": %.3f, \"hidden_ms\": %.3f, \"overlap_ratio\": %s, \"sync_wait_ms\": %.3f, "
        "\"step_backward_ms\": %.3f, \"cpu_ms\": {\"step\": %.1f, \"compute\": %.1f, "
        "\"comm\": %.1f}, \"samples_per_s\": %s}\n",
        a.bucket_view ? "true" : "false", n, widths.c_str(), a.batch, grad_bytes / 1048576.0, reducer.buckets().size(), a.cap_mb,
        a.first_mb, a.steps, compute * 1e3, comm * 1e3, med[kSequential] * 1e3, step * 1e3,
        hidden * 1e3, ratio.c_str(), median(wait) * 1e3,
        median(bwd) * 1e3, med_cpu[kStep] * 1e3, med_cpu[kCompute] * 1e3, med_cpu[kComm] * 1e3,
        sps);
  }
  tutti::shutdown();
  return 0;
}
