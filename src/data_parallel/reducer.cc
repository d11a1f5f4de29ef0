// Reducer: options, registration, build (plan, cross-rank check, buffers),
// broadcasts, and the public forwarding layer.  The per-step path is in
// reducer_step.cc.
#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "data_parallel/broadcast.h"
#include "data_parallel/list_agreement.h"
#include "data_parallel/param_check.h"
#include "data_parallel/reducer_impl.h"
#include "tutti/compression.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {

using dp::Bucket;
using dp::Mode;

ReducerOptions ReducerOptions::from_env() {
  ReducerOptions o;
  o.bucket_cap_mb = config::get_double("TUTTI_BUCKET_MB");
  o.first_bucket_cap_mb = config::get_double("TUTTI_FIRST_BUCKET_MB");
  o.hierarchical = config::get_bool("TUTTI_HIERARCHICAL");
  o.learn_bucket_order = config::get_bool("TUTTI_LEARN_BUCKET_ORDER");
  o.launch_channels = static_cast<int>(config::get_int("TUTTI_DP_LAUNCH_CHANNELS"));
  o.check_parameters = config::get_bool("TUTTI_CHECK_PARAMETERS");
  // "none" keeps the plain averaging all-reduce (no compressor thread).
  const std::string compression = config::get_string("TUTTI_COMPRESSION");
  if (compression != "none") o.compressor = make_compressor(compression);
  return o;
}

namespace {

std::string describe_tensor_entry(const std::string& name, const Tensor& t,
                                  const Tensor* param) {
  std::string s = detail::cat("'", name, "' ", dtype_name(t.dtype()),
                              t.shape().str(), " ",
                              t.is_cuda() ? "cuda" : "cpu");
  if (param && param->dtype() != t.dtype())
    s += detail::cat(" (parameter ", dtype_name(param->dtype()), ")");
  return s;
}

}  // namespace

ReducerImpl::ReducerImpl(ProcessGroupPtr group, ReducerOptions options)
    : group_(std::move(group)), opt_(std::move(options)) {
  TUTTI_ARG_CHECK(group_ != nullptr, "Reducer needs a process group, got null");
  const std::string& n = opt_.name;
  TUTTI_ARG_CHECK(opt_.bucket_cap_mb > 0, "Reducer '", n, "': bucket_cap_mb = ",
                  opt_.bucket_cap_mb, " must be > 0 (TUTTI_BUCKET_MB)");
  TUTTI_ARG_CHECK(opt_.first_bucket_cap_mb >= 0, "Reducer '", n,
                  "': first_bucket_cap_mb = ", opt_.first_bucket_cap_mb,
                  " must be >= 0 (0: same as bucket_cap_mb; TUTTI_FIRST_BUCKET_MB)");
  TUTTI_ARG_CHECK(opt_.backward_passes_per_step >= 1, "Reducer '", n,
                  "': backward_passes_per_step = ", opt_.backward_passes_per_step,
                  " must be >= 1");
  TUTTI_ARG_CHECK(opt_.hierarchical_node_size >= 0, "Reducer '", n,
                  "': hierarchical_node_size = ", opt_.hierarchical_node_size,
                  " must be >= 0 (0: MPI shared-memory split)");
  TUTTI_ARG_CHECK(opt_.op == ReduceOp::kAvg || opt_.op == ReduceOp::kSum,
                  "Reducer '", n, "': op ", reduce_op_name(opt_.op),
                  " is not a gradient reduction (expected avg or sum)");
  TUTTI_ARG_CHECK(!opt_.compressor || opt_.op == ReduceOp::kAvg, "Reducer '", n,
                  "': a compressor returns the average; op must be avg, got ",
                  reduce_op_name(opt_.op));
  const double f = opt_.gradient_predivide_factor;
  TUTTI_ARG_CHECK(std::isfinite(f) && f > 0, "Reducer '", n,
                  "': gradient_predivide_factor = ", f, " must be finite and > 0");
  TUTTI_ARG_CHECK(f == 1.0 || opt_.op == ReduceOp::kAvg, "Reducer '", n,
                  "': gradient_predivide_factor = ", f, " splits the division of "
                  "an average; op must be avg, got ", reduce_op_name(opt_.op));
  // none, fp16 and bf16 split their division as the uncompressed path does
  // (CompressContext::predivide_factor); the others average in float32.
  TUTTI_ARG_CHECK(f == 1.0 || !opt_.compressor || opt_.compressor->takes_predivide(),
                  "Reducer '", n, "': gradient_predivide_factor = ", f,
                  " with compressor '", opt_.compressor ? opt_.compressor->name() : "",
                  "': it forms the average in float32 itself (with error feedback, or "
                  "for auto possibly PowerSGD), so there is no sum to divide before; "
                  "a factor works with no compressor or with none, fp16 and bf16; use "
                  "gradient_predivide_factor = 1 with this one");
  TUTTI_ARG_CHECK(!(opt_.find_unused_parameters && opt_.static_graph), "Reducer '",
                  n, "': find_unused_parameters searches every pass, static_graph "
                  "never does; set one of them");
  TUTTI_ARG_CHECK(opt_.launch_channels >= 1 && opt_.launch_channels <= 64, "Reducer '", n,
                  "': launch_channels = ", opt_.launch_channels,
                  " must be 1..64 (1: launch in bucket order; TUTTI_DP_LAUNCH_CHANNELS)");
  if (opt_.compressor && opt_.hierarchical)
    TUTTI_LOG(kWarn) << "Reducer '" << n << "': compressor '"
                     << opt_.compressor->name()
                     << "' replaces the all-reduce; hierarchical is ignored";
}

ReducerImpl::~ReducerImpl() {
  std::lock_guard<std::mutex> lock(mu_);
  if (step_in_flight()) {
    TUTTI_LOG(kWarn) << "Reducer '" << opt_.name
                     << "' destroyed in the middle of a step; waiting for the "
                        "buckets in flight";
    abandon_step();
  }
  worker_.reset();
  release_buckets();
}

void ReducerImpl::release_buckets() {
  for (auto& b : buckets_) {
    // An exported gradient view (gradient_as_bucket_view) may still hold
    // the memory: then it is freed with the last view, not pooled.
    if (b.buffer.use_count() == 1) b.buffer->release(pool_);
    b.buffer.reset();
    b.shard.release(pool_);
  }
  buckets_.clear();
}

int ReducerImpl::add_parameter(const std::string& name, const Tensor& param,
                               const Tensor& grad) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string ctx = detail::cat("Reducer '", opt_.name, "': add_parameter('", name, "')");
  TUTTI_ARG_CHECK(!built_, ctx, ": the reducer is already built; register every "
                  "parameter before build()");
  TUTTI_ARG_CHECK(!name.empty(), ctx, ": the name must not be empty");
  TUTTI_ARG_CHECK(by_name_.find(name) == by_name_.end(), ctx,
                  ": a parameter of this name was already registered (#",
                  by_name_[name], ")");
  // With gradient_as_bucket_view the gradient lives in the bucket: no
  // gradient tensor (a default Tensor) stands for "the parameter's dtype,
  // zeros".
  const bool absent = opt_.gradient_as_bucket_view && grad.data() == nullptr &&
                      grad.numel() == 0 && grad.shape() != param.shape();
  TUTTI_ARG_CHECK(param.defined() && grad.defined(), ctx,
                  ": parameter ", param.str(), " and gradient ", grad.str(),
                  " must both have memory");
  if (!absent) {
    TUTTI_ARG_CHECK(param.numel() == grad.numel(), ctx, ": gradient ", grad.str(),
                    " has ", grad.numel(), " elements, the parameter ", param.str(),
                    " has ", param.numel());
    TUTTI_ARG_CHECK(param.device() == grad.device(), ctx, ": gradient on ",
                    grad.device().str(), " but parameter on ", param.device().str());
  }
  dp::Param p;
  p.name = name;
  p.param = param;
  p.grad = grad;
  p.grad_absent = absent;
  p.grad_dtype = absent ? param.dtype() : grad.dtype();
  TUTTI_ARG_CHECK(opt_.gradient_predivide_factor == 1.0 ||
                      p.grad_dtype == DType::kFloat32 || p.grad_dtype == DType::kFloat16 ||
                      p.grad_dtype == DType::kBFloat16,
                  ctx, ": gradient_predivide_factor = ", opt_.gradient_predivide_factor,
                  " scales float32/float16/bfloat16 gradients, this one is ",
                  dtype_name(p.grad_dtype));
  const int index = static_cast<int>(params_.size());
  params_.push_back(std::move(p));
  by_name_.emplace(name, index);
  return index;
}

void ReducerImpl::check_plan_agrees() {
  // The plan is a pure function of the parameter list and the caps, so
  // agreeing on those is agreeing on the plan.
  std::vector<std::string> options = {
      detail::cat("bucket_cap_mb=", opt_.bucket_cap_mb),
      detail::cat("first_bucket_cap_mb=", opt_.first_bucket_cap_mb),
      detail::cat("backward_passes_per_step=", opt_.backward_passes_per_step),
      detail::cat("op=", reduce_op_name(opt_.op)),
      detail::cat("mode=", mode_name()),
      detail::cat("hierarchical_node_size=", opt_.hierarchical_node_size),
      detail::cat("compressor=", opt_.compressor ? opt_.compressor->name() : "none"),
      detail::cat("learn_bucket_order=", opt_.learn_bucket_order),
      detail::cat("gradient_predivide_factor=", opt_.gradient_predivide_factor),
      detail::cat("launch_channels=", opt_.launch_channels),
      detail::cat("check_parameters=", opt_.check_parameters),
  };
  std::vector<std::string> entries;
  entries.reserve(params_.size());
  for (const auto& p : params_)
    entries.push_back(describe_tensor_entry(p.name, p.grad_absent ? p.param : p.grad,
                                            &p.param));
  dp::check_lists_agree(*group_->cpu_communicator(),
                        detail::cat("Reducer '", opt_.name, "' build"),
                        {{"option", options}, {"parameter", entries}});
}

void ReducerImpl::allocate_bucket(Bucket& b) {
  const BucketLayout& l = b.plan.layout;
  // Plain mode: padded to a multiple of the group size (zeros), so that a
  // bucket collective (set_bucket_collective) can reduce-scatter it.
  const int64_t w = group_->size();
  const int64_t padded = hier_ ? hier_->padded_numel(l.numel) : (l.numel + w - 1) / w * w;
  if (!b.buffer) b.buffer = std::make_shared<dp::FusionBuffer>();
  if (b.buffer->allocate(l.device, l.dtype, padded, pool_)) ++stats_.buffer_allocations;
  if (hier_ && hier_->shard_numel(padded) > 0 &&
      b.shard.allocate(l.device, l.dtype, hier_->shard_numel(padded), pool_))
    ++stats_.buffer_allocations;
  std::vector<dp::UnflattenSlot> slots;
  for (size_t s = 0; s < l.slots.size(); ++s) {
    dp::Param& p = params_[static_cast<size_t>(b.plan.params[s])];
    if (opt_.gradient_as_bucket_view) {
      // The gradient moves into the bucket, content and all (the registered
      // tensor, or the previous bucket's slice after a rebuild).
      const Tensor view = b.buffer->slice(l.slots[s].offset, l.slots[s].shape);
      if (!p.grad_absent) b.buffer->copy_in(l.slots[s].offset, p.grad, nullptr);
      p.grad = view;
      p.grad_absent = false;
    }
    // In view mode the write-back divides in place.
    slots.push_back({p.grad.data(), l.slots[s].offset, p.grad.numel()});
  }
  b.chunks = dp::make_unflatten_chunks(l.dtype, slots);
#if TUTTI_WITH_CUDA
  if (l.device.is_cuda()) {
    b.device_chunks = dp::upload_to_device(
        l.device.index, b.chunks.data(), b.chunks.size() * sizeof(b.chunks[0]));
    b.joined.reset(new cuda::Event(l.device.index));
    ++stats_.buffer_allocations;
    if (hier_) {
      b.side.reset(new cuda::Stream(l.device.index));
      b.launched.reset(new cuda::Event(l.device.index));
      b.reduced.reset(new cuda::Event(l.device.index));
    }
  }
#endif
  b.pending = static_cast<int>(l.slots.size());
}

std::vector<dp::ParamSpec> ReducerImpl::param_specs() const {
  std::vector<dp::ParamSpec> specs;
  for (const auto& p : params_)
    specs.push_back({p.name, p.grad_dtype, p.param.device(),
                     p.grad_absent ? p.param.shape() : p.grad.shape()});
  return specs;
}

void ReducerImpl::install_plan(std::vector<dp::PlannedBucket> plan) {
  buckets_.clear();
  layouts_.clear();
  buckets_.resize(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    Bucket& b = buckets_[i];
    b.plan = std::move(plan[i]);
    b.op_name = detail::cat(opt_.name, " bucket ", i);
    for (size_t s = 0; s < b.plan.params.size(); ++s) {
      dp::Param& p = params_[static_cast<size_t>(b.plan.params[s])];
      p.bucket = static_cast<int>(i);
      p.offset = b.plan.layout.slots[s].offset;
    }
    allocate_bucket(b);
    layouts_.push_back(b.plan.layout);
  }
  plan_chains();
}

// Flat mode, every bucket on the host, > 1 rank: one private communicator
// per launch chain (collective: inside build(), which every rank calls with
// an agreed plan and launch_channels).  Else no channels: one chain on the
// group (see reducer_impl.h for why).
void ReducerImpl::open_channels(const std::vector<dp::PlannedBucket>& plan) {
  if (mode_ != Mode::kFlat || group_->size() == 1 || opt_.launch_channels < 2) return;
  for (const auto& b : plan)
    if (!b.layout.device.is_cpu()) return;
  const size_t n = std::min(static_cast<size_t>(opt_.launch_channels), plan.size());
  if (n < 2) return;
  for (size_t c = 0; c < n; ++c)
    channels_.push_back(group_->split_group(
        0, group_->rank(), detail::cat(group_->name(), "/", opt_.name, "-launch", c)));
}

// Bucket b on chain b mod (number of chains); after a re-plan too.
void ReducerImpl::plan_chains() {
  const size_t n = channels_.empty() ? 1 : channels_.size();
  chains_.assign(n, {});
  chain_next_.assign(n, 0);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    buckets_[i].chain = static_cast<int>(i % n);
    chains_[i % n].push_back(static_cast<int>(i));
  }
}

void ReducerImpl::build() {
  std::lock_guard<std::mutex> lock(mu_);
  TUTTI_ARG_CHECK(!built_, "Reducer '", opt_.name, "': build() called twice");
  auto plan = dp::plan_buckets(param_specs(), dp::mib_to_bytes(opt_.bucket_cap_mb),
                               dp::mib_to_bytes(opt_.first_bucket_cap_mb));
  mode_ = opt_.compressor ? Mode::kCompressed
          : opt_.hierarchical && group_->size() > 1 ? Mode::kHierarchical
                                                    : Mode::kFlat;
  check_plan_agrees();  // collective; throws on every rank or none
  try {
    if (mode_ == Mode::kHierarchical)
      hier_.reset(new dp::HierarchicalAllreduce(group_, opt_.hierarchical_node_size));
    open_channels(plan);
    install_plan(std::move(plan));
    observed_order_.reserve(params_.size());  // grad_ready must not allocate
    if (opt_.compressor)
      for (const auto& l : layouts_) opt_.compressor->setup(l);
    if (mode_ != Mode::kFlat)
      worker_.reset(new dp::BucketWorker(opt_.name, static_cast<int>(buckets_.size()),
                                         [this](int b) { run_on_worker(b); }));
  } catch (...) {
    // Leave the reducer unbuilt (and its memory returned) so that the
    // caller sees one clean failure.
    release_buckets();
    layouts_.clear();
    hier_.reset();
    channels_.clear();
    throw;
  }
  built_ = true;
  TUTTI_LOG(kInfo) << "Reducer '" << opt_.name << "': " << params_.size()
                   << " parameters in " << buckets_.size() << " buckets ("
                   << mode_name() << ")";
}

// Inside the first reducing synchronize(), after the write-back: every rank
// is in the same collective call and every bucket's communication has
// ended, so the allgathers below match (data_parallel/param_check.h).
void ReducerImpl::check_replicas(void* stream) {
  std::vector<dp::ParamEntry> entries;
  entries.reserve(params_.size());
  for (const auto& p : params_) entries.push_back({p.name, p.param});
  dp::check_parameters_agree(*group_->cpu_communicator(),
                             detail::cat("Reducer '", opt_.name, "'"), entries, stream);
}

// Inside the first reducing synchronize(), after the write-back: every rank
// is in the same collective call, so the broadcast below matches.
void ReducerImpl::learn_order() {
  order_learned_ = true;
  const int n = static_cast<int>(params_.size());
  std::vector<int32_t> order;
  order.reserve(static_cast<size_t>(n));
  for (int i : observed_order_) order.push_back(i);
  // Never ready: last (reverse registration order), where an unused
  // parameter holds back no bucket but the last.
  for (int i = n - 1; i >= 0; --i)
    if (!params_[static_cast<size_t>(i)].observed) {
      order.push_back(i);
      if (opt_.static_graph) static_unused_.push_back(i);
    }
  observed_order_.clear();
  observed_order_.shrink_to_fit();
  if (!opt_.learn_bucket_order || mode_ == Mode::kCompressed || n == 0) return;
  // Ranks may have seen different orders: rank 0's is everyone's.
  if (group_->size() > 1) {
    OpOptions o;
    o.name = opt_.name + " bucket order";
    group_->cpu_communicator()->broadcast(
        Tensor(order.data(), DType::kInt32, Shape{n}), 0, o);
  }
  std::vector<int> learned(order.begin(), order.end());
  std::vector<char> seen(static_cast<size_t>(n), 0);
  for (int i : learned) {
    TUTTI_CHECK(i >= 0 && i < n && !seen[static_cast<size_t>(i)], "Reducer '",
                opt_.name, "': rank 0's bucket order is not a permutation of the ",
                n, " parameters (entry ", i, ")");
    seen[static_cast<size_t>(i)] = 1;
  }
  rebuild_buckets(learned);
}

void ReducerImpl::rebuild_buckets(const std::vector<int>& order) {
  auto plan = dp::plan_buckets(param_specs(), order,
                               dp::mib_to_bytes(opt_.bucket_cap_mb),
                               dp::mib_to_bytes(opt_.first_bucket_cap_mb));
  bool same = plan.size() == buckets_.size();
  for (size_t i = 0; same && i < plan.size(); ++i)
    same = plan[i].params == buckets_[i].plan.params;
  if (same) return;  // the observed order packs the same buckets
  // The write-back (and in view mode the gradients' readers) of the old
  // buckets may still run on their streams; in view mode the new buckets
  // copy the gradients out of the old ones before those are freed.
  auto sync_devices = [this] {
#if TUTTI_WITH_CUDA
    for (auto& b : buckets_)
      if (b.plan.layout.device.is_cuda()) {
        cuda::DeviceGuard g(b.plan.layout.device.index);
        TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
      }
#endif
  };
  sync_devices();
  if (!opt_.gradient_as_bucket_view) {
    release_buckets();  // first, so that the pool can hand the memory back
    install_plan(std::move(plan));
  } else {
    std::vector<Bucket> old;
    old.swap(buckets_);
    install_plan(std::move(plan));
    sync_devices();
    buckets_.swap(old);
    release_buckets();
    buckets_.swap(old);
  }
  if (worker_)
    worker_.reset(new dp::BucketWorker(opt_.name, static_cast<int>(buckets_.size()),
                                       [this](int b) { run_on_worker(b); }));
  ++stats_.bucket_rebuilds;
  TUTTI_LOG(kInfo) << "Reducer '" << opt_.name << "': re-planned "
                   << buckets_.size() << " buckets in the observed gradient order";
}

const char* ReducerImpl::mode_name() const {
  switch (mode_) {
    case Mode::kFlat: return "flat";
    case Mode::kHierarchical: return "hierarchical";
    case Mode::kCompressed: return "compressed";
  }
  return "?";
}

void ReducerImpl::set_bucket_collective(BucketCollective fn, int pooled_buffers) {
  std::lock_guard<std::mutex> lock(mu_);
  require_built("set_bucket_collective()");
  TUTTI_ARG_CHECK(!step_in_flight(), "Reducer '", opt_.name,
                  "': set_bucket_collective() during a backward pass");
  TUTTI_ARG_CHECK(pooled_buffers >= 0, "Reducer '", opt_.name,
                  "': pooled_buffers = ", pooled_buffers, " must be >= 0 (0: no pool)");
  TUTTI_ARG_CHECK(pooled_buffers == 0 || (fn && !opt_.gradient_as_bucket_view &&
                                          (order_learned_ || !opt_.learn_bucket_order)),
                  "Reducer '", opt_.name, "': pooled_buffers = ", pooled_buffers,
                  " needs a bucket collective (the write-back reads every bucket), "
                  "gradient_as_bucket_view = false (gradients cannot live in buffers "
                  "that move between buckets) and a fixed bucket order "
                  "(learn_bucket_order = false, or after the first step)");
  TUTTI_ARG_CHECK(!fn || (mode_ == Mode::kFlat && opt_.op == ReduceOp::kAvg &&
                          opt_.gradient_predivide_factor == 1.0),
                  "Reducer '", opt_.name, "': a bucket collective needs the plain "
                  "all-reduce mode (no compressor, hierarchical=false, op kAvg, "
                  "gradient_predivide_factor 1); this reducer is ", mode_name());
  collective_ = std::move(fn);
  if (pooled()) remove_pool();
  if (pooled_buffers > 0) install_pool(pooled_buffers);
  // The hook runs its collectives on its own group, in launch order: one
  // launch chain (bucket order), or buckets on different chains would reach
  // that group in rank-dependent orders.
  if (collective_ && !channels_.empty()) {
    channels_.clear();
    plan_chains();
  }
}

int ReducerImpl::parameter_index(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_name_.find(name);
  TUTTI_ARG_CHECK(it != by_name_.end(), "Reducer '", opt_.name,
                  "': no parameter named '", name, "'");
  return it->second;
}

Tensor ReducerImpl::parameter(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  TUTTI_ARG_CHECK(index >= 0 && index < static_cast<int>(params_.size()),
                  "Reducer '", opt_.name, "': parameter(", index,
                  "): no such parameter (", params_.size(), " registered)");
  return params_[static_cast<size_t>(index)].param;
}

void ReducerImpl::require_built(const char* what) const {
  TUTTI_ARG_CHECK(built_, "Reducer '", opt_.name, "': ", what,
                  " before build(); register the parameters and call build() first");
}

void ReducerImpl::broadcast_parameters(int root, void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  require_built("broadcast_parameters()");
  TUTTI_ARG_CHECK(!step_in_flight(), "Reducer '", opt_.name,
                  "': broadcast_parameters() in the middle of a reducing pass; "
                  "call it between steps");
  std::vector<Tensor> tensors;
  std::vector<std::string> names;
  for (const auto& p : params_) {
    tensors.push_back(p.param);
    names.push_back(p.name);
  }
  dp::broadcast_tensors(*group_, tensors, names, root,
                        dp::mib_to_bytes(opt_.bucket_cap_mb), pool_,
                        opt_.name + " broadcast_parameters", stream);
}

void ReducerImpl::broadcast_state(const StateDict& state, int root, void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  TUTTI_ARG_CHECK(!step_in_flight(), "Reducer '", opt_.name,
                  "': broadcast_state() in the middle of a reducing pass; call "
                  "it between steps");
  const std::string ctx = detail::cat("Reducer '", opt_.name, "' broadcast_state");
  TUTTI_ARG_CHECK(root >= 0 && root < group_->size(), ctx, ": root ", root,
                  " is not a rank of group '", group_->name(), "' of size ",
                  group_->size());
  std::vector<std::string> entries;
  std::vector<Tensor> tensors;
  std::vector<std::string> names;
  for (const auto& nt : state) {
    // Listed (the ranks must agree on it) but not sent: per-rank state such
    // as an error-feedback residual is each rank's own.
    entries.push_back(describe_tensor_entry(nt.name, nt.tensor, nullptr) +
                      (nt.shard.per_rank ? " (per rank)" : ""));
    if (nt.shard.per_rank) continue;
    tensors.push_back(nt.tensor);
    names.push_back(nt.name);
  }
  dp::check_lists_agree(*group_->cpu_communicator(), ctx, {{"state entry", entries}});
  dp::broadcast_tensors(*group_, tensors, names, root,
                        dp::mib_to_bytes(opt_.bucket_cap_mb), pool_,
                        opt_.name + " broadcast_state", stream);
}

int ReducerImpl::num_parameters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(params_.size());
}

bool ReducerImpl::order_fixed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return order_learned_ || !opt_.learn_bucket_order;
}

void ReducerImpl::set_plan_listener(std::function<void(bool)> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  plan_listener_ = std::move(fn);
}

std::function<void(bool)> ReducerImpl::plan_listener() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plan_listener_;
}

bool ReducerImpl::next_pass_reduces() const {
  std::lock_guard<std::mutex> lock(mu_);
  return no_sync_depth_ == 0 && pass_in_step_ + 1 >= opt_.backward_passes_per_step;
}

ReducerStats ReducerImpl::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ReducerStats s = stats_;
  s.bucket_bytes = bucket_bytes();
  return s;
}

// ---- public layer -----------------------------------------------------------

Reducer::Reducer(ProcessGroupPtr group, ReducerOptions options)
    : impl_(new ReducerImpl(std::move(group), std::move(options))) {}
Reducer::~Reducer() = default;

int Reducer::add_parameter(const std::string& name, const Tensor& param,
                           const Tensor& grad) {
  return impl_->add_parameter(name, param, grad);
}
void Reducer::build() { impl_->build(); }
void Reducer::grad_ready(int index, void* stream) { impl_->grad_ready(index, stream); }
void Reducer::mark_unused(int index, void* stream) { impl_->mark_unused(index, stream); }
Tensor Reducer::gradient(int index) const { return impl_->gradient(index); }
std::shared_ptr<const void> Reducer::gradient_storage(int index) const {
  return impl_->gradient_storage(index);
}
// The plan listener runs here, outside the reducer's lock, once the
// synchronize() that fixed the bucket order has returned on this rank (every
// rank reaches it: the order is learned inside a collective call).
bool Reducer::synchronize(void* stream) {
  const bool fixing = !impl_->order_fixed();
  const int64_t rebuilds = fixing ? impl_->stats().bucket_rebuilds : 0;
  if (!impl_->synchronize(stream)) return false;
  if (fixing && impl_->order_fixed()) {
    const auto listener = impl_->plan_listener();
    if (listener) listener(impl_->stats().bucket_rebuilds != rebuilds);
  }
  return true;
}
bool Reducer::bucket_order_fixed() const { return impl_->order_fixed(); }
void Reducer::set_plan_listener(std::function<void(bool replanned)> fn) {
  impl_->set_plan_listener(std::move(fn));
}
void Reducer::set_gradient_scale(float scale) {
  TUTTI_ARG_CHECK(std::isfinite(scale) && scale > 0.0f, impl_->opt_.name,
                  " reducer: gradient scale ", scale,
                  " must be finite and positive");
  impl_->set_grad_scale(scale);
}

NoSyncGuard Reducer::no_sync() {
  impl_->enter_no_sync();
  return NoSyncGuard(impl_.get());
}
void Reducer::broadcast_parameters(int root, void* stream) {
  impl_->broadcast_parameters(root, stream);
}
void Reducer::broadcast_state(const StateDict& state, int root, void* stream) {
  impl_->broadcast_state(state, root, stream);
}
void Reducer::broadcast_state(Stateful& component, int root, void* stream) {
  impl_->broadcast_state(component.state_dict(), root, stream);
  if (impl_->group_->rank() != root) component.on_state_loaded();
}
void Reducer::set_bucket_collective(BucketCollective fn, int pooled_buffers) {
  impl_->set_bucket_collective(std::move(fn), pooled_buffers);
}
int Reducer::parameter_index(const std::string& name) const {
  return impl_->parameter_index(name);
}
Tensor Reducer::parameter(int index) const { return impl_->parameter(index); }
const std::vector<BucketLayout>& Reducer::buckets() const { return impl_->layouts_; }
int Reducer::num_parameters() const { return impl_->num_parameters(); }
bool Reducer::next_pass_reduces() const { return impl_->next_pass_reduces(); }
const ReducerOptions& Reducer::options() const { return impl_->opt_; }
const ProcessGroupPtr& Reducer::group() const { return impl_->group_; }
ReducerStats Reducer::stats() const { return impl_->stats(); }

StateDict Reducer::state_dict() {
  NamedTensor step;
  step.name = impl_->opt_.name + "/step";
  step.tensor = Tensor(impl_->step_counter(), DType::kInt64, Shape{1});
  return {step};
}

NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept : impl_(other.impl_) {
  other.impl_ = nullptr;
}
NoSyncGuard::~NoSyncGuard() {
  if (impl_) impl_->exit_no_sync();
}

}  // namespace tutti
