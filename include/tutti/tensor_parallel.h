// Tensor-parallel layers and region operators (Megatron-LM style) on a
// ProcessMesh's TP group.
//
// Conventions
//  * Activations are caller-owned Tensor views, row-major and contiguous.
//    The last dimension is the hidden (feature) dimension; all leading
//    dimensions are flattened into rows.  With sequence parallelism the
//    first dimension is the sequence and is split across the TP group.
//  * There is no autograd: every operator has an explicit forward and
//    backward.  A layer's backward takes the same input its forward was
//    given, accumulates into the layer's weight/bias gradients, and writes
//    the input gradient (pass an empty Tensor() to skip it, e.g. for the
//    first layer).  Every rank of the TP group makes the same calls in the
//    same order: they issue collectives.
//  * A layer owns its parameter shards and their gradients (on
//    options.device, in options.dtype) and grow-only scratch memory.  GEMMs
//    run through cuBLAS on CUDA devices (float16/bfloat16 with float32
//    accumulation) and OpenBLAS on the CPU.  CUDA work is ordered on
//    options.stream; the host does not wait for it.
//  * Parameters are initialised from the global (unsharded) tensor -- a
//    caller-supplied full tensor or a seeded function of the global index --
//    so a model at any tp_size computes what the dense model computes.
//  * Sizes that tp_size does not divide raise Error(kInvalidArgument) naming
//    the layer, the size and tp_size.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tutti/export.h"
#include "tutti/mesh.h"
#include "tutti/state.h"
#include "tutti/tensor.h"

namespace tutti {

// ---- region operators -------------------------------------------------------
//
// Each region is a pair of conjugate operations on the TP group: its
// forward, and the backward that autograd would derive from it.  Tensors are
// on the same device and of the same dtype; output may alias input where the
// forward is the identity.  `p` below is tp_size; "last" means the last
// dimension, "first" the first (sequence) dimension.

struct RegionOptions {
  std::string name;        // names the tensor in error messages
  void* stream = nullptr;  // cudaStream_t for CUDA tensors
};

// copy_to_tp: forward identity, backward all-reduce (sum) of the gradient.
TUTTI_API void copy_to_tp_forward(const ProcessMesh& mesh, const Tensor& input,
                                  const Tensor& output,
                                  const RegionOptions& o = {});
TUTTI_API void copy_to_tp_backward(const ProcessMesh& mesh,
                                   const Tensor& grad_output,
                                   const Tensor& grad_input,
                                   const RegionOptions& o = {});
// reduce_from_tp: forward all-reduce (sum), backward identity.
TUTTI_API void reduce_from_tp_forward(const ProcessMesh& mesh,
                                      const Tensor& input, const Tensor& output,
                                      const RegionOptions& o = {});
TUTTI_API void reduce_from_tp_backward(const ProcessMesh& mesh,
                                       const Tensor& grad_output,
                                       const Tensor& grad_input,
                                       const RegionOptions& o = {});
// gather_from_tp: forward all-gather on the last dimension ([..., n/p] ->
// [..., n], rank order), backward keeps this rank's slice of the gradient.
TUTTI_API void gather_from_tp_forward(const ProcessMesh& mesh,
                                      const Tensor& input, const Tensor& output,
                                      const RegionOptions& o = {});
TUTTI_API void gather_from_tp_backward(const ProcessMesh& mesh,
                                       const Tensor& grad_output,
                                       const Tensor& grad_input,
                                       const RegionOptions& o = {});
// scatter_to_tp: forward keeps this rank's slice of the last dimension
// ([..., n] -> [..., n/p]), backward all-gathers the gradient.
TUTTI_API void scatter_to_tp_forward(const ProcessMesh& mesh,
                                     const Tensor& input, const Tensor& output,
                                     const RegionOptions& o = {});
TUTTI_API void scatter_to_tp_backward(const ProcessMesh& mesh,
                                      const Tensor& grad_output,
                                      const Tensor& grad_input,
                                      const RegionOptions& o = {});
// Sequence parallel, on the first dimension:
// gather_from_sequence_parallel: forward all-gather ([s/p, ...] -> [s, ...]),
// backward reduce-scatter (sum) of the gradient.
TUTTI_API void gather_from_sequence_parallel_forward(
    const ProcessMesh& mesh, const Tensor& input, const Tensor& output,
    const RegionOptions& o = {});
TUTTI_API void gather_from_sequence_parallel_backward(
    const ProcessMesh& mesh, const Tensor& grad_output,
    const Tensor& grad_input, const RegionOptions& o = {});
// reduce_scatter_to_sequence_parallel: forward reduce-scatter (sum)
// ([s, ...] -> [s/p, ...]), backward all-gather of the gradient.
TUTTI_API void reduce_scatter_to_sequence_parallel_forward(
    const ProcessMesh& mesh, const Tensor& input, const Tensor& output,
    const RegionOptions& o = {});
TUTTI_API void reduce_scatter_to_sequence_parallel_backward(
    const ProcessMesh& mesh, const Tensor& grad_output,
    const Tensor& grad_input, const RegionOptions& o = {});
// scatter_to_sequence_parallel: forward keeps this rank's slice of the first
// dimension, backward all-gathers the gradient.
TUTTI_API void scatter_to_sequence_parallel_forward(
    const ProcessMesh& mesh, const Tensor& input, const Tensor& output,
    const RegionOptions& o = {});
TUTTI_API void scatter_to_sequence_parallel_backward(
    const ProcessMesh& mesh, const Tensor& grad_output,
    const Tensor& grad_input, const RegionOptions& o = {});

// ---- parameters
// ---------------------------------------------------------------

// One parameter shard of a tensor-parallel layer, with its sharding facts.
struct TPParameter {
  std::string name;  // "<layer name>.weight", "<layer name>.bias"
  Tensor value;      // this rank's shard (a view into the layer)
  Tensor grad;       // its gradient, same shape
  // global_shape, dim and offset of the shard; group "tp".  dim == -1: every
  // rank of the TP group holds the whole tensor (replicated).
  ShardInfo shard;
  // True for parameters every TP rank holds whole (RowParallelLinear's
  // bias): a global norm over the TP group counts them once, not tp_size
  // times.  After a backward their gradients are identical on the TP ranks.
  bool tp_replicated() const { return !shard.sharded(); }
};

// Squared L2 norm of the gradients of a model replica whose parameters are
// spread over the TP group: sum over sharded gradients all-reduced over the
// TP group, plus replicated gradients counted once.  Collective over the TP
// group (every TP rank passes its parameters in the same order); the result
// is the same on every TP rank and equals the dense model's squared norm.
// Accumulates in float64.  CUDA gradients synchronise `stream`.
TUTTI_API double tp_grad_norm_squared(const ProcessMesh& mesh,
                                      const std::vector<TPParameter>& params,
                                      void* stream = nullptr);

// Sequence parallelism leaves the parameters that act on sequence-split
// activations but are not TP-sharded (LayerNorm weight and bias, and any
// other parameter outside the TP region) with partial gradients: each TP
// rank's covers only its own slice of the sequence.  Megatron marks them
// `sequence_parallel` and sums their gradients over the TP group after
// backward; this is that step: every gradient in `grads` is summed in place
// over mesh's TP group.  Afterwards they are identical on the TP ranks, i.e.
// replicated (pass them to tp_grad_norm_squared as tp_replicated()
// parameters: counted once).  Call it once per backward, before clipping
// and the optimizer; it is independent of data-parallel averaging (order
// does not matter).  Collective over the TP group: every TP rank passes the
// same shapes and dtypes in the same order.  Nothing to do at tp_size 1.
TUTTI_API void allreduce_sequence_parallel_grads(
    const ProcessMesh& mesh, const std::vector<Tensor>& grads,
    void* stream = nullptr);

// ---- linear layers
// -------------------------------------------------------------

class LinearCore;

// What ColumnParallelLinear and RowParallelLinear share: Y = X W^T + b with
// the global W [out_features, in_features] and b [out_features].
class TUTTI_API TensorParallelLinear : public Stateful {
 public:
  ~TensorParallelLinear() override;
  TensorParallelLinear(const TensorParallelLinear&) = delete;
  TensorParallelLinear& operator=(const TensorParallelLinear&) = delete;

  // This rank's weight and bias shards and their gradients (bias: empty
  // Tensor() when the layer has none).
  Tensor weight() const;
  Tensor bias() const;
  Tensor weight_grad() const;
  Tensor bias_grad() const;
  // Zeroes both gradients (on options.stream).
  void zero_grad();
  // Weight and bias uniform in [-1/sqrt(in), 1/sqrt(in)] (PyTorch's
  // nn.Linear bound), each element a function of (seed, global index), so
  // every tp_size holds slices of the same global tensors.
  void init_from_seed(uint64_t seed);
  // Copies this rank's slices of host tensors full_weight [out, in] and
  // full_bias [out] (any floating dtype; converted to options.dtype).
  // full_bias may be Tensor() (the bias is then left as it is).
  void load_from_full(const Tensor& full_weight,
                      const Tensor& full_bias = Tensor());
  // weight then bias, with their sharding facts (group "tp").
  std::vector<TPParameter> parameters() const;
  // The parameters as NamedTensors with their ShardInfo.
  StateDict state_dict() override;

  int64_t in_features() const;
  int64_t out_features() const;

 protected:
  explicit TensorParallelLinear(std::unique_ptr<LinearCore> core);
  std::unique_ptr<LinearCore> core_;
};

// W split by rows (output features): this rank holds
// W[r*out/p : (r+1)*out/p, :] and that slice of b.
struct ColumnParallelLinearOptions {
  std::string name = "column_parallel_linear";  // prefix of parameter names
  bool bias = true;
  // true: the output is the full [..., out_features] (all-gathered on the
  // last dimension); false: this rank's [..., out_features / p] slice, as
  // the input of a RowParallelLinear expects.  (Megatron's default: true.)
  bool gather_output = true;
  // The input is this rank's slice [s/p, ..., in_features] of the sequence
  // dimension; forward all-gathers it (backward gathers it again rather
  // than keeping it) and the input gradient is reduce-scattered back.
  // Needs gather_output = false.
  bool sequence_parallel = false;
  DType dtype = DType::kFloat32;  // float32, float16 or bfloat16
  Device device = Device::cpu();
  void* stream = nullptr;  // cudaStream_t
};

class TUTTI_API ColumnParallelLinear : public TensorParallelLinear {
 public:
  // No collectives.  Parameters start at zero: call init_from_seed() or
  // load_from_full().
  ColumnParallelLinear(ProcessMeshPtr mesh, int64_t in_features,
                       int64_t out_features,
                       const ColumnParallelLinearOptions& options = {});

  // input [..., in_features] (sequence parallel: [s/p, ..., in_features]);
  // output [..., out_features] with gather_output, else
  // [..., out_features / p] (sequence parallel: [s, ..., out_features / p]).
  void forward(const Tensor& input, const Tensor& output);
  // grad_output shaped like output, grad_input like input (or Tensor() to
  // skip it).  Accumulates weight_grad() and bias_grad().
  void backward(const Tensor& input, const Tensor& grad_output,
                const Tensor& grad_input);

  int64_t out_features_per_rank() const;
  const ColumnParallelLinearOptions& options() const { return options_; }

 private:
  ColumnParallelLinearOptions options_;
};

// W split by columns (input features): this rank holds
// W[:, r*in/p : (r+1)*in/p]; b is replicated and added once, after the
// partial products are summed over the TP group.
struct RowParallelLinearOptions {
  std::string name = "row_parallel_linear";
  bool bias = true;
  // true: the input is this rank's slice [..., in_features / p] (the output
  // of a ColumnParallelLinear without gather_output); false: the full
  // [..., in_features], sliced here.  (Megatron's default: false.)
  bool input_is_parallel = false;
  // The partial outputs are reduce-scattered on the sequence dimension
  // instead of all-reduced: output [s/p, ..., out_features]; backward
  // all-gathers the output gradient.  Needs input_is_parallel = true.
  bool sequence_parallel = false;
  DType dtype = DType::kFloat32;
  Device device = Device::cpu();
  void* stream = nullptr;
};

class TUTTI_API RowParallelLinear : public TensorParallelLinear {
 public:
  RowParallelLinear(ProcessMeshPtr mesh, int64_t in_features,
                    int64_t out_features,
                    const RowParallelLinearOptions& options = {});

  // input [..., in_features / p] (input_is_parallel) or [..., in_features];
  // output [..., out_features] (sequence parallel: [s/p, ..., out_features]).
  void forward(const Tensor& input, const Tensor& output);
  // The bias gradient is computed from the full output gradient, so it is
  // identical on every TP rank (the bias is replicated: tp_replicated()).
  void backward(const Tensor& input, const Tensor& grad_output,
                const Tensor& grad_input);

  int64_t in_features_per_rank() const;
  const RowParallelLinearOptions& options() const { return options_; }

 private:
  RowParallelLinearOptions options_;
};

// ---- vocabulary-parallel embedding and cross-entropy
// ---------------------------

// An embedding table [vocab_size, embedding_dim] split by rows (vocabulary):
// this rank holds rows [r*V/p, (r+1)*V/p).  Forward looks up the ids in its
// range (zero rows for the others) and all-reduces over the TP group.
struct VocabParallelEmbeddingOptions {
  std::string name = "vocab_parallel_embedding";
  // The output is reduce-scattered on the first (sequence) dimension instead
  // of all-reduced: ids [s, ...] give output [s/p, ..., dim]; backward
  // all-gathers the output gradient.
  bool sequence_parallel = false;
  DType dtype = DType::kFloat32;
  Device device = Device::cpu();
  void* stream = nullptr;
};

class TUTTI_API VocabParallelEmbedding : public Stateful {
 public:
  VocabParallelEmbedding(ProcessMeshPtr mesh, int64_t vocab_size,
                         int64_t embedding_dim,
                         const VocabParallelEmbeddingOptions& options = {});
  ~VocabParallelEmbedding() override;

  // ids: int32 or int64 [...] on options.device, the same on every TP rank;
  // output [..., embedding_dim].  Host ids outside [0, vocab_size) raise
  // Error(kInvalidArgument); on CUDA they give zero rows (checking would
  // synchronise the stream).
  void forward(const Tensor& ids, const Tensor& output);
  // Accumulates weight_grad() (scatter-add of grad_output rows; on CUDA with
  // atomics, so the order of additions is not fixed).
  void backward(const Tensor& ids, const Tensor& grad_output);

  Tensor weight() const;  // [vocab/p, dim]
  Tensor weight_grad() const;
  void zero_grad();
  // Uniform in [-sqrt(3), sqrt(3)] (unit variance), a function of (seed,
  // global index).
  void init_from_seed(uint64_t seed);
  void load_from_full(const Tensor& full_weight);
  std::vector<TPParameter> parameters() const;
  StateDict state_dict() override;

  int64_t vocab_size() const;
  int64_t vocab_start() const;  // first global row this rank holds
  int64_t vocab_per_rank() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Softmax cross-entropy over logits whose vocabulary dimension is split over
// the TP group (the output of a ColumnParallelLinear without gather_output):
// each rank holds logits [N, V/p] for vocabulary entries [r*V/p, (r+1)*V/p).
// Two TP all-reduces per forward, of 3 N floats in all: the row maximum
// (MAX), then the sum of exp(logit - max) and the target logit together (one
// SUM of [2, N]); no rank ever holds the full logits.  Subtracting the
// global maximum keeps every exponential in (0, 1], so large logits neither
// overflow nor underflow.  Computed in float32 whatever the logits' dtype.
struct VocabParallelCrossEntropyOptions {
  std::string name = "vocab_parallel_cross_entropy";
  // Tokens whose target equals ignore_index contribute no loss and no
  // gradient and are not counted in the mean.
  int64_t ignore_index = -100;
  void* stream = nullptr;
};

class TUTTI_API VocabParallelCrossEntropy {
 public:
  VocabParallelCrossEntropy(
      ProcessMeshPtr mesh, int64_t vocab_size,
      const VocabParallelCrossEntropyOptions& options = {});
  ~VocabParallelCrossEntropy();

  // logits [..., V/p] (float32/float16/bfloat16), targets int32/int64 [...]
  // (global vocabulary ids, the same on every TP rank).  Writes
  // losses float32 [...] (0 for ignored tokens; may be Tensor() to skip)
  // and mean_loss float32 [1]: the mean over the non-ignored tokens, 0 when
  // every token is ignored.  All on the logits' device.  Keeps the row
  // maximum and sum of exponentials for backward.  A target outside
  // [0, vocab_size) that is not ignore_index raises Error(kInvalidArgument)
  // for host tensors and gives a NaN loss on CUDA.
  void forward(const Tensor& logits, const Tensor& targets,
               const Tensor& losses, const Tensor& mean_loss);
  // Gradient of grad_scale * mean_loss with respect to this rank's logits,
  // written to grad_logits (shaped like logits; may alias logits).  Needs
  // the logits and targets of the preceding forward.  No communication.
  void backward(const Tensor& logits, const Tensor& targets,
                const Tensor& grad_logits, float grad_scale = 1.0f);

  int64_t vocab_size() const;
  int64_t vocab_start() const;
  int64_t vocab_per_rank() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tutti
