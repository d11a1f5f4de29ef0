// Data-parallel training of a small CNN on GPUs: the convolutions run in
// cuDNN (cudnnConvolutionForward / BackwardData / BackwardFilter), the dense
// layers in cuBLAS (cublasSgemm), bias + ReLU, softmax cross-entropy and SGD
// in our own kernels, with a hand-written backward pass for every layer.
// Parameters and gradients are CUDA tensors registered with a
// tutti::Reducer on the world: each layer's gradients are marked ready on
// the model's stream as the backward pass produces them, and NCCL averages
// them in buckets while the earlier layers are still being differentiated.
//
//   mpirun -np 8 build/examples/gpu_cnn/gpu_cnn              # one rank per GPU
//   mpirun -np 1 build/examples/gpu_cnn/gpu_cnn --gpu --check
//   mpirun -np 2 build/examples/gpu_cnn/gpu_cnn --cpu --check  # no GPU needed
//
// Modes: --gpu requires a GPU (exit 77 when none is visible, the ctest
// "skipped" code); --cpu runs the same model on host tensors (im2col + GEMM
// loops) through the same Reducer code path over MPI; without either, the
// GPU is used when every rank has one, else the program says so and falls
// back to the CPU.  Each rank uses device local_rank % device_count and
// NCCL needs one GPU per rank on a node.
//
// The task: 12x12 images of noise with a bright 3x3 blob; the label is the
// blob's quadrant.  Each rank trains on its own batches (fixed seeds); the
// parameters start from rank 0's (broadcast by the reducer).
//
// Checks (non-zero exit when one fails):
//  * --check, before training, on every rank: the backward pass under test
//    against float64 central differences on tiny shapes, every element of
//    every parameter (gradcheck.cc); on the GPU also the full-size GPU
//    gradients against the float32 host model;
//  * the world-average loss falls below half its first value;
//  * the replicas hold bit-identical parameters (hashes all-gathered).
//
// Options: --steps N (default 150), --batch N (per rank, 32), --lr F (0.05),
// --seed N, --log-every N.  Exit codes: 0 passed, 1 a check failed, 2 bad
// usage or GPU setup, 3 a runtime error, 77 --gpu without a GPU.
#include <tutti/tutti.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "cnn.h"

namespace {

using namespace gpu_cnn;

constexpr int kExitCheckFailed = 1, kExitUsage = 2, kExitError = 3, kExitNoGpu = 77;

struct Args {
  enum class Mode { kAuto, kCpu, kGpu } mode = Mode::kAuto;
  bool check = false;
  int steps = 150;
  int batch = 32;
  float lr = 0.05f;
  uint64_t seed = 1;
  int log_every = 25;
};

bool parse(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&](double* v) {
      if (i + 1 >= argc) return false;
      char* end = nullptr;
      *v = std::strtod(argv[++i], &end);
      return end && *end == '\0';
    };
    double v = 0;
    if (k == "--cpu") a->mode = Args::Mode::kCpu;
    else if (k == "--gpu") a->mode = Args::Mode::kGpu;
    else if (k == "--check") a->check = true;
    else if (k == "--steps" && value(&v) && v >= 1) a->steps = static_cast<int>(v);
    else if (k == "--batch" && value(&v) && v >= 1) a->batch = static_cast<int>(v);
    else if (k == "--lr" && value(&v) && v > 0) a->lr = static_cast<float>(v);
    else if (k == "--seed" && value(&v) && v >= 0) a->seed = static_cast<uint64_t>(v);
    else if (k == "--log-every" && value(&v) && v >= 1) a->log_every = static_cast<int>(v);
    else {
      std::fprintf(stderr,
                   "gpu_cnn: bad argument '%s'\nusage: gpu_cnn [--cpu | --gpu] [--check] "
                   "[--steps N] [--batch N] [--lr F] [--seed N] [--log-every N]\n",
                   argv[i]);
      return false;
    }
  }
  return true;
}

// The largest value of `v` over the world (a host all-reduce).
int world_max(int v) {
  int32_t x = v;
  tutti::world()->allreduce(tutti::Tensor::of(&x, 1), tutti::ReduceOp::kMax, {"gpu_cnn status"});
  return x;
}

// Why this rank cannot use a GPU ("" when it can).
std::string gpu_unavailable() {
#if GPU_CNN_CUDA
  const int count = tutti::cuda_device_count();
  if (count == 0) return "no CUDA device is visible";
  if (tutti::local_size() > count)
    return std::to_string(tutti::local_size()) + " ranks on this node but " +
           std::to_string(count) + " GPU(s): NCCL needs one GPU per rank";
  return "";
#else
  return "this build of gpu_cnn has no CUDA (tutti or cuDNN was built/found without it)";
#endif
}

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const unsigned char* b = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

std::unique_ptr<Model> make_model(bool gpu, const Dims& d) {
#if GPU_CNN_CUDA
  if (gpu) return make_gpu_model(d, tutti::local_rank() % tutti::cuda_device_count());
#endif
  (void)gpu;
  return make_cpu_model(d);
}

// The --check verifications on this rank (see gradcheck.cc).
bool run_checks(bool gpu, Model& model, bool log) {
  auto tiny = make_model(gpu, tiny_dims());
  bool ok = gradient_check(*tiny, log);
  if (gpu) {
    auto host = make_cpu_model(model.dims());
    ok = compare_models(model, *host, log) && ok;
  }
  return ok;
}

int train(const Args& args) {
  auto world = tutti::world();
  const int rank = world->rank(), size = world->size();
  const bool log = rank == 0;

  // ---- which device: every rank must take the same decision (the reducer
  // needs the same device type everywhere).
  bool gpu = false;
  if (args.mode != Args::Mode::kCpu) {
    const std::string why = gpu_unavailable();
    const bool all_have_gpu = world_max(why.empty() ? 0 : 1) == 0;
    if (!why.empty()) std::fprintf(stderr, "gpu_cnn: rank %d: %s\n", rank, why.c_str());
    if (args.mode == Args::Mode::kGpu && !all_have_gpu) {
      if (log) std::printf("gpu_cnn: --gpu but not every rank has a GPU: skipping (exit 77)\n");
      return kExitNoGpu;
    }
    gpu = all_have_gpu;
    if (!gpu && log)
      std::printf("gpu_cnn: no usable GPU on every rank: falling back to the CPU model "
                  "(host tensors, MPI)\n");
  }

  Dims dims;
  dims.batch = args.batch;

  // ---- build the model and verify it; a failure on any rank stops all.
  std::unique_ptr<Model> model;
  int status = 0;
  try {
    dims.validate();
    model = make_model(gpu, dims);
    if (log)
      std::printf("gpu_cnn: %d rank(s) on %s\n  model %s\n", size, model->describe().c_str(),
                  dims.str().c_str());
    if (args.check && !run_checks(gpu, *model, log)) {
      std::fprintf(stderr, "gpu_cnn: rank %d: --check FAILED\n", rank);
      status = kExitCheckFailed;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_cnn: rank %d: setup failed: %s\n", rank, e.what());
    status = gpu ? kExitUsage : kExitError;
  }
  status = world_max(status);
  if (status != 0) return status;

  // ---- data parallel: every rank starts from rank 0's parameters.
  const ParamLayout& layout = model->layout();
  model->set_params(init_params(layout, mix_seed(args.seed, 1000 + rank)));
  tutti::Reducer reducer(world, tutti::ReducerOptions::from_env());
  for (int i = 0; i < kNumParams; ++i)
    reducer.add_parameter(layout.slots[i].name, model->param(i), model->grad(i));
  reducer.build();
  void* stream = model->stream();
  reducer.broadcast_parameters(0, stream);

  double first_loss = 0, loss = 0;
  for (int step = 0; step < args.steps; ++step) {
    const Batch batch = make_batch(dims, mix_seed(args.seed, (uint64_t(step) << 20) + rank));
    // Each layer's gradients go to the reducer as soon as they are final on
    // the stream; buckets are all-reduced while backward continues.
    model->forward_backward(batch, [&](int i) { reducer.grad_ready(i, stream); });
    if (!reducer.synchronize(stream)) {
      std::fprintf(stderr, "gpu_cnn: rank %d: the reducer did not reduce\n", rank);
      return kExitError;
    }
    model->sgd_step(args.lr);
    loss = model->loss();
    world->allreduce(tutti::Tensor::of(&loss, 1), tutti::ReduceOp::kAvg, {"loss"});
    if (step == 0) first_loss = loss;
    if (log && (step % args.log_every == 0 || step == args.steps - 1))
      std::printf("step %4d  loss %.4f\n", step, loss);
  }

  // ---- the replicas must hold the same bits.
  const std::vector<float> params = model->params_host();
  uint64_t hash = fnv1a(params.data(), params.size() * sizeof(float));
  std::vector<uint64_t> hashes(static_cast<size_t>(size));
  world->allgather(tutti::Tensor(&hash, tutti::DType::kInt64, tutti::Shape{1}),
                   tutti::Tensor(hashes.data(), tutti::DType::kInt64, tutti::Shape{size}));
  bool identical = true;
  for (uint64_t h : hashes) identical = identical && h == hashes[0];
  bool finite = true;
  for (float p : params) finite = finite && std::isfinite(p);
  const bool learned = std::isfinite(loss) && loss < 0.5 * first_loss;
  const tutti::ReducerStats st = reducer.stats();
  if (log) {
    std::printf("reducer: %lld steps, %zu bucket(s), %lld bucket all-reduces (%lld launched "
                "during backward)\n",
                static_cast<long long>(st.steps), reducer.buckets().size(),
                static_cast<long long>(st.buckets_reduced),
                static_cast<long long>(st.buckets_launched_early));
    std::printf("loss %.4f -> %.4f (%s); data-parallel replicas %s%s\n", first_loss, loss,
                learned ? "learned" : "DID NOT LEARN", identical ? "identical" : "DIFFER",
                finite ? "" : "; NON-FINITE parameters");
  }
  return learned && identical && finite ? 0 : kExitCheckFailed;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines as they happen under mpirun
  Args args;
  if (!parse(argc, argv, &args)) return kExitUsage;
  try {
    tutti::init();
    int rc = train(args);
    tutti::shutdown();
    return rc;
  } catch (const std::exception& e) {
    // Mid-training errors (a failed collective, a CUDA fault): other ranks
    // fail too (tutti's timeout) and mpirun reports the exit code.
    std::fprintf(stderr, "gpu_cnn: rank %d: error: %s\n", tutti::initialized() ? tutti::rank() : -1,
                 e.what());
    return kExitError;
  }
}
