// Helpers for the data-parallel tests: owned parameter/gradient buffers of
// any dtype and shape, closed-form expected reductions, error checks.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "tutti/data_parallel.h"

namespace tutti {
namespace test {

struct ParamDecl {
  std::string name;
  DType dtype;
  Shape shape;
};

// A parameter and its gradient, owning their memory.
struct TestParam {
  std::string name;
  Shape shape;
  Buffer param;
  Buffer grad;
  TestParam(const ParamDecl& d)
      : name(d.name), shape(d.shape), param(d.dtype, d.shape.numel()),
        grad(d.dtype, d.shape.numel()) {}
  Tensor param_tensor() { return Tensor(param.bytes.data(), param.dtype, shape); }
  Tensor grad_tensor() { return Tensor(grad.bytes.data(), grad.dtype, shape); }
};

std::vector<TestParam> make_params(const std::vector<ParamDecl>& decls);
// Registers every parameter in list order.
void register_all(Reducer& reducer, std::vector<TestParam>& params);

// v rounded into dtype d.
double stored(DType d, double v);
// What the reducer's average of an exactly-summed `sum` over n ranks is in
// dtype d (one division in the element type's arithmetic; see
// kernels/data_parallel.h).
double expected_avg(DType d, double sum, int n);

// Gradient value rank r puts at element i of parameter p: small integers,
// so sums over 4 ranks are exact in every dtype.
double grad_value(int rank, int param, int64_t i);

// Sequence number of a fresh collective on the world: the difference of two
// calls is 1 + the number of world collectives issued in between.
uint64_t world_collective_seq();

// True when `bytes` are identical on every rank of the world.
bool same_on_every_rank(const std::vector<unsigned char>& bytes);

}  // namespace test
}  // namespace tutti
