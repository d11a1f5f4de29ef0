// Vocabulary-parallel embedding lookup/gradient and cross-entropy pieces.
// CPU twins: src/tensor_parallel/cpu_kernels.cc.
#include "kernels/tensor_parallel_device.h"
#include "kernels/tensor_parallel_vocab.h"

namespace tutti {
namespace kernels {
namespace {

using tpdev::from_float;
using tpdev::index_at;
using tpdev::to_float;

#define TP_GRID_STRIDE(i, n)                                            \
  for (int64_t i =                                                      \
           blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <typename T, typename I>
__global__ void embedding_lookup_kernel(const void* ids, const T* w, int64_t n,
                                        int64_t dim, int64_t start,
                                        int64_t local_rows, T* out) {
  TP_GRID_STRIDE(k, n * dim) {
    const int64_t local = index_at<I>(ids, k / dim) - start;
    out[k] = local >= 0 && local < local_rows ? w[local * dim + k % dim]
                                              : from_float<T>(0.0f);
  }
}

// Float32 scatter-add (the order of the atomics varies, each add rounds
// in float32).
template <typename T, typename I>
__global__ void embedding_grad_kernel(const void* ids, const T* dy, int64_t n,
                                      int64_t dim, int64_t start,
                                      int64_t local_rows, float* acc) {
  TP_GRID_STRIDE(k, n * dim) {
    const int64_t local = index_at<I>(ids, k / dim) - start;
    if (local >= 0 && local < local_rows)
      atomicAdd(&acc[local * dim + k % dim], to_float(dy[k]));
  }
}

// dw += acc with one rounding per element.
template <typename T>
__global__ void embedding_grad_flush_kernel(const float* acc, int64_t count,
                                            T* dw) {
  TP_GRID_STRIDE(k, count) {
    const float a = acc[k];
    if (a != 0.0f) dw[k] = from_float<T>(to_float(dw[k]) + a);
  }
}

// One block per row for the row reductions of cross-entropy.
template <typename T>
__global__ void ce_max_kernel(const T* logits, int64_t v_local, float* max) {
  const T* row = logits + blockIdx.x * v_local;
  float m = __int_as_float(0xff800000);  // -inf, as the CPU twin
  for (int64_t j = threadIdx.x; j < v_local; j += blockDim.x)
    m = fmaxf(m, to_float(row[j]));
  m = tpdev::block_max(m);
  if (threadIdx.x == 0) max[blockIdx.x] = m;
}

template <typename T, typename I>
__global__ void ce_sums_kernel(const T* logits, const void* targets, int64_t n,
                               int64_t v_local, int64_t v_start, int64_t ignore,
                               const float* max, float* stats) {
  const int64_t i = blockIdx.x;
  const T* row = logits + i * v_local;
  const float m = max[i];
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < v_local; j += blockDim.x)
    s += expf(to_float(row[j]) - m);
  s = tpdev::block_sum(s);
  if (threadIdx.x == 0) {
    stats[i] = static_cast<float>(s);
    const int64_t t = index_at<I>(targets, i);
    const int64_t local = t - v_start;
    stats[n + i] = t != ignore && local >= 0 && local < v_local
                       ? to_float(row[local]) - m
                       : 0.0f;
  }
}

template <typename I>
__global__ void ce_finalize_kernel(const float* stats, const void* targets,
                                   int64_t n, int64_t vocab, int64_t ignore,
                                   float* losses, float* mean_count) {
  double sum = 0.0, count = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t t = index_at<I>(targets, i);
    float loss = 0.0f;
    if (t != ignore) {
      loss = t < 0 || t >= vocab ? __int_as_float(0x7fc00000)
                                 : logf(stats[i]) - stats[n + i];
      sum += loss;
      count += 1.0;
    }
    losses[i] = loss;
  }
  sum = tpdev::block_sum(sum);
  count = tpdev::block_sum(count);
  if (threadIdx.x == 0) {
    mean_count[0] = count > 0 ? static_cast<float>(sum / count) : 0.0f;
    mean_count[1] = static_cast<float>(count);
  }
}

template <typename T, typename I>
__global__ void ce_backward_kernel(const T* logits, const void* targets,
                                   int64_t v_local, int64_t v_start,
                                   int64_t ignore, const float* max,
                                   const float* stats, const float* mean_count,
                                   float grad_scale, T* grad) {
  const int64_t i = blockIdx.x;
  const int64_t t = index_at<I>(targets, i);
  const bool valid = t != ignore;
  const float count = mean_count[1];
  const float scale = count > 0 ? grad_scale / count : 0.0f;
  const float m = max[i], inv_sum = 1.0f / stats[i];
  const T* row = logits + i * v_local;
  T* g = grad + i * v_local;
  for (int64_t j = threadIdx.x; j < v_local; j += blockDim.x) {
    float v = 0.0f;
    if (valid) {
      const float p = expf(to_float(row[j]) - m) * inv_sum;
      v = (p - (j + v_start == t ? 1.0f : 0.0f)) * scale;
    }
    g[j] = from_float<T>(v);
  }
}

void check_rows(const char* what, int64_t n) {
  TUTTI_ARG_CHECK(n <= 0x7fffffff, what, ": ", n,
                  " rows exceed the grid limit");
}

}  // namespace

void launch_embedding_lookup(const void* ids, DType index_dtype,
                             const void* weight, DType dtype, int64_t n,
                             int64_t dim, int64_t vocab_start,
                             int64_t vocab_local, void* out,
                             cudaStream_t stream) {
  TUTTI_ARG_CHECK(dim >= 0 && vocab_local >= 0, "embedding_lookup: dim ", dim,
                  ", rows ", vocab_local);
  tpdev::check_launch_args("embedding_lookup", n * dim, ids && weight && out);
  if (n * dim == 0) return;
  tpdev::dispatch_float(dtype, "embedding_lookup", [&](auto t) {
    tpdev::dispatch_index(index_dtype, "embedding_lookup", [&](auto i) {
      using T = decltype(t);
      using I = decltype(i);
      embedding_lookup_kernel<T, I>
          <<<tpdev::grid_for(n * dim), tpdev::kBlock, 0, stream>>>(
              ids, static_cast<const T*>(weight), n, dim, vocab_start,
              vocab_local, static_cast<T*>(out));
    });
  });
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_embedding_grad(const void* ids, DType index_dtype, const void* dy,
                           DType dtype, int64_t n, int64_t dim,
                           int64_t vocab_start, int64_t vocab_local,
                           void* dweight, float* acc, cudaStream_t stream) {
  TUTTI_ARG_CHECK(dim >= 0 && vocab_local >= 0, "embedding_grad: dim ", dim,
                  ", rows ", vocab_local);
  tpdev::check_launch_args("embedding_grad", n * dim, ids && dy && dweight);
  const bool direct = dtype == DType::kFloat32;
  TUTTI_ARG_CHECK(direct || n * dim == 0 || vocab_local * dim == 0 || acc,
                  "embedding_grad: ", dtype_name(dtype),
                  " needs a float32 accumulator of ", vocab_local, " x ", dim);
  if (n * dim == 0 || vocab_local * dim == 0) return;
  const int64_t table = vocab_local * dim;
  float* sum = direct ? static_cast<float*>(dweight) : acc;
  if (!direct)
    TUTTI_CUDA_CHECK(cudaMemsetAsync(acc, 0, table * sizeof(float), stream));
  tpdev::dispatch_float(dtype, "embedding_grad", [&](auto t) {
    tpdev::dispatch_index(index_dtype, "embedding_grad", [&](auto i) {
      using T = decltype(t);
      using I = decltype(i);
      embedding_grad_kernel<T, I>
          <<<tpdev::grid_for(n * dim), tpdev::kBlock, 0, stream>>>(
              ids, static_cast<const T*>(dy), n, dim, vocab_start, vocab_local,
              sum);
    });
  });
  TUTTI_LAUNCH_CHECK(stream);
  if (direct) return;
  tpdev::dispatch_float(dtype, "embedding_grad", [&](auto t) {
    using T = decltype(t);
    embedding_grad_flush_kernel<T>
        <<<tpdev::grid_for(table), tpdev::kBlock, 0, stream>>>(
            acc, table, static_cast<T*>(dweight));
  });
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_ce_local_max(const void* logits, DType dtype, int64_t n,
                         int64_t v_local, float* max, cudaStream_t stream) {
  TUTTI_ARG_CHECK(v_local > 0, "ce_local_max: ", v_local,
                  " vocabulary entries per rank");
  tpdev::check_launch_args("ce_local_max", n, logits && max);
  check_rows("ce_local_max", n);
  if (n == 0) return;
  tpdev::dispatch_float(dtype, "ce_local_max", [&](auto t) {
    using T = decltype(t);
    ce_max_kernel<T><<<static_cast<unsigned>(n), tpdev::kBlock, 0, stream>>>(
        static_cast<const T*>(logits), v_local, max);
  });
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_ce_local_sums(const void* logits, DType dtype, const void* targets,
                          DType index_dtype, int64_t n, int64_t v_local,
                          int64_t v_start, int64_t ignore_index,
                          const float* max, float* stats, cudaStream_t stream) {
  TUTTI_ARG_CHECK(v_local > 0, "ce_local_sums: ", v_local,
                  " vocabulary entries per rank");
  tpdev::check_launch_args("ce_local_sums", n,
                           logits && targets && max && stats);
  check_rows("ce_local_sums", n);
  if (n == 0) return;
  tpdev::dispatch_float(dtype, "ce_local_sums", [&](auto t) {
    tpdev::dispatch_index(index_dtype, "ce_local_sums", [&](auto i) {
      using T = decltype(t);
      using I = decltype(i);
      ce_sums_kernel<T, I>
          <<<static_cast<unsigned>(n), tpdev::kBlock, 0, stream>>>(
              static_cast<const T*>(logits), targets, n, v_local, v_start,
              ignore_index, max, stats);
    });
  });
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_ce_finalize(const float* stats, const void* targets,
                        DType index_dtype, int64_t n, int64_t vocab,
                        int64_t ignore_index, float* losses, float* mean_count,
                        cudaStream_t stream) {
  tpdev::check_launch_args("ce_finalize", n, stats && targets && losses);
  TUTTI_ARG_CHECK(mean_count != nullptr, "ce_finalize: null mean_count");
  // One block even for n == 0, so mean_count is written.
  tpdev::dispatch_index(index_dtype, "ce_finalize", [&](auto i) {
    using I = decltype(i);
    ce_finalize_kernel<I><<<1, 1024, 0, stream>>>(
        stats, targets, n, vocab, ignore_index, losses, mean_count);
  });
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_ce_backward(const void* logits, DType dtype, const void* targets,
                        DType index_dtype, int64_t n, int64_t v_local,
                        int64_t v_start, int64_t ignore_index, const float* max,
                        const float* stats, const float* mean_count,
                        float grad_scale, void* grad, cudaStream_t stream) {
  TUTTI_ARG_CHECK(v_local > 0, "ce_backward: ", v_local,
                  " vocabulary entries per rank");
  tpdev::check_launch_args(
      "ce_backward", n,
      logits && targets && max && stats && mean_count && grad);
  check_rows("ce_backward", n);
  if (n == 0) return;
  tpdev::dispatch_float(dtype, "ce_backward", [&](auto t) {
    tpdev::dispatch_index(index_dtype, "ce_backward", [&](auto i) {
      using T = decltype(t);
      using I = decltype(i);
      ce_backward_kernel<T, I>
          <<<static_cast<unsigned>(n), tpdev::kBlock, 0, stream>>>(
              static_cast<const T*>(logits), targets, v_local, v_start,
              ignore_index, max, stats, mean_count, grad_scale,
              static_cast<T*>(grad));
    });
  });
  TUTTI_LAUNCH_CHECK(stream);
}

}  // namespace kernels
}  // namespace tutti
