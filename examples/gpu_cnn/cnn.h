// gpu_cnn: the pieces every backend shares.  The model is
//
//   x [N, C, H, W]
//   a1 = relu(conv1(x) + b1)      K1 filters 3x3, stride 1, pad 1
//   a2 = relu(conv2(a1) + b2)     K2 filters 3x3, stride 2, pad 1
//   h  = relu(flatten(a2) W3^T + b3)
//   logits = h W4^T + b4
//   loss = mean softmax cross-entropy(logits, labels)
//
// Tensors are row-major (NCHW for images); a dense weight is [out, in] and a
// convolution filter [K, C, R, S] (cross-correlation, no kernel flip), as in
// PyTorch.  Parameters live in one flat buffer (and gradients in another)
// at 256-byte aligned offsets, so the optimiser is one pass over the buffer
// and every tensor handed to cuDNN/cuBLAS is well aligned.
#pragma once

#include <tutti/tutti.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace gpu_cnn {

struct Dims {
  int batch = 32;  // per rank
  int channels = 3, height = 12, width = 12;
  int k1 = 8, k2 = 8;  // filters of conv1 and conv2
  int kernel = 3, pad = 1, stride1 = 1, stride2 = 2;
  int hidden = 64, classes = 4;

  int h1() const { return (height + 2 * pad - kernel) / stride1 + 1; }
  int w1() const { return (width + 2 * pad - kernel) / stride1 + 1; }
  int h2() const { return (h1() + 2 * pad - kernel) / stride2 + 1; }
  int w2() const { return (w1() + 2 * pad - kernel) / stride2 + 1; }
  int64_t image() const { return int64_t{channels} * height * width; }
  int64_t flat() const { return int64_t{k2} * h2() * w2(); }  // fc1 input
  // Throws std::invalid_argument naming the first bad field.
  void validate() const;
  std::string str() const;
};

// The small shapes of the finite-difference check.
Dims tiny_dims();

// Parameter i: conv1.weight, conv1.bias, conv2.weight, conv2.bias,
// fc1.weight, fc1.bias, fc2.weight, fc2.bias (forward order; the reducer's
// registration order).
enum Param { kConv1W, kConv1B, kConv2W, kConv2B, kFc1W, kFc1B, kFc2W, kFc2B, kNumParams };

struct ParamSlot {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // elements into the flat buffer
  int64_t numel = 0;
};

struct ParamLayout {
  std::vector<ParamSlot> slots;  // kNumParams entries
  int64_t total = 0;             // flat buffer length (with alignment gaps)
  explicit ParamLayout(const Dims& d);
};

// Initial parameters: weights uniform in +-sqrt(3 / fan_in) (unit variance
// through each layer), biases uniform in +-0.1; gaps are zero.
std::vector<float> init_params(const ParamLayout& layout, uint64_t seed);

// One batch of the synthetic task: noise in [-0.5, 0.5) everywhere plus a
// 3x3 blob of +1.5 (all channels) centred at a random pixel; the label is
// the quadrant of the blob's centre (0 top-left, 1 top-right, 2 bottom-left,
// 3 bottom-right), modulo `classes`.  A pure function of (dims, seed).
struct Batch {
  std::vector<float> x;          // [N, C, H, W]
  std::vector<int32_t> labels;   // [N]
};
Batch make_batch(const Dims& d, uint64_t seed);
uint64_t mix_seed(uint64_t a, uint64_t b);

// A model on one device.  forward_backward() computes the loss and every
// gradient of the batch (overwriting the gradients) and calls ready(i) as
// soon as gradient i is final on stream(): last layer first.
class Model {
 public:
  virtual ~Model() = default;
  virtual const Dims& dims() const = 0;
  virtual const ParamLayout& layout() const = 0;
  virtual tutti::Tensor param(int i) = 0;  // views into the flat buffers
  virtual tutti::Tensor grad(int i) = 0;
  // The cudaStream_t everything is ordered on (nullptr on the host).
  virtual void* stream() = 0;
  virtual void set_params(const std::vector<float>& flat) = 0;
  virtual std::vector<float> params_host() = 0;  // waits for the device
  virtual std::vector<float> grads_host() = 0;   // waits for the device
  virtual void forward_backward(const Batch& batch,
                                const std::function<void(int)>& ready) = 0;
  // w -= lr * g over every parameter (after the gradients were averaged).
  virtual void sgd_step(float lr) = 0;
  // Mean loss of the last forward_backward() (waits for the device).
  virtual double loss() = 0;
  // "cpu" or "cuda:0 (NVIDIA H100 ..., cuDNN 9.19.0, ...)".
  virtual std::string describe() const = 0;
  // Relative tolerance the gradient checks allow this model (float32
  // arithmetic; larger when cuDNN could only offer TF32 algorithms).
  virtual double check_tolerance() const { return 2e-3; }
};

std::unique_ptr<Model> make_cpu_model(const Dims& d);
#if GPU_CNN_CUDA
// Sets `device` current and builds the model there (cuDNN algorithms are
// chosen by measurement at construction).
std::unique_ptr<Model> make_gpu_model(const Dims& d, int device);
#endif

// The checks of --check (gradcheck.cc).  Each prints a table on `log`
// (rank 0) and returns true when it passed.
// Backward of `model` on tiny dims vs central differences of the float64
// host model; also the float64 host backward vs the same differences.
bool gradient_check(Model& model, bool log);
// The same parameters and batch through two models at full size: losses
// and gradients must agree (GPU vs the float32 host model).
bool compare_models(Model& a, Model& b, bool log);

}  // namespace gpu_cnn
