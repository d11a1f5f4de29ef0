// Argument checks and views shared by the tensor-parallel layers and region
// operators.  Messages name the layer ("ColumnParallelLinear 'fc1'"), the
// pass, the tensor and what was expected.
#pragma once

#include <string>

#include "tutti/tensor.h"

namespace tutti {
namespace tp {

// "ColumnParallelLinear 'fc1'"
std::string layer_label(const char* kind, const std::string& name);

// True for the empty Tensor() callers pass to skip an output (e.g. the input
// gradient of a first layer).
inline bool is_absent(const Tensor& t) {
  return t.data() == nullptr && t.ndim() == 0;
}

// Error naming `owner`, `what`, the size and tp_size unless tp_size divides
// size.  Layer sizes must also be positive; activation extents (a batch or
// sequence) may be 0.
void check_divisible(const std::string& owner, const char* what, int64_t size,
                     int tp_size, bool may_be_zero = false);

// Checks dtype and device, then views `t` as [rows, cols] where cols must be
// the last dimension (and rows the product of the others; a 1-D tensor is
// one row).  `expected_rows` >= 0 also checks the row count.
Tensor view_2d(const Tensor& t, int64_t cols, int64_t expected_rows,
               DType dtype, Device device, const std::string& owner,
               const char* role);

// Rows of a [rows, cols] activation: numel / cols, checking the last dim.
int64_t rows_of(const Tensor& t, int64_t cols, const std::string& owner,
                const char* role);

}  // namespace tp
}  // namespace tutti
