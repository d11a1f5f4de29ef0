// ShardedOptimizer: shard layout, the stage-2 reduce-scatter hook and the
// step (update the shard, all-gather the parameters).  See zero_impl.h.
#include <algorithm>
#include <cstdio>

#include "compression/cast.h"
#include "core/check.h"
#include "core/cuda_utils.h"
#include "data_parallel/list_agreement.h"
#include "data_parallel/zero/zero_impl.h"
#include "tutti/log.h"

namespace tutti {

using zero::Bucket;
using zero::Piece;

namespace zero {

std::vector<std::string> state_names(optim::Kind kind) {
  if (kind == optim::Kind::kSgd) return {"momentum_buffer"};
  return {"exp_avg", "exp_avg_sq"};
}

}  // namespace zero

namespace {

bool is_float(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
}

std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// The options and hyper-parameters every rank must share, one item each.
std::vector<std::string> describe(const ShardedOptimizerOptions& o,
                                  const optim::Hyper& h) {
  return {"stage=" + std::to_string(o.stage),
          std::string("reduce_dtype=") + dtype_name(o.reduce_dtype),
          std::string("overlap_all_gather=") + (o.overlap_all_gather ? "true" : "false"),
          "name=" + o.name,
          std::string("kind=") + optim::kind_name(h.kind),
          "lr=" + num(h.lr),
          "momentum=" + num(h.momentum),
          "dampening=" + num(h.dampening),
          std::string("nesterov=") + (h.nesterov ? "true" : "false"),
          "beta1=" + num(h.beta1),
          "beta2=" + num(h.beta2),
          "eps=" + num(h.eps),
          "weight_decay=" + num(h.weight_decay),
          std::string("maximize=") + (h.maximize ? "true" : "false")};
}

}  // namespace

ShardedOptimizerImpl::ShardedOptimizerImpl(Reducer& reducer, const optim::Hyper& hyper,
                                           ShardedOptimizerOptions options)
    : reducer_(reducer), hyper_(hyper), opt_(std::move(options)) {
  world_ = reducer_.group()->size();
  rank_ = reducer_.group()->rank();
  // Local problems are agreed on before anyone throws, so a rank whose
  // setup is wrong fails together with its peers instead of leaving them
  // in a collective (the reducer's own agreement check does the same).
  const std::string local_error = validate();
  check_agreement(local_error);
  if (!local_error.empty()) TUTTI_THROW(kInvalidArgument, local_error);
  build_layout();
  reduced_steps_ = reducer_.stats().steps;
  install_collective();
  // A reducer that will still learn its bucket order re-plans inside its
  // first reducing synchronize(): the shards follow it there (remap()).
  if (!reducer_.bucket_order_fixed()) {
    reducer_.set_plan_listener([this](bool replanned) { on_plan_fixed(replanned); });
    listening_ = true;
  }
}

// Shards, state and step lists for the reducer's current bucket plan (the
// master weights start as the parameters).
void ShardedOptimizerImpl::build_layout() {
  buckets_.clear();
  shards_.clear();
  param_bucket_.clear();
  grads_.clear();
  gather_pool_.clear();
  gather_free_.clear();
  gather_slot_bytes_ = 0;
  // The all-gather buffers: a pool when that is less memory than one per
  // bucket (else setup_bucket gives each bucket its own).
  int64_t all = 0;
  for (const BucketLayout& l : reducer_.buckets()) {
    const int64_t bytes = (l.numel + world_ - 1) / world_ * world_ *
                          static_cast<int64_t>(dtype_size(l.dtype));
    gather_slot_bytes_ = std::max(gather_slot_bytes_, bytes);
    all += bytes;
  }
  const bool pool_gathers = !opt_.overlap_all_gather && opt_.gather_buffers > 0 &&
                            opt_.gather_buffers * gather_slot_bytes_ < all;
  if (!pool_gathers) gather_slot_bytes_ = 0;
#if TUTTI_WITH_CUDA
  // The master casts (setup_bucket, on the legacy stream) read the
  // parameters only after all work queued on the device so far: their
  // broadcast may have been made to wait on a non-blocking stream, which
  // the legacy stream does not follow.  Once per layout; each bucket's
  // casts are synchronized at its end.
  if (!reducer_.buckets().empty() && reducer_.buckets().front().device.is_cuda()) {
    cuda::DeviceGuard g(reducer_.buckets().front().device.index);
    TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
  }
#endif
  for (int b = 0; b < static_cast<int>(reducer_.buckets().size()); ++b)
    setup_bucket(b, pool_gathers);
  if (pool_gathers) {
    for (int i = 0; i < opt_.gather_buffers; ++i) {
      gather_pool_.push_back(
          dp::make_pool_slot(buckets_.front().layout.device, gather_slot_bytes_, pool_));
      gather_free_.push_back(i);
    }
  }
  build_step_lists();
}

// Stage 2: the reduce-scatter into the reducer.  The reducer pools its
// bucket buffers only once its bucket order is fixed (a pool cannot follow
// a re-plan), so until then every bucket keeps its own buffer.
void ShardedOptimizerImpl::install_collective() {
  if (opt_.stage != 2) return;
  const bool pool = !reducer_.options().gradient_as_bucket_view && reducer_.bucket_order_fixed();
  reducer_.set_bucket_collective(
      [this](int b, const Tensor& flat, const OpOptions& o) { return reduce_scatter(b, flat, o); },
      pool ? opt_.bucket_buffers : 0);
}

// Inside the reducer's first reducing synchronize() (every rank): the
// learned order is final.  Move the state onto the new buckets when they
// changed, then let stage 2 pool the reducer's buffers.
void ShardedOptimizerImpl::on_plan_fixed(bool replanned) {
  reducer_.set_plan_listener(nullptr);
  listening_ = false;
  if (replanned) remap();
  install_collective();
}

ShardedOptimizerImpl::~ShardedOptimizerImpl() {
  if (listening_) reducer_.set_plan_listener(nullptr);
  // An all-gather still in flight (overlap_all_gather) writes into a buffer
  // freed below.
  for (Bucket& z : buckets_) {
    if (!z.gather_work) continue;
    try {
      cuda::OptionalDeviceGuard device(z.layout.device);
      z.gather_work->wait();
    } catch (const std::exception& e) {
      TUTTI_LOG(kError) << "ShardedOptimizer '" << opt_.name
                        << "': an all-gather failed at destruction: " << e.what();
    }
  }
  if (opt_.stage != 2) return;
  try {
    reducer_.set_bucket_collective(nullptr);
  } catch (const std::exception& e) {
    TUTTI_LOG(kError) << "ShardedOptimizer '" << opt_.name
                      << "': could not restore the reducer's all-reduce: " << e.what();
  }
}

// The first thing wrong with this rank's setup, or "".
std::string ShardedOptimizerImpl::validate() const {
  const std::string who = "ShardedOptimizer '" + opt_.name + "'";
  if (opt_.stage != 1 && opt_.stage != 2)
    return who + ": stage " + std::to_string(opt_.stage) + " (expected 1 or 2)";
  if (reducer_.num_parameters() == 0) return who + ": the reducer has no parameters";
  if (reducer_.buckets().empty())
    return who + ": constructed before reducer.build() (reducer '" +
           reducer_.options().name + "' has " + std::to_string(reducer_.num_parameters()) +
           " parameters but no buckets yet); call build() first";
  if (opt_.stage == 2 &&
      (reducer_.options().compressor || reducer_.options().hierarchical ||
       reducer_.options().gradient_predivide_factor != 1.0 ||
       reducer_.options().op != ReduceOp::kAvg))
    return who + ": stage 2 replaces the all-reduce by a reduce-scatter and needs the "
           "reducer's plain mode (no compressor, hierarchical=false, op kAvg, "
           "gradient_predivide_factor 1); use reduce_dtype for compression";
  if (opt_.gather_buffers < 0)
    return who + ": gather_buffers = " + std::to_string(opt_.gather_buffers) +
           " (expected >= 0; 0: every bucket keeps its all-gather buffer)";
  if (opt_.bucket_buffers < 0)
    return who + ": bucket_buffers = " + std::to_string(opt_.bucket_buffers) +
           " (expected >= 0; 0: every bucket keeps its buffer)";
  if (opt_.reduce_dtype != DType::kFloat32 && opt_.reduce_dtype != DType::kFloat16 &&
      opt_.reduce_dtype != DType::kBFloat16)
    return who + ": reduce_dtype " + dtype_name(opt_.reduce_dtype) +
           " (expected float32, float16 or bfloat16)";
  for (const BucketLayout& l : reducer_.buckets()) {
    if (l.device != reducer_.buckets().front().device)
      return who + ": bucket " + std::to_string(l.id) + " is on " + l.device.str() +
             " but bucket 0 on " + reducer_.buckets().front().device.str() +
             " (expected every parameter on one device: one fused step)";
    if (!is_float(l.dtype))
      return who + ": bucket " + std::to_string(l.id) + " holds " + dtype_name(l.dtype) +
             " gradients (expected float32, float16 or bfloat16)";
    if (opt_.reduce_dtype != DType::kFloat32 && l.dtype != DType::kFloat32 &&
        l.dtype != opt_.reduce_dtype)
      return who + ": reduce_dtype " + dtype_name(opt_.reduce_dtype) + " for bucket " +
             std::to_string(l.id) + " of " + dtype_name(l.dtype) +
             " gradients (only float32 buckets are cast down)";
    for (const BucketSlot& s : l.slots) {
      const Tensor p = reducer_.parameter(reducer_.parameter_index(s.name));
      if (p.dtype() != l.dtype || p.device() != l.device)
        return who + ": parameter '" + s.name + "' is " + p.str() + " but its gradient is " +
               dtype_name(l.dtype) + " on " + l.device.str() +
               " (expected the same dtype and device)";
    }
  }
  return "";
}

void ShardedOptimizerImpl::check_agreement(const std::string& local_error) {
  std::vector<std::string> items = describe(opt_, hyper_);
  items.push_back("local checks: " + (local_error.empty() ? std::string("passed") : local_error));
  dp::check_lists_agree(*reducer_.group(), "ShardedOptimizer '" + opt_.name + "'",
                        {{"setting", std::move(items)}});
}

void ShardedOptimizerImpl::setup_bucket(int index, bool pool_gathers) {
  buckets_.emplace_back();
  Bucket& z = buckets_.back();
  z.layout = reducer_.buckets()[static_cast<size_t>(index)];
  const BucketLayout& l = z.layout;
  const int64_t n = l.numel, s = (n + world_ - 1) / world_;
  ZeroShard& sh = z.shard;
  sh.bucket = index;
  sh.bucket_numel = n;
  sh.shard_numel = s;
  sh.begin = std::min<int64_t>(rank_ * s, n);
  sh.end = std::min<int64_t>(sh.begin + s, n);
  z.owned = sh.end - sh.begin;
  shards_.push_back(sh);

  // CUDA: every call below on the bucket's device, whatever the calling
  // thread's current device (the constructor, or remap() inside the
  // reducer's synchronize()).
  cuda::OptionalDeviceGuard device(l.device);
  z.master.allocate(l.device, DType::kFloat32, z.owned, pool_);
  z.states.resize(static_cast<size_t>(optim::num_states(hyper_.kind)));
  for (auto& st : z.states) st.allocate(l.device, DType::kFloat32, z.owned, pool_);
  if (!pool_gathers) z.gather.allocate(l.device, l.dtype, s * world_, pool_);
  if (opt_.stage == 2) {
    z.wire_dtype = opt_.reduce_dtype == DType::kFloat32 ? l.dtype : opt_.reduce_dtype;
    z.grad.allocate(l.device, z.wire_dtype, s, pool_);
    if (z.wire_dtype != l.dtype) z.wire.allocate(l.device, z.wire_dtype, s * world_, pool_);
  }
  std::vector<dp::UnflattenSlot> slots;
  for (const BucketSlot& slot : l.slots) {
    const int pi = reducer_.parameter_index(slot.name);
    const Tensor p = reducer_.parameter(pi);
    z.slot_params.push_back(pi);
    if (param_bucket_.size() <= static_cast<size_t>(pi)) param_bucket_.resize(static_cast<size_t>(pi) + 1, -1);
    param_bucket_[static_cast<size_t>(pi)] = index;
    slots.push_back({p.data(), slot.offset, p.numel()});
    const int64_t a = std::max(slot.offset, sh.begin);
    const int64_t b = std::min(slot.offset + p.numel(), sh.end);
    if (a >= b) continue;
    Piece piece;
    piece.param = pi;
    piece.name = slot.name;
    piece.begin = a;
    piece.end = b;
    piece.param_offset = a - slot.offset;
    // The master weights start as the parameters (after their broadcast).
    const Tensor src = p.flatten().slice(piece.param_offset, piece.param_offset + (b - a));
    compression::cast_convert(l.device, src.data(), l.dtype, z.master.at(a - sh.begin),
                              DType::kFloat32, b - a, 1.f, nullptr);
    z.pieces.push_back(std::move(piece));
  }
  z.chunks = dp::make_unflatten_chunks(l.dtype, slots);
#if TUTTI_WITH_CUDA
  if (l.device.is_cuda()) {
    z.device_chunks = dp::upload_to_device(l.device.index, z.chunks.data(),
                                           z.chunks.size() * sizeof(z.chunks[0]));
    TUTTI_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // the master casts
  }
#endif
}

// The step's lists, per bucket: stage 2 updates each bucket's shard as one
// flat tensor (its gradient is one contiguous block); stage 1 goes piece by
// piece, reading the averaged gradients the reducer wrote back.  The model
// copies point into the gather buffer (re-pointed per step when pooled).
void ShardedOptimizerImpl::build_step_lists() {
  for (Bucket& z : buckets_) {
    const int64_t lo = z.shard.begin;
    auto add = [&](int64_t a, int64_t b, const Tensor& grad, const std::string& name) {
      z.step_params.push_back(z.master.view(z.owned).slice(a - lo, b - lo));
      z.step_grads.push_back(grad);
      grads_.push_back(grad);
      z.copy_ranges.emplace_back(a, b);
      z.step_copies.push_back(z.gather.data() ? z.gather.view().slice(a, b) : Tensor());
      std::vector<Tensor> st;
      for (auto& s : z.states) st.push_back(s.view(z.owned).slice(a - lo, b - lo));
      z.step_states.push_back(std::move(st));
      z.step_names.push_back(name);
    };
    if (z.owned == 0) continue;
    if (opt_.stage == 2) {
      add(lo, z.shard.end, z.grad.view(z.owned),
          "bucket " + std::to_string(z.shard.bucket) + " shard");
      continue;
    }
    for (const Piece& p : z.pieces) {
      const Tensor g = reducer_.gradient(p.param).flatten().slice(
          p.param_offset, p.param_offset + (p.end - p.begin));
      add(p.begin, p.end, g, p.name);
    }
  }
}

// Stage 2, on the thread launching bucket `b` (under the reducer's lock):
// the bucket's average reduce-scattered into z.grad.  With reduce_dtype the
// bucket is cast down (divided by W on the way, so the sum cannot overflow
// where the average would not) and summed.
WorkPtr ShardedOptimizerImpl::reduce_scatter(int b, const Tensor& flat, const OpOptions& o) {
  Bucket& z = buckets_[static_cast<size_t>(b)];
  const int64_t s = z.shard.shard_numel;
  TUTTI_CHECK_EQ(flat.numel(), s * world_, "bucket ", b, " is not padded to W blocks");
  const auto& group = reducer_.group();
  if (z.wire_dtype == z.layout.dtype)
    return group->reduce_scatter_async(flat, z.grad.view(s), ReduceOp::kAvg, o);
  compression::cast_convert(z.layout.device, flat.data(), z.layout.dtype, z.wire.data(),
                            z.wire_dtype, flat.numel(), static_cast<float>(world_), o.stream);
  return group->reduce_scatter_async(z.wire.view(), z.grad.view(s), ReduceOp::kSum, o);
}

void ShardedOptimizerImpl::step(float grad_scale, void* stream) {
  // Stage 2's shards are only refreshed by a reducing synchronize(): a
  // second step() on the same gradients would silently apply them twice.
  const int64_t reduced = reducer_.stats().steps;
  TUTTI_ARG_CHECK(reduced > reduced_steps_, "ShardedOptimizer '", opt_.name,
                  "': step() without a reducing synchronize() since the previous step() "
                  "(reducer '", reducer_.options().name, "' has reduced ", reduced,
                  " times); expected one step() per reducing synchronize()");
  reduced_steps_ = reduced;
  optim::Hyper h = hyper_;
  h.step = steps_ + 1;
  launch_gathers(stream, &h, grad_scale);  // waits for the previous all-gathers first
  if (!opt_.overlap_all_gather) wait_parameters();
  ++steps_;
}

std::vector<Tensor> ShardedOptimizerImpl::gradient_shards() const { return grads_; }

int64_t ShardedOptimizerImpl::state_bytes() const {
  int64_t owned = 0;
  for (const Bucket& z : buckets_) owned += z.owned;
  return owned * 4 * static_cast<int64_t>(1 + optim::num_states(hyper_.kind));
}

int64_t ShardedOptimizerImpl::gradient_bytes() const {
  int64_t bytes = reducer_.stats().bucket_bytes;
  for (const Bucket& z : buckets_)
    bytes += (z.grad.numel() + z.wire.numel()) * static_cast<int64_t>(dtype_size(z.wire_dtype));
  return bytes;
}

int64_t ShardedOptimizerImpl::unsharded_state_bytes() const {
  int64_t all = 0;
  for (const Bucket& z : buckets_) all += z.layout.numel;
  return all * 4 * static_cast<int64_t>(1 + optim::num_states(hyper_.kind));
}

// ---- the public class ---------------------------------------------------------

ShardedOptimizer::ShardedOptimizer(Reducer& reducer, const optim::Hyper& hyper,
                                   ShardedOptimizerOptions options)
    : impl_(new ShardedOptimizerImpl(reducer, hyper, std::move(options))) {}
ShardedOptimizer::~ShardedOptimizer() = default;
void ShardedOptimizer::step(float grad_scale, void* stream) { impl_->step(grad_scale, stream); }
std::vector<Tensor> ShardedOptimizer::gradient_shards() const { return impl_->gradient_shards(); }
optim::Hyper& ShardedOptimizer::hyper() { return impl_->hyper_; }
const optim::Hyper& ShardedOptimizer::hyper() const { return impl_->hyper_; }
int64_t ShardedOptimizer::steps() const { return impl_->steps_; }
const ShardedOptimizerOptions& ShardedOptimizer::options() const { return impl_->opt_; }
const std::vector<ZeroShard>& ShardedOptimizer::shards() const { return impl_->shards_; }
int64_t ShardedOptimizer::state_bytes() const { return impl_->state_bytes(); }
int64_t ShardedOptimizer::gradient_bytes() const { return impl_->gradient_bytes(); }
int64_t ShardedOptimizer::gather_bytes() const { return impl_->gather_bytes(); }
int64_t ShardedOptimizer::unsharded_state_bytes() const {
  return impl_->unsharded_state_bytes();
}
void ShardedOptimizer::wait_parameters() { impl_->wait_parameters(); }
void ShardedOptimizer::wait_parameter(int index) { impl_->wait_parameter(index); }
StateDict ShardedOptimizer::state_dict() { return impl_->state_dict(); }
void ShardedOptimizer::on_state_loaded() { impl_->write_parameters(nullptr); }
StateDict ShardedOptimizer::consolidate() { return impl_->consolidate(); }

}  // namespace tutti
