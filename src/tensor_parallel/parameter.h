// One parameter shard of a tensor-parallel layer: value and gradient storage
// plus the facts that place it in the global tensor (ShardInfo).
//
// Initialisation is defined on the global tensor: load_full() copies the
// slice that ShardInfo names from a full tensor, and init_uniform() makes
// each element a function of (seed, salt, global flat index).  Either way a
// layer at any tp_size holds slices of the same global tensor, which is what
// makes TP results comparable with the dense computation and lets a
// checkpoint written at one tp_size load at another.
#pragma once

#include <string>
#include <vector>

#include "tensor_parallel/memory.h"
#include "tutti/state.h"
#include "tutti/tensor_parallel.h"

namespace tutti {
namespace tp {

class Parameter {
 public:
  // The global tensor `global_shape` split into `parts` equal slices along
  // `dim` (this rank holds slice `part`); dim -1: replicated over the TP
  // group.  The caller has checked divisibility.  Value and grad start at 0.
  Parameter(std::string name, std::vector<int64_t> global_shape, int dim,
            int part, int parts, DType dtype, Device device);

  const std::string& name() const { return name_; }
  const Tensor& value() const { return value_.tensor(); }
  const Tensor& grad() const { return grad_.tensor(); }
  const ShardInfo& shard() const { return shard_; }

  void zero_grad(void* stream);
  // Element g of the global tensor is bound * (2u - 1) with u in [0, 1) a
  // hash of (seed, salt, g).
  void init_uniform(uint64_t seed, uint64_t salt, double bound);
  // Copies this shard out of `full`, a host tensor of the global shape and
  // any floating dtype.  `owner` names the layer in errors.
  void load_full(const Tensor& full, const std::string& owner);

  TPParameter describe() const;
  NamedTensor named() const { return NamedTensor{name_, value(), shard_}; }

 private:
  // Flat index in the global tensor of local element `l`.
  int64_t global_index(int64_t l) const;

  std::string name_;
  ShardInfo shard_;
  OwnedTensor value_;
  OwnedTensor grad_;
  int64_t inner_ = 1;      // elements after `dim` in one slice row
  int64_t local_dim_ = 1;  // extent of `dim` in this shard
};

// Uniform in [0, 1), exactly representable in float32, from (seed, salt,
// index).  Exposed for tests that rebuild the global tensor.
float seeded_uniform(uint64_t seed, uint64_t salt, int64_t index);

}  // namespace tp
}  // namespace tutti
