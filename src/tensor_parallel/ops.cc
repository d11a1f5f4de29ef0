#include "tensor_parallel/ops.h"

#include "core/check.h"
#include "core/cuda_utils.h"
#include "tensor_parallel/cpu_kernels.h"

#if TUTTI_WITH_CUDA
#include <memory>
#include <mutex>

#include "core/stream_cache.h"
#include "kernels/tensor_parallel_linear.h"
#include "kernels/tensor_parallel_vocab.h"
#endif

namespace tutti {
namespace tp {
namespace {

// True when the op runs on CUDA; checks that every tensor is on `first`'s
// device.
bool on_cuda(const char* what, std::initializer_list<const Tensor*> ts) {
  const Device d = (*ts.begin())->device();
  for (const Tensor* t : ts)
    TUTTI_CHECK(t->device() == d, what, ": ", t->str(), " is not on ", d.str());
  if (!d.is_cuda()) return false;
#if !TUTTI_WITH_CUDA
  TUTTI_THROW(kUnsupported, what, " on ", d.str(),
              ": this build of tutti has no CUDA support");
#endif
  return true;
}

void check_f32(const Tensor& t, const char* what) {
  TUTTI_CHECK(t.dtype() == DType::kFloat32, what, ": ", t.str(),
              " is not float32");
}

#if TUTTI_WITH_CUDA
cudaStream_t cs(void* s) { return static_cast<cudaStream_t>(s); }
#define TP_CUDA_CALL(device, call)       \
  do {                                   \
    cuda::DeviceGuard tp_guard_(device); \
    call;                                \
  } while (0)
#else
#define TP_CUDA_CALL(device, call) (void)0
#endif

}  // namespace

void bias_add(const Tensor& out2d, const Tensor& bias, void* stream) {
  TUTTI_CHECK(out2d.ndim() == 2 && bias.numel() == out2d.shape()[1] &&
                  bias.dtype() == out2d.dtype(),
              "bias_add ", bias.str(), " to ", out2d.str());
  const int64_t rows = out2d.shape()[0], cols = out2d.shape()[1];
  if (on_cuda("bias_add", {&out2d, &bias}))
    TP_CUDA_CALL(
        out2d.device().index,
        kernels::launch_bias_add(out2d.data(), bias.data(), out2d.dtype(), rows,
                                 cols, cs(stream)));
  else
    cpu::bias_add(out2d.data(), bias.data(), out2d.dtype(), rows, cols);
}

void bias_grad(const Tensor& dy2d, const Tensor& db, void* stream) {
  TUTTI_CHECK(dy2d.ndim() == 2 && db.numel() == dy2d.shape()[1] &&
                  db.dtype() == dy2d.dtype(),
              "bias_grad of ", dy2d.str(), " into ", db.str());
  const int64_t rows = dy2d.shape()[0], cols = dy2d.shape()[1];
  if (on_cuda("bias_grad", {&dy2d, &db}))
    TP_CUDA_CALL(db.device().index,
                 kernels::launch_bias_grad(dy2d.data(), db.data(), db.dtype(),
                                           rows, cols, cs(stream)));
  else
    cpu::bias_grad(dy2d.data(), db.data(), db.dtype(), rows, cols);
}

#if TUTTI_WITH_CUDA
namespace {
// Scratch of sum_squares() on one (device, stream), grow-only.
struct SumSquaresScratch {
  cuda::DeviceBuffer partials;  // double[count * kSumSquaresMaxPartials]
  cuda::DeviceBuffer blocks;    // int32[count]
  cuda::DeviceBuffer results;   // double[count]
  size_t capacity = 0;          // tensors the buffers hold
};
}  // namespace
#endif

void sum_squares(const std::vector<Tensor>& xs, double* out, void* stream) {
  if (xs.empty()) return;
  const Device d = xs.front().device();
  for (const Tensor& x : xs)
    TUTTI_CHECK(x.device() == d, "sum_squares: ", x.str(), " is not on ",
                d.str(), " like the first tensor");
  if (!on_cuda("sum_squares", {&xs.front()})) {
    for (size_t t = 0; t < xs.size(); ++t)
      out[t] = cpu::sum_squares(xs[t].data(), xs[t].dtype(), xs[t].numel());
    return;
  }
#if TUTTI_WITH_CUDA
  static StreamCache<SumSquaresScratch>* cache =
      new StreamCache<SumSquaresScratch>();  // kept for the process
  const int dev = d.index;
  cuda::DeviceGuard g(dev);
  auto& entry = cache->get(dev, stream,
                           [] { return std::make_unique<SumSquaresScratch>(); });
  std::lock_guard<std::mutex> lock(entry.mu);
  SumSquaresScratch& s = *entry.value;
  const size_t count = xs.size();
  if (s.capacity < count) {
    // Growth only (a longer parameter list); freeing the old buffers waits
    // for the device (cudaFree), so no queued launch still uses them.
    s.partials = cuda::DeviceBuffer(
        dev, count * kernels::kSumSquaresMaxPartials * sizeof(double));
    s.blocks = cuda::DeviceBuffer(dev, count * sizeof(int32_t));
    s.results = cuda::DeviceBuffer(dev, count * sizeof(double));
    s.capacity = count;
  }
  auto* partials = static_cast<double*>(s.partials.data());
  auto* blocks = static_cast<int32_t*>(s.blocks.data());
  auto* results = static_cast<double*>(s.results.data());
  for (size_t t = 0; t < count; ++t)
    kernels::launch_sum_squares_partials(
        xs[t].data(), xs[t].dtype(), xs[t].numel(),
        partials + t * kernels::kSumSquaresMaxPartials, blocks + t, cs(stream));
  kernels::launch_sum_squares_finish(partials, blocks,
                                     static_cast<int64_t>(count), results,
                                     cs(stream));
  TUTTI_CUDA_CHECK(cudaMemcpyAsync(out, results, count * sizeof(double),
                                   cudaMemcpyDeviceToHost, cs(stream)));
  TUTTI_CUDA_CHECK(cudaStreamSynchronize(cs(stream)));  // the one sync
#endif
}

void embedding_lookup(const Tensor& ids, const Tensor& weight,
                      int64_t vocab_start, const Tensor& out2d, void* stream) {
  TUTTI_CHECK(weight.ndim() == 2 && out2d.ndim() == 2 &&
                  out2d.shape()[0] == ids.numel() &&
                  out2d.shape()[1] == weight.shape()[1] &&
                  out2d.dtype() == weight.dtype(),
              "embedding_lookup of ", ids.str(), " in ", weight.str(), " into ",
              out2d.str());
  const int64_t n = ids.numel(), dim = weight.shape()[1],
                rows = weight.shape()[0];
  if (on_cuda("embedding_lookup", {&ids, &weight, &out2d}))
    TP_CUDA_CALL(out2d.device().index,
                 kernels::launch_embedding_lookup(
                     ids.data(), ids.dtype(), weight.data(), weight.dtype(), n,
                     dim, vocab_start, rows, out2d.data(), cs(stream)));
  else
    cpu::embedding_lookup(ids.data(), ids.dtype(), weight.data(),
                          weight.dtype(), n, dim, vocab_start, rows,
                          out2d.data());
}

void embedding_grad(const Tensor& ids, const Tensor& dy2d, int64_t vocab_start,
                    const Tensor& dweight, const Tensor& acc32, void* stream) {
  const bool needs_acc = dweight.dtype() != DType::kFloat32;
  TUTTI_CHECK(!needs_acc || (acc32.dtype() == DType::kFloat32 &&
                             acc32.numel() == dweight.numel() &&
                             acc32.device() == dweight.device()),
              "embedding_grad into ", dweight.str(), " needs a float32 "
              "accumulator of the same shape on its device, got ", acc32.str());
  float* acc = needs_acc ? acc32.data_as<float>() : nullptr;
  TUTTI_CHECK(dweight.ndim() == 2 && dy2d.ndim() == 2 &&
                  dy2d.shape()[0] == ids.numel() &&
                  dy2d.shape()[1] == dweight.shape()[1] &&
                  dy2d.dtype() == dweight.dtype(),
              "embedding_grad of ", dy2d.str(), " into ", dweight.str());
  const int64_t n = ids.numel(), dim = dweight.shape()[1],
                rows = dweight.shape()[0];
  if (on_cuda("embedding_grad", {&ids, &dy2d, &dweight}))
    TP_CUDA_CALL(dweight.device().index,
                 kernels::launch_embedding_grad(
                     ids.data(), ids.dtype(), dy2d.data(), dy2d.dtype(), n, dim,
                     vocab_start, rows, dweight.data(), acc, cs(stream)));
  else
    cpu::embedding_grad(ids.data(), ids.dtype(), dy2d.data(), dy2d.dtype(), n,
                        dim, vocab_start, rows, dweight.data(), acc);
}

void ce_local_max(const Tensor& logits2d, const Tensor& max, void* stream) {
  check_f32(max, "ce_local_max");
  TUTTI_CHECK(logits2d.ndim() == 2 && max.numel() == logits2d.shape()[0],
              "ce_local_max of ", logits2d.str(), " into ", max.str());
  const int64_t n = logits2d.shape()[0], v = logits2d.shape()[1];
  if (on_cuda("ce_local_max", {&logits2d, &max}))
    TP_CUDA_CALL(max.device().index, kernels::launch_ce_local_max(
                                         logits2d.data(), logits2d.dtype(), n,
                                         v, max.data_as<float>(), cs(stream)));
  else
    cpu::ce_local_max(logits2d.data(), logits2d.dtype(), n, v,
                      max.data_as<float>());
}

void ce_local_sums(const Tensor& logits2d, const Tensor& targets,
                   int64_t v_start, int64_t ignore_index, const Tensor& max,
                   const Tensor& stats, void* stream) {
  check_f32(max, "ce_local_sums");
  check_f32(stats, "ce_local_sums");
  const int64_t n = logits2d.shape()[0], v = logits2d.shape()[1];
  TUTTI_CHECK(
      targets.numel() == n && max.numel() == n && stats.numel() == 2 * n,
      "ce_local_sums of ", logits2d.str(), " with ", targets.str(), " into ",
      stats.str());
  if (on_cuda("ce_local_sums", {&logits2d, &targets, &max, &stats}))
    TP_CUDA_CALL(stats.device().index,
                 kernels::launch_ce_local_sums(
                     logits2d.data(), logits2d.dtype(), targets.data(),
                     targets.dtype(), n, v, v_start, ignore_index,
                     max.data_as<float>(), stats.data_as<float>(), cs(stream)));
  else
    cpu::ce_local_sums(logits2d.data(), logits2d.dtype(), targets.data(),
                       targets.dtype(), n, v, v_start, ignore_index,
                       max.data_as<float>(), stats.data_as<float>());
}

void ce_finalize(const Tensor& stats, const Tensor& targets, int64_t vocab,
                 int64_t ignore_index, const Tensor& losses,
                 const Tensor& mean_count, void* stream) {
  check_f32(stats, "ce_finalize");
  check_f32(losses, "ce_finalize");
  check_f32(mean_count, "ce_finalize");
  const int64_t n = targets.numel();
  TUTTI_CHECK(
      stats.numel() == 2 * n && losses.numel() == n && mean_count.numel() == 2,
      "ce_finalize of ", stats.str(), " into ", losses.str());
  if (on_cuda("ce_finalize", {&stats, &targets, &losses, &mean_count}))
    TP_CUDA_CALL(stats.device().index,
                 kernels::launch_ce_finalize(
                     stats.data_as<float>(), targets.data(), targets.dtype(), n,
                     vocab, ignore_index, losses.data_as<float>(),
                     mean_count.data_as<float>(), cs(stream)));
  else
    cpu::ce_finalize(stats.data_as<float>(), targets.data(), targets.dtype(), n,
                     vocab, ignore_index, losses.data_as<float>(),
                     mean_count.data_as<float>());
}

void ce_backward(const Tensor& logits2d, const Tensor& targets, int64_t v_start,
                 int64_t ignore_index, const Tensor& max, const Tensor& stats,
                 const Tensor& mean_count, float grad_scale,
                 const Tensor& grad2d, void* stream) {
  const int64_t n = logits2d.shape()[0], v = logits2d.shape()[1];
  TUTTI_CHECK(grad2d.shape() == logits2d.shape() &&
                  grad2d.dtype() == logits2d.dtype() && targets.numel() == n &&
                  max.numel() == n && stats.numel() == 2 * n &&
                  mean_count.numel() == 2,
              "ce_backward of ", logits2d.str(), " into ", grad2d.str());
  if (on_cuda("ce_backward",
              {&logits2d, &targets, &max, &stats, &mean_count, &grad2d}))
    TP_CUDA_CALL(
        grad2d.device().index,
        kernels::launch_ce_backward(
            logits2d.data(), logits2d.dtype(), targets.data(), targets.dtype(),
            n, v, v_start, ignore_index, max.data_as<float>(),
            stats.data_as<float>(), mean_count.data_as<float>(), grad_scale,
            grad2d.data(), cs(stream)));
  else
    cpu::ce_backward(logits2d.data(), logits2d.dtype(), targets.data(),
                     targets.dtype(), n, v, v_start, ignore_index,
                     max.data_as<float>(), stats.data_as<float>(),
                     mean_count.data_as<float>(), grad_scale, grad2d.data());
}

}  // namespace tp
}  // namespace tutti
