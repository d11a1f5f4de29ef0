// The per-step path of the reducer: grad_ready -> copy into the bucket ->
// launch in chain order -> synchronize: fill unready slots, launch the rest, wait,
// fused write-back.  See reducer_impl.h for the protocol.
#include <chrono>
#include <cmath>

#include "compression/cast.h"
#include "core/check.h"
#include "core/clock.h"
#include "core/cuda_utils.h"
#include "core/timeline.h"
#include "data_parallel/reducer_impl.h"
#include "tutti/log.h"

namespace tutti {

using dp::Bucket;
using dp::Mode;


// What the sum is divided by: W / f (gradient_predivide_factor f; the
// bucket was divided by f before the sum), 1 for kSum and compressors.
double ReducerImpl::post_divisor() const {
  if (mode_ == Mode::kCompressed || opt_.op == ReduceOp::kSum) return 1;
  return static_cast<double>(group_->size()) / opt_.gradient_predivide_factor;
}

// The integer divisor fused into the write-back: post_divisor() when it is a
// whole number >= 1, else 1 (write_back() then divides the bucket first).
int64_t ReducerImpl::divisor() const {
  const double d = post_divisor();
  return d >= 1 && std::floor(d) == d ? static_cast<int64_t>(d) : 1;
}

// A host bucket on the flat path whose divisor is the group size averages
// in its all-reduce (ReduceOp::kAvg): the communicator divides on the
// chain's thread as soon as this bucket's sum is in, while other buckets are
// still on the wire, instead of synchronize() dividing every bucket after
// the last one (~4 ms per 15 MB on the critical path).  The same float
// division, so the same bits.  CUDA buckets keep the division fused into
// their write-back kernel.
bool ReducerImpl::averaged_by_allreduce(const Bucket& b) const {
  return mode_ == Mode::kFlat && !collective_ && b.plan.layout.device.is_cpu() &&
         divisor() == group_->size() && static_cast<double>(divisor()) == post_divisor();
}

// In place: bucket /= divisor, rounded once in the bucket's dtype (float32,
// float16 or bfloat16; add_parameter refuses others when f != 1).  The
// cast compressor's conversion, src == dst.
void ReducerImpl::divide_bucket(Bucket& b, double by, void* stream) {
  const BucketLayout& l = b.plan.layout;
  compression::cast_convert(l.device, b.buffer->data(), l.dtype, b.buffer->data(),
                            l.dtype, l.numel, static_cast<float>(by), stream);
}

// CUDA: a bucket is ordered on the stream of its first producer; a copy made
// on another stream is joined into it with an event, so the launch (which
// waits for b.stream) sees every copy.
void ReducerImpl::set_stream(Bucket& b, void* stream) {
  if (!b.stream_set) {
    b.stream = stream;
    b.stream_set = true;
    return;
  }
  if (b.stream == stream || !b.plan.layout.device.is_cuda()) return;
#if TUTTI_WITH_CUDA
  cuda::DeviceGuard g(b.plan.layout.device.index);
  b.joined->record(static_cast<cudaStream_t>(stream));
  TUTTI_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(b.stream),
                                       b.joined->get(), 0));
#endif
}

void ReducerImpl::grad_ready(int index, void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  require_built("grad_ready()");
  TUTTI_ARG_CHECK(index >= 0 && index < static_cast<int>(params_.size()),
                  "Reducer '", opt_.name, "': grad_ready(", index,
                  "): no such parameter (", params_.size(), " registered)");
  dp::Param& p = params_[static_cast<size_t>(index)];
  if (!order_learned_ && !p.observed) {
    p.observed = true;
    observed_order_.push_back(index);
  }
  p.used = true;
  if (no_sync_depth_ > 0) return;
  TUTTI_ARG_CHECK(!p.marked_unused, "Reducer '", opt_.name, "': grad_ready('",
                  p.name, "') for a parameter already filled as unused in this "
                  "pass (", opt_.static_graph
                      ? "static_graph: it was not used in the first step; a "
                        "graph whose set of used parameters changes needs "
                        "static_graph=false"
                      : "mark_unused() was called for it",
                  "); its bucket may already be reduced without it");
  TUTTI_ARG_CHECK(!p.seen, "Reducer '", opt_.name, "': grad_ready('", p.name,
                  "') called twice in one backward pass; call synchronize() at "
                  "the end of every backward pass (backward_passes_per_step = ",
                  opt_.backward_passes_per_step, " counts those calls)");
  p.seen = true;
  ++seen_in_pass_;
  if (pass_in_step_ + 1 < opt_.backward_passes_per_step) return;  // accumulate
  Bucket& b = buckets_[static_cast<size_t>(p.bucket)];
  TUTTI_TIMELINE(bucket_grad(p.bucket));
  try {
    begin_reducing_pass(stream);
    copy_into_bucket(p, b, stream);
    set_stream(b, stream);
    ++filled_in_pass_;
    mark_filled(b, true);
  } catch (...) {
    abandon_step();
    throw;
  }
}

void ReducerImpl::mark_unused(int index, void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  require_built("mark_unused()");
  TUTTI_ARG_CHECK(opt_.find_unused_parameters, "Reducer '", opt_.name,
                  "': mark_unused() needs find_unused_parameters=true");
  TUTTI_ARG_CHECK(index >= 0 && index < static_cast<int>(params_.size()),
                  "Reducer '", opt_.name, "': mark_unused(", index,
                  "): no such parameter (", params_.size(), " registered)");
  dp::Param& p = params_[static_cast<size_t>(index)];
  if (no_sync_depth_ > 0 || pass_in_step_ + 1 < opt_.backward_passes_per_step)
    return;  // an accumulation pass: nothing to fill
  TUTTI_ARG_CHECK(!p.seen, "Reducer '", opt_.name, "': mark_unused('", p.name,
                  "') after it was marked ready or unused in this pass");
  try {
    fill_early(p, stream);
  } catch (...) {
    abandon_step();
    throw;
  }
}

// A slot filled before synchronize(): its bucket may launch now.
void ReducerImpl::fill_early(dp::Param& p, void* stream) {
  Bucket& b = buckets_[static_cast<size_t>(p.bucket)];
  if (!b.stream_set) set_stream(b, stream);
  fill_slot(p, b);
  p.marked_unused = true;
  ++stats_.marked_unused;
  mark_filled(b, true);
}

// static_graph: the parameters unused in the first step are filled at the
// start of every later reducing pass.
void ReducerImpl::begin_reducing_pass(void* stream) {
  if (pass_begun_) return;
  pass_begun_ = true;
  for (int index : static_unused_) {
    dp::Param& p = params_[static_cast<size_t>(index)];
    if (!p.seen) fill_early(p, stream);
  }
}

bool ReducerImpl::is_view(const dp::Param& p, const Bucket& b) const {
  return p.grad.data() == b.buffer->at(p.offset);
}

void ReducerImpl::copy_into_bucket(dp::Param& p, Bucket& b, void* stream) {
  acquire_buffer(b, stream);
  if (is_view(p, b)) return;  // gradient_as_bucket_view: already there
  b.buffer->copy_in(p.offset, p.grad, stream);
  stats_.bytes_copied_in += static_cast<int64_t>(p.grad.nbytes());
}

void ReducerImpl::mark_filled(Bucket& b, bool early) {
  if (--b.pending == 0) launch_ready(b.chain, early);
}

void ReducerImpl::launch_ready(int chain, bool early) {
  const std::vector<int>& list = chains_[static_cast<size_t>(chain)];
  size_t& next = chain_next_[static_cast<size_t>(chain)];
  while (next < list.size() && buckets_[static_cast<size_t>(list[next])].pending == 0)
    launch(list[next++], early);
}

void ReducerImpl::launch(int index, bool early) {
  Bucket& b = buckets_[static_cast<size_t>(index)];
  cuda::OptionalDeviceGuard device(b.plan.layout.device);  // NCCL submission
  b.issued = true;
  b.launch_step = step_;
  b.launch_grad_scale = grad_scale_;
  TUTTI_TIMELINE(bucket_launch(index, static_cast<int64_t>(b.plan.bytes)));
  ++stats_.buckets_reduced;
  if (early) ++stats_.buckets_launched_early;
  stats_.bytes_reduced += static_cast<int64_t>(b.plan.bytes);
  // gradient_predivide_factor: divide before the sum (Horovod's prescale),
  // on the bucket's stream ahead of the all-reduce or the worker's start.
  if (mode_ != Mode::kCompressed && opt_.gradient_predivide_factor != 1.0)
    divide_bucket(b, opt_.gradient_predivide_factor, b.stream);
  if (mode_ != Mode::kFlat) {
#if TUTTI_WITH_CUDA
    if (b.launched) b.launched->record(static_cast<cudaStream_t>(b.stream));
#endif
    worker_->enqueue(index);
    return;
  }
  OpOptions o;
  o.name = b.op_name;
  o.stream = b.stream;
  if (collective_) {
    b.work = collective_(index, b.buffer->view(), o);
    return;
  }
  if (group_->size() == 1) return;  // the sum over one rank is the bucket
  Communicator& comm =
      channels_.empty() ? *group_ : *channels_[static_cast<size_t>(b.chain)];
  b.work = comm.allreduce_async(b.buffer->view(b.plan.layout.numel),
                                averaged_by_allreduce(b) ? ReduceOp::kAvg : ReduceOp::kSum,
                                o);
}

// On the worker thread: reads only what launch() wrote before enqueue().
// The worker is a thread of its own: its current device is 0 until set, so
// every job runs under the bucket's device (compressor kernels, events,
// NCCL calls); without it, local ranks >= 1 would launch onto device 0.
void ReducerImpl::run_on_worker(int index) {
  Bucket& b = buckets_[static_cast<size_t>(index)];
  cuda::OptionalDeviceGuard device(b.plan.layout.device);
  if (mode_ == Mode::kCompressed) {
    CompressContext ctx;
    ctx.comm = group_.get();
    ctx.step = b.launch_step;
    ctx.grad_scale = b.launch_grad_scale;
    ctx.stream = b.stream;
    // f = 1 (the default) leaves the split to the compressor: the cast
    // compressors divide by W before the sum, where float16 cannot overflow.
    const double f = opt_.gradient_predivide_factor;
    ctx.predivide_factor = f == 1.0 ? 0.0 : f;
    opt_.compressor->allreduce(index, b.buffer->view(b.plan.layout.numel), ctx);
    return;
  }
  // Pipelined across buckets: begin(k) (node stage, cross-node all-reduce
  // started), then finish(k - 1), so the cross-node all-reduce of bucket
  // k - 1 runs during bucket k's node stage.  Every rank runs the halves in
  // this fixed order (never in an order that depends on timing), so the
  // node and cross-node communicators see the same sequence everywhere.
  // wait_bucket(k) therefore waits for job k + 1.
  hier_begin(b);
  if (index > 0) hier_finish(buckets_[static_cast<size_t>(index - 1)]);
  if (index + 1 == static_cast<int>(buckets_.size())) hier_finish(b);
}

// CUDA: the stages run on the bucket's side stream, which first waits for
// the producer's copies (Bucket::side); host buckets use no stream.
void* ReducerImpl::hier_stream(Bucket& b) {
#if TUTTI_WITH_CUDA
  if (b.side) return b.side->get();
#endif
  return b.stream;
}

void ReducerImpl::hier_begin(Bucket& b) {
  cuda::OptionalDeviceGuard device(b.plan.layout.device);
#if TUTTI_WITH_CUDA
  if (b.side)
    TUTTI_CUDA_CHECK(cudaStreamWaitEvent(b.side->get(), b.launched->get(), 0));
#endif
  b.cross_work = hier_->begin(b.buffer->view(), b.shard.view(), b.op_name, hier_stream(b));
}

void ReducerImpl::hier_finish(Bucket& b) {
  cuda::OptionalDeviceGuard device(b.plan.layout.device);
  WorkPtr cross = std::move(b.cross_work);
  hier_->finish(b.buffer->view(), b.shard.view(), b.op_name, hier_stream(b), cross);
#if TUTTI_WITH_CUDA
  if (b.side) b.reduced->record(b.side->get());
#endif
}

void ReducerImpl::fill_missing(Bucket& b, void* stream) {
  if (b.pending == 0) return;
  if (!b.stream_set) set_stream(b, stream);
  for (int index : b.plan.params) {
    dp::Param& p = params_[static_cast<size_t>(index)];
    if (p.seen) continue;
    fill_slot(p, b);
    --b.pending;
    ++stats_.unready_gradients;
  }
}

// A slot whose gradient this pass does not produce.  Used in an earlier pass
// of this step: its accumulated gradient counts.  Never used: it contributes
// zero on this rank (in view mode that zeroes the gradient itself, as the
// copying mode's write-back would overwrite it).
void ReducerImpl::fill_slot(dp::Param& p, Bucket& b) {
  if (p.used) {
    copy_into_bucket(p, b, b.stream);
  } else {
    acquire_buffer(b, b.stream);
    b.buffer->zero(p.offset, p.grad.numel(), b.stream);
  }
  p.seen = true;
  ++filled_in_pass_;
}

void ReducerImpl::wait_bucket(int index) {
  Bucket& b = buckets_[static_cast<size_t>(index)];
  if (mode_ == Mode::kHierarchical) {
    // Bucket k is finished by job k + 1 (run_on_worker), when launched.
    // (one chain: bucket k + 1 is issued only after bucket k)
    const size_t next = static_cast<size_t>(index) + 1;
    worker_->wait(next < buckets_.size() && buckets_[next].issued ? index + 1 : index);
  } else if (mode_ != Mode::kFlat) {
    worker_->wait(index);  // host-side only
  } else if (b.work) {
    cuda::OptionalDeviceGuard device(b.plan.layout.device);  // stream waits
    b.work->wait();
  }
  TUTTI_TIMELINE(bucket_ready(index));
}

void ReducerImpl::write_back(Bucket& b, void* stream) {
  const BucketLayout& l = b.plan.layout;
  // gradient_as_bucket_view: the chunks point into the bucket itself; a sum
  // is already in place.
  const bool in_place = opt_.gradient_as_bucket_view;
  // Averaged by the all-reduce (launch()): nothing left to divide.
  const int64_t div = averaged_by_allreduce(b) ? 1 : divisor();
  // A bucket collective's owner consumes the result (set_bucket_collective).
  const bool nothing_to_do = (in_place && div == 1) || collective_;
  // A post divisor W / f that is not a whole number: divide the bucket
  // first (Horovod's postscale), then write back without dividing.
  const bool divide_first = static_cast<double>(divisor()) != post_divisor();
  if (divide_first && l.device.is_cpu()) divide_bucket(b, post_divisor(), nullptr);
  if (nothing_to_do && l.device.is_cpu()) return;
  if (!in_place && !collective_) stats_.bytes_copied_out += static_cast<int64_t>(b.plan.bytes);
  if (l.device.is_cpu()) {
    dp::unflatten_scale_cpu(b.buffer->data(), l.dtype, b.chunks.data(),
                            b.chunks.size(), div);
    return;
  }
#if TUTTI_WITH_CUDA
  cuda::DeviceGuard g(l.device.index);
  const cudaStream_t s = static_cast<cudaStream_t>(b.stream);
  if (b.side && mode_ == Mode::kHierarchical)  // the reduction ran on b.side
    TUTTI_CUDA_CHECK(cudaStreamWaitEvent(s, b.reduced->get(), 0));
  if (divide_first) divide_bucket(b, post_divisor(), s);
  if (!nothing_to_do)
    kernels::launch_unflatten_scale(
      b.buffer->data(), l.dtype,
      static_cast<const kernels::UnflattenChunk*>(b.device_chunks.data()),
      static_cast<int>(b.chunks.size()), divisor(), s);
  if (stream != b.stream) {  // the caller consumes the gradients on `stream`
    b.joined->record(s);
    TUTTI_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                         b.joined->get(), 0));
  }
#else
  (void)stream;
#endif
}

bool ReducerImpl::synchronize(void* stream) {
  TUTTI_TIMELINE_SCOPE(tl, timeline::kFramework, "reducer", "synchronize");
  std::lock_guard<std::mutex> lock(mu_);
  require_built("synchronize()");
  if (no_sync_depth_ > 0) {
    ++stats_.accumulation_passes;
    return false;
  }
  if (pass_in_step_ + 1 < opt_.backward_passes_per_step) {
    ++pass_in_step_;
    for (auto& p : params_) p.seen = false;
    seen_in_pass_ = 0;
    ++stats_.accumulation_passes;
    return false;
  }
  try {
    // Unready gradients, then every bucket not launched yet, each chain in
    // its order: the same sequence of collectives per chain on every rank.
    for (auto& b : buckets_)
      if (!b.issued) fill_missing(b, stream);
    for (size_t c = 0; c < chains_.size(); ++c) launch_ready(static_cast<int>(c), false);
    for (size_t i = 0; i < buckets_.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      wait_bucket(static_cast<int>(i));
      const auto t1 = std::chrono::steady_clock::now();
      write_back(buckets_[i], stream);
      release_buffer(buckets_[i]);  // pooled: the collective is done
      stats_.wait_seconds += std::chrono::duration<double>(t1 - t0).count();
      stats_.writeback_seconds += seconds_since(t1);
    }
  } catch (...) {
    abandon_step();
    ++step_;  // a failed pass consumes its number: steps stay increasing
    throw;
  }
  reset_step();
  ++step_;
  ++stats_.steps;
  if (!replicas_checked_) {  // collective, once; throws on every rank or none
    replicas_checked_ = true;
    if (opt_.check_parameters) check_replicas(stream);
  }
  if (!order_learned_) learn_order();  // collective, once
  return true;
}

Tensor ReducerImpl::gradient(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  TUTTI_ARG_CHECK(index >= 0 && index < static_cast<int>(params_.size()),
                  "Reducer '", opt_.name, "': gradient(", index,
                  "): no such parameter (", params_.size(), " registered)");
  const dp::Param& p = params_[static_cast<size_t>(index)];
  TUTTI_ARG_CHECK(!p.grad_absent, "Reducer '", opt_.name, "': gradient('", p.name,
                  "') before build(): with gradient_as_bucket_view it lives in "
                  "a bucket build() allocates");
  return p.grad;
}

std::shared_ptr<const void> ReducerImpl::gradient_storage(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  TUTTI_ARG_CHECK(index >= 0 && index < static_cast<int>(params_.size()),
                  "Reducer '", opt_.name, "': gradient_storage(", index, ")");
  const dp::Param& p = params_[static_cast<size_t>(index)];
  if (!built_ || !opt_.gradient_as_bucket_view) return nullptr;
  return buckets_[static_cast<size_t>(p.bucket)].buffer;
}

// After a failure: let every launched bucket finish (its buffer must stay
// untouched until then), drop the step, keep the reducer usable.
void ReducerImpl::abandon_step() noexcept {
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (!buckets_[i].issued) continue;
    try {
      wait_bucket(static_cast<int>(i));
    } catch (const std::exception& e) {
      TUTTI_LOG(kDebug) << "Reducer '" << opt_.name << "': dropping bucket " << i
                        << " of the failed step: " << e.what();
    }
  }
  try {
    if (worker_) worker_->drain();
    // Hierarchical: a cross-node all-reduce whose bucket was never finished
    // must end before the buffers are reused.
    for (auto& b : buckets_)
      if (b.cross_work) {
        try {
          b.cross_work->wait();
        } catch (const std::exception& e) {
          TUTTI_LOG(kDebug) << "Reducer '" << opt_.name << "': dropping "
                            << b.op_name << "'s cross-node all-reduce: " << e.what();
        }
        b.cross_work.reset();
      }
    reset_step();
  } catch (const std::exception& e) {
    TUTTI_LOG(kError) << "Reducer '" << opt_.name
                      << "': could not reset after a failed step: " << e.what();
  }
}

void ReducerImpl::reset_step() {
  for (auto& b : buckets_) {
    release_buffer(b);  // pooled: after a failure, once its work ended
    b.pending = static_cast<int>(b.plan.params.size());
    b.stream = nullptr;
    b.stream_set = false;
    b.issued = false;
    b.work.reset();
    b.cross_work.reset();
  }
  for (auto& p : params_) {
    p.seen = false;
    p.used = false;
    p.marked_unused = false;
  }
  pass_begun_ = false;
  for (auto& n : chain_next_) n = 0;
  filled_in_pass_ = 0;
  seen_in_pass_ = 0;
  pass_in_step_ = 0;
  if (worker_) worker_->reset();
}

void ReducerImpl::enter_no_sync() {
  std::lock_guard<std::mutex> lock(mu_);
  TUTTI_ARG_CHECK(seen_in_pass_ == 0, "Reducer '", opt_.name,
                  "': no_sync() opened after ", seen_in_pass_,
                  " gradient(s) of this backward pass were marked ready; open "
                  "it before the backward pass");
  ++no_sync_depth_;
}

void ReducerImpl::exit_no_sync() {
  std::lock_guard<std::mutex> lock(mu_);
  if (no_sync_depth_ > 0) --no_sync_depth_;
}

}  // namespace tutti
