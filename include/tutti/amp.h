// Mixed precision: dynamic loss scaling, fused multi-tensor unscale and
// non-finite check, global-norm gradient clipping and precision casts.
//
// A float16 training step with tutti:
//
//   tutti::amp::DynamicLossScaler scaler;            // GradScaler defaults
//   loss *= scaler.scale();  backward();             // framework side
//   tutti::amp::StepCheckOptions check;
//   check.names = grad_names;                        // for error messages
//   check.groups = {dp.get(), tp.get()};             // agree over these
//   bool skip = scaler.unscale_and_check(grads, check);
//   if (!skip) {
//     tutti::amp::clip_grad_norm(grads, 1.0, clip_options);
//     optimizer_step();
//   }
//   scaler.update();                                 // next scale
//
// Every function takes a list of tensors that all live on the host or all
// on one CUDA device; float32, float16 and bfloat16 may be mixed in one
// list.  Host lists run a vectorised one-pass loop; CUDA lists run one
// multi-tensor kernel launch per ~300 chunks of 64 Ki elements on the given
// stream and wait for it (the host needs the non-finite flag or the norm to
// decide the step).  Non-finite means NaN or +-Inf.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tutti/comm.h"
#include "tutti/dtype.h"
#include "tutti/export.h"
#include "tutti/state.h"
#include "tutti/tensor.h"

namespace tutti {
namespace amp {

// ---- fused multi-tensor operations ------------------------------------------

// Which tensors of a list held non-finite values after an operation.
struct TUTTI_API NonFiniteReport {
  bool found = false;
  std::vector<int> tensors;  // indices into the list, ascending

  // "'fc1.weight', 'fc2.bias'" (names[i] for tensor i, "#i" where names is
  // shorter), at most `limit` names followed by "and N more".
  std::string describe(const std::vector<std::string>& names,
                       size_t limit = 8) const;
};

// dst[i] = round_to_dst_dtype(float(src[i]) * scale) for every pair of
// tensors, in one pass over the list, and reports which destinations hold a
// non-finite value afterwards (a non-finite input, or a finite value that
// overflowed the destination type).  Arithmetic is float32 with one
// rounding into the destination (round to nearest even), as PyTorch's
// _amp_foreach_non_finite_check_and_unscale_.  src[i] and dst[i] need equal
// element counts; they may be the same memory when their element sizes
// match (in place).  With scale == 1 and src[i] == dst[i] the tensor is only
// read.  `scale` must be finite and positive.  `stream` (a cudaStream_t) is
// used for CUDA lists.
TUTTI_API NonFiniteReport scale_copy(const std::vector<Tensor>& src,
                                     const std::vector<Tensor>& dst,
                                     float scale, void* stream = nullptr);

// Gradient unscaling: t *= inv_scale in place for every tensor, fused with
// the non-finite check (scale_copy(tensors, tensors, inv_scale)).  With
// inv_scale == 1 the tensors are only read.
TUTTI_API NonFiniteReport unscale_and_check(const std::vector<Tensor>& tensors,
                                            float inv_scale,
                                            void* stream = nullptr);

// The check alone (reads each tensor once).
TUTTI_API NonFiniteReport check_finite(const std::vector<Tensor>& tensors,
                                       void* stream = nullptr);

// Mixed-precision master weights: model[i] = round(master[i]) for float32
// masters and float16/bfloat16 model copies.  The report names masters
// whose values overflow the model type (or are already non-finite).
TUTTI_API NonFiniteReport copy_master_to_model(
    const std::vector<Tensor>& master, const std::vector<Tensor>& model,
    void* stream = nullptr);

// master_grads[i] = float32(model_grads[i]) * inv_scale: widens
// float16/bfloat16 gradients into float32 master gradients with the unscale
// and the non-finite check fused into the same pass.
TUTTI_API NonFiniteReport model_grads_to_master(
    const std::vector<Tensor>& model_grads,
    const std::vector<Tensor>& master_grads, float inv_scale,
    void* stream = nullptr);

// Per-tensor sum of squares and largest magnitude of a list in one pass.
// Accumulation is float32 over at most a few hundred terms (host: lanes of
// 2048-element blocks; CUDA: one thread's share of a 64 Ki chunk, then the
// block's tree) and float64 across blocks, chunks and tensors.  A tensor whose float32 sum of squares overflows while
// its values are finite is summed again with a power-of-two prescale, so
// large finite gradients give a finite norm.  NaN anywhere in a tensor makes
// its sum_squares and max_abs NaN; an Inf makes them Inf.
struct TensorNorms {
  std::vector<double> sum_squares;
  std::vector<double> max_abs;
};
TUTTI_API TensorNorms multi_tensor_norms(const std::vector<Tensor>& tensors,
                                         void* stream = nullptr);

// ---- global-norm gradient clipping --------------------------------------------

struct ClipOptions {
  // 2 (Euclidean) or std::numeric_limits<double>::infinity() (max-norm).
  double norm_type = 2.0;
  // Model-parallel group (tensor- or pipeline-parallel) whose ranks hold
  // different parts of the model: partial norms are combined over it (sum of
  // squares, or max).  Its ranks must call with the same options in the
  // same order.  nullptr: the norm is this rank's tensors alone.  The data-
  // parallel group is never needed here: after the gradient all-reduce its
  // ranks hold identical gradients.
  Communicator* group = nullptr;
  // Per tensor, with `group`: true when the tensor is replicated across the
  // group (every rank holds all of it, e.g. a layer norm's weight in tensor
  // parallelism), so it is counted once; false when each rank holds a
  // different shard (summed over the group).  Empty: every tensor is
  // sharded.
  std::vector<bool> replicated;
  // Per tensor, for messages ("#i" where missing).
  std::vector<std::string> names;
  // A non-finite total norm raises Error(kInvalidArgument) naming the
  // tensors when true.  When false, the gradients are left unchanged and the
  // result says non_finite (PyTorch would multiply them by NaN): in an AMP
  // step the loss scaler skips that step anyway.
  bool error_if_nonfinite = false;
  // clip_coef = max_norm / (total_norm + eps), as torch.nn.utils.
  double eps = 1e-6;
  void* stream = nullptr;  // CUDA lists: a cudaStream_t
};

struct ClipResult {
  double total_norm = 0;  // the global norm before clipping
  double clip_coef = 1;   // min(1, max_norm / (total_norm + eps))
  bool clipped = false;   // the gradients were multiplied by clip_coef
  bool non_finite = false;
};

// The global gradient norm (see ClipOptions for the group and replication).
// Collective over options.group when given.
TUTTI_API double grad_norm(const std::vector<Tensor>& grads,
                           const ClipOptions& options = {});

// Scales every gradient in place by max_norm / (total_norm + eps) when that
// is below 1 (one fused pass), like torch.nn.utils.clip_grad_norm_.
// Collective over options.group when given.  max_norm must be positive.
TUTTI_API ClipResult clip_grad_norm(const std::vector<Tensor>& grads,
                                    double max_norm,
                                    const ClipOptions& options = {});

// ---- dynamic loss scaling -------------------------------------------------------

// What update() does when an overflow needs the scale to shrink below
// min_scale (DeepSpeed: "Current loss scale already at minimum"), or when
// max_consecutive_skips is reached.
enum class MinScalePolicy : uint8_t {
  kError = 0,  // throw Error(kInvalidArgument) naming the tensors, ranks and step
  kWarn = 1,   // log a warning with the same facts, skip the step, go on
};

struct LossScalerOptions {
  // kFloat16: dynamic loss scaling.  kBFloat16 or kFloat32: the scale stays
  // 1, unscale_and_check() only reads the gradients, and update() only
  // counts skipped steps (bfloat16 has float32's range).
  DType precision = DType::kFloat16;
  // torch.cuda.amp.GradScaler's defaults.
  float init_scale = 65536.0f;  // 2^16
  float growth_factor = 2.0f;   // > 1
  float backoff_factor = 0.5f;  // in (0, 1)
  int64_t growth_interval = 2000;  // clean steps in a row before growing
  // Overflowing steps tolerated before the scale backs off (DeepSpeed
  // "hysteresis", Megatron "hysteresis").  1 backs off on every overflow
  // (GradScaler).  Every overflow still skips its step.
  int64_t hysteresis = 1;
  // false (Megatron, DeepSpeed default): the hysteresis budget is restored
  // only when the scale grows.  true (DeepSpeed consecutive_hysteresis):
  // every clean step restores it, so only consecutive overflows count.
  bool consecutive_hysteresis = false;
  // Bounds of the scale.  Backing off never goes below min_scale; an
  // overflow that needs a smaller scale triggers at_min_scale.  GradScaler
  // has no lower bound (use 0 for that); DeepSpeed and Megatron use 1.
  // Growth never exceeds max_scale, and never makes the float32 scale Inf.
  float min_scale = 1.0f;
  float max_scale = std::numeric_limits<float>::infinity();
  MinScalePolicy at_min_scale = MinScalePolicy::kError;
  // at_min_scale also applies after this many skipped steps in a row
  // (catches NaN that no scale fixes, and bfloat16 runs); 0: no limit.
  int64_t max_consecutive_skips = 0;
  // Names of the state tensors: "<state_prefix>/scale", ...
  std::string state_prefix = "amp/loss_scaler";
};

// How one step's non-finite check is done and agreed.
struct StepCheckOptions {
  // Per gradient, for messages ("#i" where missing).
  std::vector<std::string> names;
  // The groups whose ranks must take the same skip decision (data-parallel,
  // tensor-parallel, pipeline-parallel).  The flag is all-reduced (MAX, one
  // int32) over each in order, so a data x model mesh needs both groups.
  // Groups must accept host tensors (a ProcessGroup or an MPI communicator).
  std::vector<Communicator*> groups;
  // The local flag is already identical on every rank of `groups`, so no
  // collective is needed: true after a sum/average all-reduce of the
  // gradients over the data-parallel group when there is no model-parallel
  // group (NaN and Inf propagate through sums, and the reduced gradients are
  // bit-identical on every rank).  Not true when a compressor may drop non-
  // finite values, for tensor-parallel shards, or before the all-reduce.
  // TUTTI_AMP_VERIFY_AGREEMENT=1 checks the claim with one all-reduce.
  bool already_agreed = false;
  void* stream = nullptr;  // CUDA gradients: a cudaStream_t
};

// What update() decided.
struct ScaleUpdate {
  bool skipped = false;     // the step's gradients were non-finite
  bool backed_off = false;  // the scale shrank
  bool grew = false;        // the scale grew
  float old_scale = 1;
  float new_scale = 1;
};

// PyTorch GradScaler semantics with DeepSpeed/Megatron hysteresis and
// bounds.  update() on an overflowing step: the growth tracker resets, the
// hysteresis tracker drops by one and, once it reaches zero, the scale
// becomes max(scale * backoff_factor, min_scale).  On a clean step: the
// growth tracker counts up and at growth_interval the scale becomes
// min(scale * growth_factor, max_scale) (unchanged if that is not finite),
// the growth tracker resets and the hysteresis budget is restored.
//
// One step: scale() -> backward -> unscale_and_check() (or check() or
// agree(); several calls OR their results) -> update().  Not thread-safe.
// The state (scale, trackers, counters) is a set of 1-element tensors that
// checkpoints carry bit-exactly; every rank holds the same state as long as
// every rank takes the same decisions, which the agreement guarantees.
class TUTTI_API DynamicLossScaler : public Stateful {
 public:
  explicit DynamicLossScaler(const LossScalerOptions& options = {});
  ~DynamicLossScaler() override;
  // The state tensors view this object's memory: neither copyable nor
  // movable.
  DynamicLossScaler(const DynamicLossScaler&) = delete;
  DynamicLossScaler& operator=(const DynamicLossScaler&) = delete;

  // The factor to multiply the loss by before backward (1 without dynamic
  // scaling), and its float32 reciprocal.
  float scale() const { return scale_; }
  float inv_scale() const;
  bool dynamic() const;
  const LossScalerOptions& options() const { return options_; }

  // Multiplies the gradients by inv_scale() in place (one fused pass; only
  // reads them when the scale is 1), checks them for NaN/Inf, agrees on the
  // result over options.groups, and returns true when the step must be
  // skipped, identically on every rank of the groups.  A gradient may be
  // unscaled once per step (a second time is an Error(kInvalidArgument)).
  // Collective over options.groups unless already_agreed.
  bool unscale_and_check(const std::vector<Tensor>& grads,
                         const StepCheckOptions& options = {});
  // The same for gradients that are already unscaled (or bfloat16): only
  // reads them.
  bool check(const std::vector<Tensor>& grads,
             const StepCheckOptions& options = {});
  // For a check done elsewhere (e.g. fused into the data-parallel reducer's
  // copy-back or into model_grads_to_master): agrees on `local` and records
  // it.  options.names names local.tensors.
  bool agree(const NonFiniteReport& local,
             const StepCheckOptions& options = {});

  // True once this step's agreed result says skip.
  bool found_non_finite() const { return found_; }

  // Ends the step: applies the scale rules to the agreed result.  Throws
  // Error(kInvalidArgument) when no check was recorded since the last
  // update(), and (policy kError) when an overflow needs a scale below
  // min_scale or max_consecutive_skips is reached; that message names the
  // step, the scale and the tensors and ranks that overflowed.  The step is
  // counted as skipped before the error is thrown.
  ScaleUpdate update();

  // Counters (also in the state).
  int64_t steps() const { return steps_; }                   // update() calls
  int64_t skipped_steps() const { return skipped_steps_; }
  int64_t consecutive_skips() const { return consecutive_skips_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  int64_t hysteresis_tracker() const { return hysteresis_tracker_; }
  int64_t last_overflow_step() const { return last_overflow_step_; }  // -1: none

  // Stateful: "<prefix>/scale" (float32), "<prefix>/growth_tracker",
  // "/hysteresis_tracker", "/steps", "/skipped_steps",
  // "/consecutive_skips", "/last_overflow_step" (int64), all [1].
  StateDict state_dict() override;
  // Validates what was loaded (Error(kCorrupt) for a scale that is not a
  // positive finite number or trackers out of range).  Without dynamic
  // scaling a loaded scale other than 1 is reset to 1 with a warning.
  void on_state_loaded() override;

 private:
  bool record(const NonFiniteReport& local, const StepCheckOptions& options);
  // An overflow now would shrink the scale (hysteresis budget spent).
  bool backoff_due() const;
  float backoff_target() const;
  bool can_shrink() const;
  // An overflow now would make update() apply at_min_scale.
  bool policy_due() const;
  void check_not_unscaled(const std::vector<Tensor>& grads,
                          const std::vector<std::string>& names);

  LossScalerOptions options_;
  // State (state_dict() views these).
  float scale_;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_tracker_;
  int64_t steps_ = 0;
  int64_t skipped_steps_ = 0;
  int64_t consecutive_skips_ = 0;
  int64_t last_overflow_step_ = -1;
  // This step.
  bool checked_ = false;
  bool found_ = false;
  std::string overflow_report_;  // who overflowed, when update() must report
  std::vector<const void*> unscaled_;  // data pointers unscaled this step
  std::vector<const void*> scratch_;
};

}  // namespace amp
}  // namespace tutti
