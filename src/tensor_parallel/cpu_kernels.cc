#include "tensor_parallel/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"

namespace tutti {
namespace tp {
namespace cpu {
namespace {

template <typename T>
float ld(T v) {
  return static_cast<float>(v);
}
template <typename T>
T st(float v) {
  return T(v);
}

// Runs body<T>() for the floating dtype.
template <typename F>
void dispatch_float(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      f(float{});
      return;
    case DType::kFloat16:
      f(Half{});
      return;
    case DType::kBFloat16:
      f(BFloat16{});
      return;
    default:
      TUTTI_THROW(kUnsupported, what, " on ", dtype_name(dtype),
                  " (float32, float16 or bfloat16)");
  }
}

// Index i of an int32/int64 array.
int64_t index_at(const void* p, DType index_dtype, int64_t i) {
  return index_dtype == DType::kInt64 ? static_cast<const int64_t*>(p)[i]
                                      : static_cast<const int32_t*>(p)[i];
}

void check_index_dtype(DType d, const char* what) {
  TUTTI_ARG_CHECK(d == DType::kInt32 || d == DType::kInt64, what,
                  ": ids/targets must be int32 or int64, got ", dtype_name(d));
}

}  // namespace

void bias_add(void* out, const void* bias, DType dtype, int64_t rows,
              int64_t cols) {
  dispatch_float(dtype, "bias_add", [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out);
    const T* b = static_cast<const T*>(bias);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        o[r * cols + c] = st<T>(ld(o[r * cols + c]) + ld(b[c]));
  });
}

void bias_grad(const void* dy, void* db, DType dtype, int64_t rows,
               int64_t cols) {
  dispatch_float(dtype, "bias_grad", [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(dy);
    T* d = static_cast<T*>(db);
    std::vector<double> acc(cols, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) acc[c] += ld(g[r * cols + c]);
    for (int64_t c = 0; c < cols; ++c)
      d[c] = st<T>(ld(d[c]) + static_cast<float>(acc[c]));
  });
}

double sum_squares(const void* x, DType dtype, int64_t n) {
  double s = 0;
  dispatch_float(dtype, "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    const T* v = static_cast<const T*>(x);
    for (int64_t i = 0; i < n; ++i) {
      const double f = ld(v[i]);
      s += f * f;
    }
  });
  return s;
}

void embedding_lookup(const void* ids, DType index_dtype, const void* weight,
                      DType dtype, int64_t n, int64_t dim, int64_t vocab_start,
                      int64_t vocab_local, void* out) {
  check_index_dtype(index_dtype, "embedding_lookup");
  dispatch_float(dtype, "embedding_lookup", [&](auto tag) {
    using T = decltype(tag);
    const T* w = static_cast<const T*>(weight);
    T* o = static_cast<T*>(out);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t local = index_at(ids, index_dtype, i) - vocab_start;
      const bool held = local >= 0 && local < vocab_local;
      for (int64_t h = 0; h < dim; ++h)
        o[i * dim + h] = held ? w[local * dim + h] : st<T>(0.0f);
    }
  });
}

void embedding_grad(const void* ids, DType index_dtype, const void* dy,
                    DType dtype, int64_t n, int64_t dim, int64_t vocab_start,
                    int64_t vocab_local, void* dweight, float* acc) {
  check_index_dtype(index_dtype, "embedding_grad");
  const bool direct = dtype == DType::kFloat32;
  const int64_t table = vocab_local * dim;
  TUTTI_ARG_CHECK(direct || n * dim == 0 || table == 0 || acc,
                  "embedding_grad: ", dtype_name(dtype),
                  " needs a float32 accumulator of ", vocab_local, " x ", dim);
  if (n * dim == 0 || table == 0) return;
  float* sum = direct ? static_cast<float*>(dweight) : acc;
  if (!direct) std::fill(acc, acc + table, 0.0f);
  dispatch_float(dtype, "embedding_grad", [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(dy);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t local = index_at(ids, index_dtype, i) - vocab_start;
      if (local < 0 || local >= vocab_local) continue;
      for (int64_t h = 0; h < dim; ++h)
        sum[local * dim + h] += ld(g[i * dim + h]);
    }
    if (direct) return;
    T* d = static_cast<T*>(dweight);
    for (int64_t k = 0; k < table; ++k)
      if (acc[k] != 0.0f) d[k] = st<T>(ld(d[k]) + acc[k]);
  });
}

void ce_local_max(const void* logits, DType dtype, int64_t n, int64_t v_local,
                  float* max) {
  dispatch_float(dtype, "ce_local_max", [&](auto tag) {
    using T = decltype(tag);
    const T* l = static_cast<const T*>(logits);
    for (int64_t i = 0; i < n; ++i) {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < v_local; ++j)
        m = std::max(m, ld(l[i * v_local + j]));
      max[i] = m;
    }
  });
}

void ce_local_sums(const void* logits, DType dtype, const void* targets,
                   DType index_dtype, int64_t n, int64_t v_local,
                   int64_t v_start, int64_t ignore_index, const float* max,
                   float* stats) {
  check_index_dtype(index_dtype, "ce_local_sums");
  dispatch_float(dtype, "ce_local_sums", [&](auto tag) {
    using T = decltype(tag);
    const T* l = static_cast<const T*>(logits);
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int64_t j = 0; j < v_local; ++j)
        s += std::exp(ld(l[i * v_local + j]) - max[i]);
      stats[i] = static_cast<float>(s);
      const int64_t t = index_at(targets, index_dtype, i);
      const int64_t local = t - v_start;
      stats[n + i] = t != ignore_index && local >= 0 && local < v_local
                         ? ld(l[i * v_local + local]) - max[i]
                         : 0.0f;
    }
  });
}

void ce_finalize(const float* stats, const void* targets, DType index_dtype,
                 int64_t n, int64_t vocab, int64_t ignore_index, float* losses,
                 float* mean_count) {
  check_index_dtype(index_dtype, "ce_finalize");
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = index_at(targets, index_dtype, i);
    float loss = 0.0f;
    if (t != ignore_index) {
      loss = t < 0 || t >= vocab ? std::numeric_limits<float>::quiet_NaN()
                                 : std::log(stats[i]) - stats[n + i];
      sum += loss;
      ++count;
    }
    losses[i] = loss;
  }
  mean_count[0] = count > 0 ? static_cast<float>(sum / count) : 0.0f;
  mean_count[1] = static_cast<float>(count);
}

void ce_backward(const void* logits, DType dtype, const void* targets,
                 DType index_dtype, int64_t n, int64_t v_local, int64_t v_start,
                 int64_t ignore_index, const float* max, const float* stats,
                 const float* mean_count, float grad_scale, void* grad) {
  check_index_dtype(index_dtype, "ce_backward");
  const float scale = mean_count[1] > 0 ? grad_scale / mean_count[1] : 0.0f;
  dispatch_float(dtype, "ce_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* l = static_cast<const T*>(logits);
    T* g = static_cast<T*>(grad);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = index_at(targets, index_dtype, i);
      const bool valid = t != ignore_index;
      const float inv_sum = 1.0f / stats[i];
      for (int64_t j = 0; j < v_local; ++j) {
        const int64_t k = i * v_local + j;
        float v = 0.0f;
        if (valid) {
          const float p = std::exp(ld(l[k]) - max[i]) * inv_sum;
          v = (p - (j + v_start == t ? 1.0f : 0.0f)) * scale;
        }
        g[k] = st<T>(v);
      }
    }
  });
}

}  // namespace cpu
}  // namespace tp
}  // namespace tutti
