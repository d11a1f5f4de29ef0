// The public multi-tensor operations: argument checks, then the host loop
// (cpu_multi_tensor.h) or the CUDA launches (cuda_multi_tensor.h).
#include <cmath>
#include <cstring>

#include "amp/cpu_multi_tensor.h"
#include "amp/cuda_multi_tensor.h"
#include "amp/multi_tensor_plan.h"
#include "core/check.h"
#include "tutti/amp.h"

namespace tutti {
namespace amp {
namespace {

bool amp_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
}

uint8_t mta_dtype(DType d) {
  return d == DType::kFloat32 ? kMtaF32 : d == DType::kFloat16 ? kMtaF16 : kMtaBF16;
}

void check_tensor(const char* op, const char* role, size_t i, const Tensor& t,
                  const Device& device) {
  TUTTI_ARG_CHECK(amp_dtype(t.dtype()), op, ": ", role, " #", i, " is ",
                  t.str(), "; amp operations take float32, float16 or bfloat16");
  TUTTI_ARG_CHECK(t.device() == device, op, ": ", role, " #", i, " is on ",
                  t.device().str(), " but ", role, " #0 is on ", device.str(),
                  "; one list must live on one device");
}

// Checks a src/dst list pair and returns the device it lives on.
Device check_pairs(const char* op, const std::vector<Tensor>& src,
                   const std::vector<Tensor>& dst) {
  TUTTI_ARG_CHECK(src.size() == dst.size(), op, ": ", src.size(),
                  " source tensors but ", dst.size(), " destinations");
  if (src.empty()) return Device::cpu();
  const Device device = src[0].device();
  for (size_t i = 0; i < src.size(); ++i) {
    check_tensor(op, "source", i, src[i], device);
    check_tensor(op, "destination", i, dst[i], device);
    TUTTI_ARG_CHECK(src[i].numel() == dst[i].numel(), op, ": source #", i, " ",
                    src[i].str(), " and destination ", dst[i].str(),
                    " differ in element count");
    // In place is fine element by element when the element sizes match;
    // any other overlap would read what was already written.
    const char* s = static_cast<const char*>(src[i].data());
    const char* d = static_cast<const char*>(dst[i].data());
    const bool overlap = src[i].numel() > 0 && s < d + dst[i].nbytes() &&
                         d < s + src[i].nbytes();
    TUTTI_ARG_CHECK(!overlap || (s == d && src[i].element_size() == dst[i].element_size()),
                    op, ": source #", i, " ", src[i].str(), " and destination ",
                    dst[i].str(), " overlap without being the same elements");
  }
  return device;
}

std::vector<MtaEntry> entries_of(const std::vector<Tensor>& src,
                                 const std::vector<Tensor>& dst) {
  std::vector<MtaEntry> e(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    e[i].src = src[i].data();
    e[i].dst = dst[i].data();
    e[i].numel = src[i].numel();
    e[i].src_dtype = mta_dtype(src[i].dtype());
    e[i].dst_dtype = mta_dtype(dst[i].dtype());
  }
  return e;
}

void check_scale(const char* op, float scale) {
  TUTTI_ARG_CHECK(std::isfinite(scale) && scale > 0, op, ": scale ", scale,
                  " must be finite and positive");
}

// Per-tensor norms of `entries` (prescale taken from each entry).
void norms_of(const std::vector<MtaEntry>& entries, const Device& device,
              const std::vector<Tensor>& tensors, void* stream,
              std::vector<double>* sum_squares, std::vector<double>* max_abs) {
  if (device.is_cuda()) {
    cuda_norms(entries, device.index, stream, sum_squares, max_abs);
    return;
  }
  sum_squares->resize(entries.size());
  max_abs->resize(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const CpuNorm n = cpu_norm(entries[i].src, tensors[i].dtype(),
                               entries[i].numel, entries[i].prescale);
    (*sum_squares)[i] = n.sum_squares;
    (*max_abs)[i] = n.max_abs;
  }
}

}  // namespace

std::string NonFiniteReport::describe(const std::vector<std::string>& names,
                                      size_t limit) const {
  std::string out;
  const size_t shown = tensors.size() < limit ? tensors.size() : limit;
  for (size_t k = 0; k < shown; ++k) {
    const int i = tensors[k];
    if (k) out += ", ";
    if (i >= 0 && static_cast<size_t>(i) < names.size() && !names[i].empty())
      out += "'" + names[i] + "'";
    else
      out += "#" + std::to_string(i);
  }
  if (tensors.size() > shown)
    out += " and " + std::to_string(tensors.size() - shown) + " more";
  return out;
}

NonFiniteReport scale_copy(const std::vector<Tensor>& src,
                           const std::vector<Tensor>& dst, float scale,
                           void* stream) {
  check_scale("amp::scale_copy", scale);
  const Device device = check_pairs("amp::scale_copy", src, dst);
  if (device.is_cuda())
    return cuda_scale_copy(entries_of(src, dst), device.index, scale, stream);
  NonFiniteReport report;
  for (size_t i = 0; i < src.size(); ++i) {
    if (cpu_scale_copy(src[i].data(), src[i].dtype(), dst[i].data(),
                       dst[i].dtype(), src[i].numel(), scale))
      report.tensors.push_back(static_cast<int>(i));
  }
  report.found = !report.tensors.empty();
  return report;
}

NonFiniteReport unscale_and_check(const std::vector<Tensor>& tensors,
                                  float inv_scale, void* stream) {
  return scale_copy(tensors, tensors, inv_scale, stream);
}

NonFiniteReport check_finite(const std::vector<Tensor>& tensors, void* stream) {
  return scale_copy(tensors, tensors, 1.0f, stream);
}

NonFiniteReport copy_master_to_model(const std::vector<Tensor>& master,
                                     const std::vector<Tensor>& model,
                                     void* stream) {
  for (size_t i = 0; i < master.size(); ++i)
    TUTTI_ARG_CHECK(master[i].dtype() == DType::kFloat32,
                    "amp::copy_master_to_model: master #", i, " is ",
                    master[i].str(), "; master weights are float32");
  return scale_copy(master, model, 1.0f, stream);
}

NonFiniteReport model_grads_to_master(const std::vector<Tensor>& model_grads,
                                      const std::vector<Tensor>& master_grads,
                                      float inv_scale, void* stream) {
  for (size_t i = 0; i < master_grads.size(); ++i)
    TUTTI_ARG_CHECK(master_grads[i].dtype() == DType::kFloat32,
                    "amp::model_grads_to_master: master gradient #", i, " is ",
                    master_grads[i].str(), "; master gradients are float32");
  return scale_copy(model_grads, master_grads, inv_scale, stream);
}

TensorNorms multi_tensor_norms(const std::vector<Tensor>& tensors,
                               void* stream) {
  const Device device = check_pairs("amp::multi_tensor_norms", tensors, tensors);
  std::vector<MtaEntry> entries = entries_of(tensors, tensors);
  TensorNorms out;
  norms_of(entries, device, tensors, stream, &out.sum_squares, &out.max_abs);
  // A float32 sum of squares can overflow although every value is finite
  // (|x| above ~1.8e19, or many large values in one chunk).  Sum those
  // tensors again with a power of two that brings the largest magnitude
  // into [0.5, 1) and undo it in float64: exact scaling, no overflow.
  std::vector<MtaEntry> redo;
  std::vector<Tensor> redo_tensors;
  std::vector<size_t> where;
  std::vector<int> exponents;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!std::isinf(out.sum_squares[i]) || !std::isfinite(out.max_abs[i])) continue;
    int e = 0;
    std::frexp(out.max_abs[i], &e);
    MtaEntry r = entries[i];
    r.prescale = std::ldexp(1.0f, -e);
    redo.push_back(r);
    redo_tensors.push_back(tensors[i]);
    where.push_back(i);
    exponents.push_back(e);
  }
  if (redo.empty()) return out;
  std::vector<double> sums, maxes;
  norms_of(redo, device, redo_tensors, stream, &sums, &maxes);
  for (size_t k = 0; k < redo.size(); ++k)
    out.sum_squares[where[k]] = std::ldexp(sums[k], 2 * exponents[k]);
  return out;
}

}  // namespace amp
}  // namespace tutti
