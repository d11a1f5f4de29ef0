// A minimal data-parallel training setup for the compression convergence
// test and the end-to-end benchmark (the data-parallel reducer is built
// elsewhere): a ReLU MLP with softmax cross-entropy and a hand-written
// backward pass (GEMMs through core/gemm.h), trained on a synthetic
// classification task whose labels come from a fixed random linear teacher.
// Everything is seeded: every rank starts from the same parameters, and the
// batches of (rank, step) are the same in every run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tutti/compression.h"
#include "tutti/process_group.h"

namespace tutti {
namespace test {

struct TeacherTask {
  int64_t inputs = 32;
  int64_t classes = 10;
  uint64_t seed = 1;
  // A batch: x [batch, inputs] ~ N(0, 1), y = argmax(teacher x).
  void batch(uint64_t stream, int64_t batch, std::vector<float>* x,
             std::vector<int32_t>* y) const;
};

class Mlp {
 public:
  struct Param {
    std::string name;
    int64_t offset;  // in params()/grads()
    Shape shape;
  };

  // sizes: {inputs, hidden..., classes}; He-initialised from `seed`.
  Mlp(const std::vector<int64_t>& sizes, uint64_t seed);

  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  const std::vector<Param>& layout() const { return layout_; }

  // Mean cross-entropy of the batch; with backward, grads() receives its
  // gradient (overwritten).
  float forward(const float* x, const int32_t* y, int64_t batch, bool backward);
  // SGD with momentum (PyTorch's form: v = mu v + g; p -= lr v).
  void sgd_step(float lr, float momentum);

 private:
  std::vector<int64_t> sizes_;
  std::vector<float> params_, grads_, velocity_;
  std::vector<Param> layout_;
  std::vector<std::vector<float>> acts_;  // per layer input activations
  std::vector<float> dz_, dh_;
};

// One training run: `steps` data-parallel SGD steps (learning rate decayed
// linearly to zero, so the final loss is not dominated by SGD noise) on
// `group` through tutti's data-parallel Reducer with `compressor` (null: the
// plain averaging all-reduce), then the loss of the final parameters on a
// fixed evaluation set.  Gradients are marked ready last layer first, as
// autograd produces them, and the Reducer buckets them (bucket_cap_bytes).
struct TrainOptions {
  std::vector<int64_t> sizes = {32, 64, 64, 10};
  int64_t batch = 32;  // per rank
  int64_t steps = 1000;
  float lr = 0.05f;  // decays linearly to 0 over the steps
  bool lr_decay = true;
  float momentum = 0.9f;
  int64_t bucket_cap_bytes = 16 << 10;
  int64_t eval_samples = 2048;  // 0: no final evaluation
  uint64_t seed = 42;
  // Called after every step with the rank-averaged training loss (the same
  // on every rank); returning true stops training there.
  std::function<bool(int64_t step, float loss)> on_step;
};
struct TrainResult {
  float final_eval_loss = 0;
  std::vector<float> train_loss;  // per step, averaged over ranks
  std::vector<float> final_params;
};
TrainResult train(std::shared_ptr<Compressor> compressor,
                  const ProcessGroupPtr& group, const TrainOptions& options);

}  // namespace test
}  // namespace tutti
