// Helpers for the sharded-optimizer tests: a tiny "model" (five parameters
// of odd sizes, several buckets, parameters straddling shard boundaries)
// trained with ShardedOptimizer or with the unsharded reference (Reducer
// all-reduce + optim::step over whole tensors).
//
// Gradients come from a global batch of kBatch samples split evenly over
// the ranks (kBatch is divisible by 1, 2, 3 and 4): rank r's gradient is the
// mean of its samples', so the group average is the batch mean at every
// world size, and runs at different sizes differ only by rounding.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data_parallel/dp_test_util.h"
#include "tutti/checkpoint.h"
#include "tutti/optim.h"
#include "tutti/zero.h"

namespace tutti {
namespace test {

constexpr int kBatch = 12;

struct ZeroConfig {
  DType dtype = DType::kFloat32;  // model parameters and gradients
  optim::Hyper hyper;
  int stage = 2;                  // 0: the unsharded reference
  bool bucket_view = false;       // ReducerOptions::gradient_as_bucket_view
  DType reduce_dtype = DType::kFloat32;
  bool overlap_all_gather = false;
  int bucket_buffers = 2;         // ShardedOptimizerOptions::bucket_buffers
  int gather_buffers = 2;         // ShardedOptimizerOptions::gather_buffers
  int passes = 1;                 // ReducerOptions::backward_passes_per_step
  bool learn_order = false;       // ReducerOptions::learn_bucket_order
  // The order backward() marks gradients ready in (empty: reverse
  // registration order, the order the buckets are planned in).
  std::vector<int> ready_order;
  // Gradient sample k of step t is multiplied by this when t == overflow_step
  // on rank overflow_rank (inf: an overflow on one rank).
  int64_t overflow_step = -1;
  int overflow_rank = 0;
  // Shifts the initial values and gradients (a tensor-parallel rank's
  // different shard of the model).
  int variant = 0;
};

// "sgd", "adam", "adamw" with test hyper-parameters (momentum, decay).
optim::Hyper test_hyper(optim::Kind kind);

class ZeroModel {
 public:
  ZeroModel(ProcessGroupPtr group, const ZeroConfig& config);
  ~ZeroModel();
  // Fills this rank's gradients of step t (1-based), multiplied by
  // `loss_scale`, and runs the reducer's backward pass; returns
  // synchronize()'s result.
  bool backward(int64_t t, float loss_scale = 1.f);
  // One backward pass without synchronize(): gradient p (for p in `order`,
  // marked ready in that order) is set to local_gradient(p, t), or with
  // `accumulate` has it added (in float64, rounded once).
  void pass(int64_t t, const std::vector<int>& order, bool accumulate);
  // This rank's gradient of parameter p at step t (what backward() writes).
  std::vector<double> local_gradient(int p, int64_t t, float loss_scale = 1.f) const;
  // The optimizer step (sharded or reference) over the averaged gradients.
  void step(float grad_scale = 1.f);
  // The gradients a non-finite check / norm must see, each element once
  // across the group: the shards (sharded) or every gradient (reference).
  std::vector<Tensor> check_tensors();
  // The parameters' bytes, concatenated in registration order (or of one).
  std::vector<unsigned char> param_bytes();
  std::vector<unsigned char> param_bytes(int p);
  // The parameters as doubles, concatenated.
  std::vector<double> param_values();

  ProcessGroupPtr group;
  ZeroConfig config;
  std::vector<TestParam> params;
  std::unique_ptr<Reducer> reducer;
  std::unique_ptr<ShardedOptimizer> zero;  // stage 1 or 2
  // The reference's float32 master weights and states, per parameter.
  std::vector<std::vector<float>> master;
  std::vector<std::vector<std::vector<float>>> states;
  int64_t ref_steps = 0;
};

// Synchronous checkpoints in `dir` with a short timeout.
CheckpointOptions zero_ckpt_options(const std::string& dir);

// The parameter list the tests use (dtype d).
std::vector<ParamDecl> zero_decls(DType d);

// True when some parameter of some bucket straddles a boundary between two
// ranks' shards.
bool has_straddling_parameter(const Reducer& reducer, const ShardedOptimizer& zero);

// max |a - b| over the elements (inf when the sizes differ).
double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b);
// max |a - b| / (|b| + 1e-3) over the elements.
double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace test
}  // namespace tutti
