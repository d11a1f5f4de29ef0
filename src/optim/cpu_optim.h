// The host twin of kernels/optim_step.cu: one pass over a parameter's
// elements in blocks that stay in L1 (widen the gradient, update the
// parameter and its states, round the model copy), with AVX2 + FMA lanes
// when the CPU has them and scalar float lanes otherwise.  Both lane types
// run the expression of optim_math.h, so the results are bit-identical
// between them and to the CUDA kernel.
#pragma once

#include <cstdint>

#include "optim/optim_math.h"
#include "tutti/dtype.h"
#include "tutti/optim.h"

namespace tutti {
namespace optim {

// One parameter of a step: raw pointers checked by optim.cc.
struct Entry {
  float* param = nullptr;
  const void* grad = nullptr;
  float* state0 = nullptr;  // exp_avg / momentum buffer (null: SGD without momentum)
  float* state1 = nullptr;  // exp_avg_sq (Adam/AdamW only)
  void* copy = nullptr;     // model copy, null when none
  int64_t numel = 0;
  DType grad_dtype = DType::kFloat32;
  DType copy_dtype = DType::kFloat32;
};

// The step's scalars from the hyper-parameters (optim.cc), computed in
// double as torch's Python code does and rounded to float32 where torch
// hands them to a float32 kernel.  Arguments already checked.
Coeffs make_coeffs(const Hyper& h, float grad_scale);

// Updates e's elements in place.  `vector` = false forces the scalar lanes
// (the tests compare both paths on machines with AVX2).
void cpu_step(const Entry& e, const Coeffs& c, bool vector = true);

// Whether cpu_step's vector lanes run on this CPU (AVX2 + FMA + F16C).
bool cpu_step_vectorised();

}  // namespace optim
}  // namespace tutti
