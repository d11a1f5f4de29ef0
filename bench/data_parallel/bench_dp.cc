// Data-parallel step benchmark: a synthetic backward pass where each layer's
// work is real GEMMs (the MLP of tests/data_parallel/mlp_model.h, float32,
// OpenBLAS) and gradients become ready layer by layer, as autograd hooks
// fire.  Four measurements of the same model in one process:
//   compute     forward + backward, no reducer
//   comm        the reducer alone: every gradient ready at once, synchronize
//   sequential  forward + backward, then all gradients ready + synchronize
//               (no overlap: what a reducer without hooks does)
//   overlap     forward + backward with grad_ready() from the hooks, then
//               synchronize (tutti's normal path)
// Each step's time is the slowest rank's; we report the median over steps.
//   overlap ratio = (compute + comm - overlap) / min(compute, comm)
// (1: communication fully hidden behind compute; 0: none hidden).
// Output: one JSON object on rank 0's stdout.
//
//   mpiexec -np 2 bench_dp --widths 512,1024,1024,1024,1024,512,16 --batch 32
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
  int steps = 20;
  int warmup = 3;
  double cap_mb = 25;
  double first_mb = 1;
  bool hierarchical = false;
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
    } else if (k == "--hierarchical") {
      a.hierarchical = v == "1";
    } else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

// Median over steps of the slowest rank's step time, in seconds.
double median_of_max(std::vector<double> t) {
  tutti::world()->allreduce(tutti::Tensor::of(t), tutti::ReduceOp::kMax);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

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
  tutti::Reducer reducer(world, o);
  int64_t grad_bytes = 0;
  for (int i = 0; i < model.num_params(); ++i) {
    reducer.add_parameter(model.name(i), model.param(i), model.grad(i));
    grad_bytes += static_cast<int64_t>(model.grad(i).nbytes());
  }
  reducer.build();
  reducer.broadcast_parameters(0);
  const float scale = 1.0f / static_cast<float>(a.batch);
  auto ready = [&](int i) { reducer.grad_ready(i); };
  auto all_ready = [&] {
    for (int i = model.num_params() - 1; i >= 0; --i) reducer.grad_ready(i);
  };
  auto run = [&](auto&& step) {
    std::vector<double> t;
    for (int s = 0; s < a.warmup + a.steps; ++s) {
      world->barrier();
      model.zero_grad();
      const auto t0 = Clock::now();
      step();
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      if (s >= a.warmup) t.push_back(dt);
    }
    return median_of_max(t);
  };
  const double compute = run([&] {
    model.forward_backward(x.data(), y.data(), a.batch, scale, nullptr);
  });
  const double comm = run([&] {
    all_ready();
    reducer.synchronize();
  });
  const double sequential = run([&] {
    model.forward_backward(x.data(), y.data(), a.batch, scale, nullptr);
    all_ready();
    reducer.synchronize();
  });
  const tutti::ReducerStats before = reducer.stats();
  const double overlap = run([&] {
    model.forward_backward(x.data(), y.data(), a.batch, scale, ready);
    reducer.synchronize();
  });
  const tutti::ReducerStats after = reducer.stats();
  const double hidden = (compute + comm - overlap) / std::min(compute, comm);
  const double wait_per_step =
      (after.wait_seconds - before.wait_seconds) / static_cast<double>(after.steps - before.steps);
  if (rank == 0) {
    std::string widths;
    for (size_t i = 0; i < a.widths.size(); ++i) widths += (i ? "," : "") + std::to_string(a.widths[i]);
    std::printf(
        "{\"impl\": \"tutti\", \"ranks\": %d, \"widths\": \"%s\", \"batch_per_rank\": %d, "
        "\"grad_mb\": %.3f, \"buckets\": %zu, \"cap_mb\": %g, \"first_mb\": %g, "
        "\"compute_ms\": %.3f, \"comm_ms\": %.3f, \"sequential_ms\": %.3f, "
        "\"step_ms\": %.3f, \"overlap_ratio\": %.3f, \"sync_wait_ms\": %.3f, "
        "\"samples_per_s\": %.1f}\n",
        n, widths.c_str(), a.batch, grad_bytes / 1048576.0, reducer.buckets().size(), a.cap_mb,
        a.first_mb, compute * 1e3, comm * 1e3, sequential * 1e3, overlap * 1e3, hidden,
        wait_per_step * 1e3, n * a.batch / overlap);
  }
  tutti::shutdown();
  return 0;
}
