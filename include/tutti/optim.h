// Fused multi-tensor optimizer step: SGD (momentum, Nesterov), Adam and
// AdamW over a list of float32 master parameters, in one pass per element.
//
//   tutti::optim::Hyper h;                 // Adam, lr 1e-3, betas 0.9/0.999
//   h.kind = tutti::optim::Kind::kAdamW;
//   h.weight_decay = 0.01f;
//   // states[i] = {exp_avg_i, exp_avg_sq_i}: num_states(kind) float32
//   // tensors per parameter, zero before the first step.
//   for (int64_t t = 1; ...; ++t) {
//     h.step = t;                          // 1-based, as torch's state["step"]
//     tutti::optim::step(params, grads, states, h);
//   }
//
// The arithmetic follows torch.optim's single-tensor path (foreach=False,
// capturable=False, amsgrad=False) of PyTorch 2.x operation by operation:
// float32 element math, scalars derived from the hyper-parameters in double
// and rounded to float32 where torch rounds them, and a fused multiply-add
// exactly where torch's CPU kernels use one, so the host path reproduces
// torch.optim's results bit for bit (docs/optim.md lists the one exception).
// The CUDA kernel runs the same expression and matches the host path bit for
// bit.  Host lists run a vectorised loop; CUDA lists run one multi-tensor
// launch per ~300 chunks of 64 Ki elements, enqueued on the given stream
// without waiting and without allocating device memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/export.h"
#include "tutti/tensor.h"

namespace tutti {
namespace optim {

enum class Kind : uint8_t { kSgd = 0, kAdam = 1, kAdamW = 2 };

struct Hyper {                 // torch.optim semantics (single-tensor formulas, not foreach rounding)
  Kind kind = Kind::kAdam;
  float lr = 1e-3f;
  float momentum = 0.f, dampening = 0.f; bool nesterov = false;   // SGD
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;                // Adam/AdamW
  float weight_decay = 0.f;    // SGD/Adam: L2 added to the gradient; AdamW: decoupled (p *= 1 - lr*wd)
  bool maximize = false;
  int64_t step = 1;            // 1-based step number of THIS update (Adam bias correction)
};

// SGD: 1 (momentum buffer, only used when momentum != 0), Adam/AdamW: 2
// (exp_avg, exp_avg_sq).
TUTTI_API int num_states(Kind kind);

// "sgd", "adam", "adamw".
TUTTI_API const char* kind_name(Kind kind);

// One fused pass over a list: for every i
//   g = float(grads[i]) * grad_scale            (grad_scale: e.g. 1/loss_scale, or 1/W)
//   update params[i] (float32 master weights) and states[i][k] (float32)
//   exactly as torch.optim.{SGD,Adam,AdamW}.step
//   (SGD momentum: first step initialises buf = g, as torch does when the
//    buffer is "None": pass Hyper::step == 1 to mean that);
//   if model_copies is non-empty, model_copies[i] (float16/bfloat16/float32,
//   same numel) = round(params[i]) in the same pass.
// grads[i] may be float32/float16/bfloat16. All tensors host, or all on one
// CUDA device (then `stream` is a cudaStream_t, nullptr = default stream;
// the call enqueues and does not synchronize). Element counts must match per
// i; errors are tutti::Error(kInvalidArgument) naming the list index and
// `names[i]` when given.
//
// Further checks (all kInvalidArgument, before anything is written):
// hyper-parameters as torch validates them (lr >= 0, eps >= 0, betas in
// [0, 1), weight_decay >= 0, momentum >= 0, nesterov needs momentum > 0 and
// dampening == 0, step >= 1), grad_scale finite; states.size() ==
// params.size() and states[i].size() == num_states(kind) (an SGD state list
// may be empty for every i when momentum == 0); params and states float32;
// a parameter may not overlap its gradient, states or model copy.  Tensors
// may be arbitrary 1-D slices: only the dtype's own alignment is assumed.
TUTTI_API void step(const std::vector<Tensor>& params,
                    const std::vector<Tensor>& grads,
                    const std::vector<std::vector<Tensor>>& states,
                    const Hyper& hyper, float grad_scale = 1.f,
                    const std::vector<Tensor>& model_copies = {},
                    void* stream = nullptr,
                    const std::vector<std::string>& names = {});

}  // namespace optim
}  // namespace tutti
