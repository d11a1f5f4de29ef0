// Elementwise reductions on host memory: inout[i] = op(inout[i], in[i]).
//
// Semantics shared by every backend and the compressors:
//  * float16/bfloat16 are computed in float32 and rounded once per element,
//    which for +, *, min, max is the correctly rounded result;
//  * min/max of floating types propagate NaN (like torch.minimum);
//  * integer sum/prod wrap (two's complement), as MPI and NCCL do.
// kAvg is not an elementwise op: callers sum, then divide.
#pragma once

#include <cstddef>

#include "tutti/comm.h"
#include "tutti/dtype.h"

namespace tutti {

void reduce_inplace(DType dtype, ReduceOp op, const void* in, void* inout,
                    size_t n);

// x[i] /= divisor in the element type (integers truncate toward zero;
// 16-bit floats divide in float32 and round once).
void divide_inplace(DType dtype, void* x, size_t n, int64_t divisor);

}  // namespace tutti
