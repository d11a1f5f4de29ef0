// gpu_cnn: the GPU backend.  Convolutions: cuDNN's legacy convolution API
// (declared, deprecated but present, in cuDNN 9's cudnn_cnn.h) with
// algorithms chosen by cudnnFind*; dense layers: cublasSgemm; the rest:
// kernels.cu.  Everything runs on one non-blocking stream; the host only
// waits for the input upload (before reusing its pinned buffer) and for the
// loss.
//
// Row-major dense layers with column-major cuBLAS: a row-major [R, C]
// matrix is a column-major [C, R] one (its transpose), so
//   y[N,out]  = x[N,in] W[out,in]^T  is  y^T = W^T(cm) ^T . x^T  -> Sgemm(T, N, out, N, in)
//   dW[out,in] = dy^T x               is  dW^T = x^T . dy         -> Sgemm(N, T, in, out, N)
//   dx[N,in]  = dy W                  is  dx^T = W^T . dy^T       -> Sgemm(N, N, in, N, out)
// with leading dimensions equal to the row lengths (in, out).
#include <algorithm>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "cnn.h"
#include "cuda_check.h"
#include "kernels.h"

namespace gpu_cnn {

namespace {

// ---- RAII -------------------------------------------------------------------

// Owns a handle of a C API and destroys it with Destroy.
template <typename H, auto Destroy>
class Owned {
 public:
  Owned() = default;
  explicit Owned(H h) : h_(h) {}
  ~Owned() { reset(); }
  Owned(Owned&& o) noexcept : h_(o.h_) { o.h_ = nullptr; }
  Owned& operator=(Owned&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = o.h_;
      o.h_ = nullptr;
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  H get() const { return h_; }
  void reset() {
    if (h_) Destroy(h_);  // errors while tearing down are not actionable
    h_ = nullptr;
  }

 private:
  H h_ = nullptr;
};

using Stream = Owned<cudaStream_t, cudaStreamDestroy>;
using Event = Owned<cudaEvent_t, cudaEventDestroy>;
using CudnnHandle = Owned<cudnnHandle_t, cudnnDestroy>;
using CublasHandle = Owned<cublasHandle_t, cublasDestroy>;
using TensorDesc = Owned<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor>;
using FilterDesc = Owned<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor>;
using ConvDesc = Owned<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor>;

// Device memory (zeroed at allocation, on the legacy stream: the model
// synchronises the device once after allocating) or page-locked host memory
// (truly asynchronous copies).
enum class Where { kDevice, kPinnedHost };

template <typename T, Where kWhere>
class Memory {
 public:
  Memory() = default;
  explicit Memory(size_t n) : n_(n) {
    if (n == 0) return;
    if (kWhere == Where::kDevice) {
      CNN_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
      CNN_CHECK(cudaMemset(p_, 0, n * sizeof(T)));
    } else {
      CNN_CHECK(cudaMallocHost(reinterpret_cast<void**>(&p_), n * sizeof(T)));
    }
  }
  ~Memory() {
    if (p_ && kWhere == Where::kDevice) cudaFree(p_);
    if (p_ && kWhere == Where::kPinnedHost) cudaFreeHost(p_);
  }
  Memory(Memory&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  Memory& operator=(Memory&& o) noexcept {  // the old memory leaves with `o`
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

template <typename T>
using DeviceArray = Memory<T, Where::kDevice>;
template <typename T>
using PinnedArray = Memory<T, Where::kPinnedHost>;

TensorDesc tensor_desc(int n, int c, int h, int w) {
  cudnnTensorDescriptor_t d = nullptr;
  CNN_CHECK(cudnnCreateTensorDescriptor(&d));
  TensorDesc owned(d);
  CNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w));
  return owned;
}

FilterDesc filter_desc(int k, int c, int r, int s) {
  cudnnFilterDescriptor_t d = nullptr;
  CNN_CHECK(cudnnCreateFilterDescriptor(&d));
  FilterDesc owned(d);
  CNN_CHECK(cudnnSetFilter4dDescriptor(d, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, k, c, r, s));
  return owned;
}

// Cross-correlation (PyTorch's and im2col's convention: no kernel flip),
// float32 compute, FMA math until an algorithm's own math type is set.
ConvDesc conv_desc(int pad, int stride) {
  cudnnConvolutionDescriptor_t d = nullptr;
  CNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
  ConvDesc owned(d);
  CNN_CHECK(cudnnSetConvolution2dDescriptor(d, pad, pad, stride, stride, 1, 1,
                                            CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CNN_CHECK(cudnnSetConvolutionMathType(d, CUDNN_FMA_MATH));
  return owned;
}

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_FMA_MATH: return "fma";
    case CUDNN_DEFAULT_MATH: return "default";
    case CUDNN_TENSOR_OP_MATH: return "tensor-op";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "tensor-op-conv";
  }
  return "?";
}

// The first (fastest measured) algorithm that ran successfully, preferring
// plain float32 FMA kernels, then the default math (which may use TF32
// tensor cores on Ampere and later), then whatever worked; null if none
// did.  cudnnFind* reports results of several math types whatever the
// descriptor says, so the caller sets the chosen math type on the
// descriptor it runs with.
template <typename Perf>
const Perf* preferred(const std::vector<Perf>& perf, int returned) {
  for (cudnnMathType_t want : {CUDNN_FMA_MATH, CUDNN_DEFAULT_MATH})
    for (int i = 0; i < returned; ++i)
      if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].mathType == want) return &perf[i];
  for (int i = 0; i < returned; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS) return &perf[i];
  return nullptr;
}

// One convolution layer: descriptors and the algorithms of its three
// operations (each with its own convolution descriptor, so each can carry
// the math type of its algorithm).
struct ConvLayer {
  int c = 0, h = 0, w = 0, k = 0, oh = 0, ow = 0;
  bool data_grad = false;  // the first layer needs no input gradient
  TensorDesc x, y;
  FilterDesc f;
  ConvDesc fwd, bwd_data, bwd_filter;
  cudnnConvolutionFwdAlgo_t fwd_algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnConvolutionBwdDataAlgo_t data_algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
  cudnnConvolutionBwdFilterAlgo_t filter_algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0;
  size_t workspace = 0;
  bool all_fma = true;
  std::string algos;  // for describe()

  void note(const char* op, int algo, cudnnMathType_t math) {
    all_fma = all_fma && math == CUDNN_FMA_MATH;
    algos += std::string(algos.empty() ? "" : " ") + op + "=" + std::to_string(algo) + "/" +
             math_name(math);
  }
};

// Measures the algorithms of one operation (find: cudnnFind*), takes the
// one preferred() returns, puts its math type on `conv` (the descriptor the
// operation will run with), then sizes its workspace (size: cudnnGet*
// WorkspaceSize, which must see that math type).
template <typename Perf, typename Find, typename Size>
auto pick_algo(ConvLayer& L, cudnnConvolutionDescriptor_t conv, int max_count, const char* op,
               const char* what, Find find, Size size) {
  std::vector<Perf> perf(static_cast<size_t>(std::max(max_count, 1)));
  int returned = 0;
  find(static_cast<int>(perf.size()), &returned, perf.data());
  if (!preferred(perf, returned)) {
    // Nothing ran under the FMA-only descriptor: let cuDNN use its default.
    CNN_CHECK(cudnnSetConvolutionMathType(conv, CUDNN_DEFAULT_MATH));
    find(static_cast<int>(perf.size()), &returned, perf.data());
  }
  if (!preferred(perf, returned)) {
    std::ostringstream o;
    o << "cuDNN has no working algorithm for " << what << " (tried:";
    for (int i = 0; i < returned; ++i)
      o << " algo " << static_cast<int>(perf[i].algo) << ": " << cudnnGetErrorString(perf[i].status);
    throw GpuError(o.str() + ")");
  }
  const Perf p = *preferred(perf, returned);
  CNN_CHECK(cudnnSetConvolutionMathType(conv, p.mathType));
  size_t bytes = 0;
  size(p.algo, &bytes);
  L.workspace = std::max({L.workspace, bytes, p.memory});
  L.note(op, p.algo, p.mathType);
  return p.algo;
}

ConvLayer make_conv(cudnnHandle_t handle, const Dims& d, int c, int h, int w, int k, int stride,
                    int oh, int ow, bool data_grad) {
  ConvLayer L;
  L.c = c, L.h = h, L.w = w, L.k = k, L.oh = oh, L.ow = ow, L.data_grad = data_grad;
  L.x = tensor_desc(d.batch, c, h, w);
  L.f = filter_desc(k, c, d.kernel, d.kernel);
  L.fwd = conv_desc(d.pad, stride);
  L.bwd_data = conv_desc(d.pad, stride);
  L.bwd_filter = conv_desc(d.pad, stride);
  int n = 0, kc = 0, yh = 0, yw = 0;
  CNN_CHECK(cudnnGetConvolution2dForwardOutputDim(L.fwd.get(), L.x.get(), L.f.get(), &n, &kc, &yh, &yw));
  if (n != d.batch || kc != k || yh != oh || yw != ow)
    throw GpuError("cuDNN's convolution output [" + std::to_string(n) + "," + std::to_string(kc) +
                   "," + std::to_string(yh) + "," + std::to_string(yw) + "] != expected [" +
                   std::to_string(d.batch) + "," + std::to_string(k) + "," +
                   std::to_string(oh) + "," + std::to_string(ow) + "]");
  L.y = tensor_desc(d.batch, k, oh, ow);

  cudnnConvolutionDescriptor_t fwd = L.fwd.get(), bwd_f = L.bwd_filter.get(),
                               bwd_d = L.bwd_data.get();
  int max_count = 0;
  CNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &max_count));
  L.fwd_algo = pick_algo<cudnnConvolutionFwdAlgoPerf_t>(
      L, fwd, max_count, "fwd", "the convolution forward pass",
      [&](int n, int* got, cudnnConvolutionFwdAlgoPerf_t* perf) {
        CNN_CHECK(cudnnFindConvolutionForwardAlgorithm(handle, L.x.get(), L.f.get(), fwd,
                                                       L.y.get(), n, got, perf));
      },
      [&](cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
        CNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(handle, L.x.get(), L.f.get(), fwd,
                                                          L.y.get(), algo, bytes));
      });
  CNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &max_count));
  L.filter_algo = pick_algo<cudnnConvolutionBwdFilterAlgoPerf_t>(
      L, bwd_f, max_count, "wgrad", "the convolution filter gradient",
      [&](int n, int* got, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
        CNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(handle, L.x.get(), L.y.get(), bwd_f,
                                                              L.f.get(), n, got, perf));
      },
      [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
        CNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, L.x.get(), L.y.get(),
                                                                 bwd_f, L.f.get(), algo, bytes));
      });
  if (!data_grad) return L;
  CNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &max_count));
  L.data_algo = pick_algo<cudnnConvolutionBwdDataAlgoPerf_t>(
      L, bwd_d, max_count, "dgrad", "the convolution data gradient",
      [&](int n, int* got, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
        CNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(handle, L.f.get(), L.y.get(), bwd_d,
                                                            L.x.get(), n, got, perf));
      },
      [&](cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
        CNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(handle, L.f.get(), L.y.get(),
                                                               bwd_d, L.x.get(), algo, bytes));
      });
  return L;
}

constexpr float kOne = 1.0f, kZero = 0.0f;

class GpuModel final : public Model {
 public:
  GpuModel(const Dims& d, int device);
  ~GpuModel() override {
    if (stream_.get()) cudaStreamSynchronize(stream_.get());  // nothing may still use the buffers
  }

  const Dims& dims() const override { return d_; }
  const ParamLayout& layout() const override { return layout_; }
  tutti::Tensor param(int i) override { return view(params_.get(), i); }
  tutti::Tensor grad(int i) override { return view(grads_.get(), i); }
  void* stream() override { return stream_.get(); }
  void set_params(const std::vector<float>& flat) override;
  std::vector<float> params_host() override { return download(params_); }
  std::vector<float> grads_host() override { return download(grads_); }
  void forward_backward(const Batch& batch, const std::function<void(int)>& ready) override;
  void sgd_step(float lr) override {
    launch_sgd(params_.get(), grads_.get(), layout_.total, lr, stream_.get());
  }
  double loss() override;
  std::string describe() const override { return describe_; }
  double check_tolerance() const override { return tolerance_; }

 private:
  tutti::Tensor view(float* base, int i) const {
    const ParamSlot& s = layout_.slots[i];
    return tutti::Tensor(base + s.offset, tutti::DType::kFloat32, tutti::Shape(s.shape),
                         tutti::Device::cuda(device_));
  }
  float* p(Param i) const { return params_.get() + layout_.slots[i].offset; }
  float* g(Param i) const { return grads_.get() + layout_.slots[i].offset; }
  std::vector<float> download(const DeviceArray<float>& a);
  void conv_forward(const ConvLayer& L, const float* x, Param weight, float* y);
  // dy: the gradient after the ReLU mask.  Weight and bias gradients, then
  // ready(), then (dx != null) the input gradient.
  void conv_backward(const ConvLayer& L, const float* x, Param weight, const float* dy, float* dx,
                     const std::function<void(int)>& ready);
  void dense_forward(const float* x, int in, int out, Param weight, bool relu, float* y);
  void dense_backward(const float* x, int in, int out, Param weight, const float* dy, float* dx,
                      const std::function<void(int)>& ready);

  Dims d_;
  ParamLayout layout_;
  int device_;
  // Declared first: destroyed last, after everything that uses it.
  Stream stream_;
  Event upload_done_, loss_ready_;
  CudnnHandle cudnn_;
  CublasHandle cublas_;
  ConvLayer conv1_, conv2_;
  DeviceArray<float> params_, grads_;
  DeviceArray<float> x_, a1_, a2_, h_, logits_, loss_rows_, dlogits_, dh_, da2_, da1_;
  DeviceArray<int32_t> labels_;
  DeviceArray<unsigned char> workspace_;
  PinnedArray<float> host_x_, host_loss_;
  PinnedArray<int32_t> host_labels_;
  std::string describe_;
  double tolerance_ = 2e-3;
};

GpuModel::GpuModel(const Dims& d, int device) : d_(d), layout_(d), device_(device) {
  d_.validate();
  CNN_CHECK(cudaSetDevice(device));
  cudaStream_t s = nullptr;
  CNN_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = Stream(s);
  cudaEvent_t e = nullptr;
  CNN_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  upload_done_ = Event(e);
  CNN_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  loss_ready_ = Event(e);
  cudnnHandle_t dnn = nullptr;
  CNN_CHECK(cudnnCreate(&dnn));
  cudnn_ = CudnnHandle(dnn);
  CNN_CHECK(cudnnSetStream(dnn, s));
  cublasHandle_t blas = nullptr;
  CNN_CHECK(cublasCreate(&blas));
  cublas_ = CublasHandle(blas);
  CNN_CHECK(cublasSetStream(blas, s));
  CNN_CHECK(cublasSetPointerMode(blas, CUBLAS_POINTER_MODE_HOST));
  CNN_CHECK(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH));  // float32 SGEMM, no TF32

  // Algorithms first: cudnnFind* allocates its own buffers and should see
  // free memory.
  conv1_ = make_conv(dnn, d, d.channels, d.height, d.width, d.k1, d.stride1, d.h1(), d.w1(), false);
  conv2_ = make_conv(dnn, d, d.k1, d.h1(), d.w1(), d.k2, d.stride2, d.h2(), d.w2(), true);
  if (!conv1_.all_fma || !conv2_.all_fma) tolerance_ = 3e-2;  // TF32 possible

  const size_t n = static_cast<size_t>(d.batch);
  params_ = DeviceArray<float>(static_cast<size_t>(layout_.total));
  grads_ = DeviceArray<float>(static_cast<size_t>(layout_.total));
  x_ = DeviceArray<float>(n * d.image());
  a1_ = DeviceArray<float>(n * d.k1 * d.h1() * d.w1());
  a2_ = DeviceArray<float>(n * d.flat());
  h_ = DeviceArray<float>(n * d.hidden);
  logits_ = DeviceArray<float>(n * d.classes);
  loss_rows_ = DeviceArray<float>(n);
  dlogits_ = DeviceArray<float>(n * d.classes);
  dh_ = DeviceArray<float>(n * d.hidden);
  da2_ = DeviceArray<float>(a2_.size());
  da1_ = DeviceArray<float>(a1_.size());
  labels_ = DeviceArray<int32_t>(n);
  workspace_ = DeviceArray<unsigned char>(std::max(conv1_.workspace, conv2_.workspace));
  host_x_ = PinnedArray<float>(x_.size());
  host_loss_ = PinnedArray<float>(n);
  host_labels_ = PinnedArray<int32_t>(n);
  // The cudaMemsets above ran on the legacy default stream, which does not
  // order our non-blocking stream: finish them now.
  CNN_CHECK(cudaDeviceSynchronize());

  cudaDeviceProp prop;
  CNN_CHECK(cudaGetDeviceProperties(&prop, device));
  int blas_version = 0;
  CNN_CHECK(cublasGetVersion(blas, &blas_version));
  std::ostringstream o;
  o << "cuda:" << device << " (" << prop.name << ", sm_" << prop.major << prop.minor
    << "; cuDNN " << cudnnGetVersion() << ", cuBLAS " << blas_version << "; conv1 "
    << conv1_.algos << ", conv2 " << conv2_.algos << ", workspace " << workspace_.bytes()
    << " B)";
  describe_ = o.str();
}

void GpuModel::set_params(const std::vector<float>& flat) {
  if (flat.size() != params_.size())
    throw std::invalid_argument("gpu_cnn: set_params: " + std::to_string(flat.size()) +
                                " values for " + std::to_string(params_.size()));
  CNN_CHECK(cudaMemcpyAsync(params_.get(), flat.data(), params_.bytes(), cudaMemcpyHostToDevice,
                            stream_.get()));
  CNN_CHECK(cudaStreamSynchronize(stream_.get()));  // `flat` may go away
}

std::vector<float> GpuModel::download(const DeviceArray<float>& a) {
  std::vector<float> out(a.size());
  CNN_CHECK(cudaMemcpyAsync(out.data(), a.get(), a.bytes(), cudaMemcpyDeviceToHost, stream_.get()));
  CNN_CHECK(cudaStreamSynchronize(stream_.get()));
  return out;
}

double GpuModel::loss() {
  CNN_CHECK(cudaEventSynchronize(loss_ready_.get()));
  double total = 0;
  for (int n = 0; n < d_.batch; ++n) total += host_loss_.get()[n];
  return total / d_.batch;
}

void GpuModel::conv_forward(const ConvLayer& L, const float* x, Param weight, float* y) {
  CNN_CHECK(cudnnConvolutionForward(cudnn_.get(), &kOne, L.x.get(), x, L.f.get(), p(weight),
                                    L.fwd.get(), L.fwd_algo, workspace_.get(), workspace_.bytes(),
                                    &kZero, L.y.get(), y));
  launch_bias_act(y, p(static_cast<Param>(weight + 1)), int64_t{d_.batch} * L.k * L.oh * L.ow,
                  L.k, int64_t{L.oh} * L.ow, true, stream_.get());
}

void GpuModel::conv_backward(const ConvLayer& L, const float* x, Param weight, const float* dy,
                             float* dx, const std::function<void(int)>& ready) {
  CNN_CHECK(cudnnConvolutionBackwardFilter(cudnn_.get(), &kOne, L.x.get(), x, L.y.get(), dy,
                                           L.bwd_filter.get(), L.filter_algo, workspace_.get(),
                                           workspace_.bytes(), &kZero, L.f.get(), g(weight)));
  launch_bias_grad(dy, g(static_cast<Param>(weight + 1)), d_.batch, L.k, int64_t{L.oh} * L.ow,
                   stream_.get());
  ready(weight);
  ready(weight + 1);
  if (!dx) return;
  if (!L.data_grad) throw std::logic_error("gpu_cnn: conv layer set up without a data gradient");
  CNN_CHECK(cudnnConvolutionBackwardData(cudnn_.get(), &kOne, L.f.get(), p(weight), L.y.get(), dy,
                                         L.bwd_data.get(), L.data_algo, workspace_.get(),
                                         workspace_.bytes(), &kZero, L.x.get(), dx));
}

void GpuModel::dense_forward(const float* x, int in, int out, Param weight, bool relu, float* y) {
  CNN_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, out, d_.batch, in, &kOne,
                        p(weight), in, x, in, &kZero, y, out));
  launch_bias_act(y, p(static_cast<Param>(weight + 1)), int64_t{d_.batch} * out, out, 1, relu,
                  stream_.get());
}

void GpuModel::dense_backward(const float* x, int in, int out, Param weight, const float* dy,
                              float* dx, const std::function<void(int)>& ready) {
  CNN_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_T, in, out, d_.batch, &kOne, x, in,
                        dy, out, &kZero, g(weight), in));
  launch_bias_grad(dy, g(static_cast<Param>(weight + 1)), d_.batch, out, 1, stream_.get());
  ready(weight);
  ready(weight + 1);
  CNN_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_N, in, d_.batch, out, &kOne,
                        p(weight), in, dy, out, &kZero, dx, in));
}

void GpuModel::forward_backward(const Batch& batch, const std::function<void(int)>& ready) {
  const Dims& d = d_;
  const size_t n = static_cast<size_t>(d.batch);
  if (batch.x.size() != x_.size() || batch.labels.size() != n)
    throw std::invalid_argument("gpu_cnn: batch of the wrong size for " + d.str());
  for (int32_t y : batch.labels)
    if (y < 0 || y >= d.classes)
      throw std::invalid_argument("gpu_cnn: label " + std::to_string(y) + " out of range");
  cudaStream_t s = stream_.get();

  // Upload through the pinned buffers, once the previous upload has left them.
  CNN_CHECK(cudaEventSynchronize(upload_done_.get()));
  std::memcpy(host_x_.get(), batch.x.data(), x_.bytes());
  std::memcpy(host_labels_.get(), batch.labels.data(), labels_.bytes());
  CNN_CHECK(cudaMemcpyAsync(x_.get(), host_x_.get(), x_.bytes(), cudaMemcpyHostToDevice, s));
  CNN_CHECK(cudaMemcpyAsync(labels_.get(), host_labels_.get(), labels_.bytes(),
                            cudaMemcpyHostToDevice, s));
  CNN_CHECK(cudaEventRecord(upload_done_.get(), s));

  // ---- forward
  conv_forward(conv1_, x_.get(), kConv1W, a1_.get());
  conv_forward(conv2_, a1_.get(), kConv2W, a2_.get());
  const int flat = static_cast<int>(d.flat());
  dense_forward(a2_.get(), flat, d.hidden, kFc1W, true, h_.get());
  dense_forward(h_.get(), d.hidden, d.classes, kFc2W, false, logits_.get());
  launch_softmax_xent(logits_.get(), labels_.get(), loss_rows_.get(), dlogits_.get(), d.batch,
                      d.classes, 1.0f / static_cast<float>(d.batch), s);
  CNN_CHECK(cudaMemcpyAsync(host_loss_.get(), loss_rows_.get(), loss_rows_.bytes(),
                            cudaMemcpyDeviceToHost, s));
  CNN_CHECK(cudaEventRecord(loss_ready_.get(), s));

  // ---- backward, last layer first; each layer hands its gradients over
  // before computing its input gradient.
  dense_backward(h_.get(), d.hidden, d.classes, kFc2W, dlogits_.get(), dh_.get(), ready);
  launch_relu_backward(dh_.get(), h_.get(), static_cast<int64_t>(dh_.size()), s);
  dense_backward(a2_.get(), flat, d.hidden, kFc1W, dh_.get(), da2_.get(), ready);
  launch_relu_backward(da2_.get(), a2_.get(), static_cast<int64_t>(da2_.size()), s);
  conv_backward(conv2_, a1_.get(), kConv2W, da2_.get(), da1_.get(), ready);
  launch_relu_backward(da1_.get(), a1_.get(), static_cast<int64_t>(da1_.size()), s);
  conv_backward(conv1_, x_.get(), kConv1W, da1_.get(), nullptr, ready);
}

}  // namespace

std::unique_ptr<Model> make_gpu_model(const Dims& d, int device) {
  return std::make_unique<GpuModel>(d, device);
}

}  // namespace gpu_cnn
