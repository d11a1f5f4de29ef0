// DynamicLossScaler: the scale state machine (GradScaler rules plus
// hysteresis and bounds), the per-step check/agree bookkeeping and the
// state that checkpoints carry.
#include <algorithm>
#include <cmath>

#include "amp/overflow_agreement.h"
#include "core/check.h"
#include "core/timeline.h"
#include "tutti/amp.h"
#include "tutti/log.h"

namespace tutti {
namespace amp {
namespace {

// A scale the scaler can use: positive, finite, and with a finite float
// reciprocal (the unscale multiplies by 1/scale; below about 2^-128 that is
// Inf).  The smallest such power of two is 2^-127.
bool usable_scale(float s) { return std::isfinite(s) && s > 0 && std::isfinite(1.0f / s); }

void validate(const LossScalerOptions& o) {
  TUTTI_ARG_CHECK(o.precision == DType::kFloat16 || o.precision == DType::kBFloat16 ||
                      o.precision == DType::kFloat32,
                  "LossScalerOptions::precision is ", dtype_name(o.precision),
                  "; expected float16 (dynamic scaling), bfloat16 or float32");
  TUTTI_ARG_CHECK(usable_scale(o.init_scale), "LossScalerOptions::init_scale ",
                  o.init_scale, " must be finite and positive, with a finite "
                  "float reciprocal (>= 2^-127)");
  TUTTI_ARG_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1,
                  "LossScalerOptions::growth_factor ", o.growth_factor,
                  " must be a finite number above 1");
  TUTTI_ARG_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1,
                  "LossScalerOptions::backoff_factor ", o.backoff_factor,
                  " must be in (0, 1)");
  TUTTI_ARG_CHECK(o.growth_interval >= 1, "LossScalerOptions::growth_interval ",
                  o.growth_interval, " must be at least 1");
  TUTTI_ARG_CHECK(o.hysteresis >= 1, "LossScalerOptions::hysteresis ",
                  o.hysteresis, " must be at least 1");
  TUTTI_ARG_CHECK(o.min_scale >= 0 && std::isfinite(o.min_scale) &&
                      o.min_scale <= o.init_scale && o.init_scale <= o.max_scale,
                  "LossScalerOptions: expected 0 <= min_scale <= init_scale <= "
                  "max_scale, got ", o.min_scale, ", ", o.init_scale, ", ",
                  o.max_scale);
  TUTTI_ARG_CHECK(o.max_consecutive_skips >= 0,
                  "LossScalerOptions::max_consecutive_skips ",
                  o.max_consecutive_skips, " must be >= 0 (0: no limit)");
}

}  // namespace

DynamicLossScaler::DynamicLossScaler(const LossScalerOptions& options)
    : options_(options) {
  validate(options_);
  scale_ = dynamic() ? options_.init_scale : 1.0f;
  hysteresis_tracker_ = options_.hysteresis;
}

DynamicLossScaler::~DynamicLossScaler() = default;

bool DynamicLossScaler::dynamic() const {
  return options_.precision == DType::kFloat16;
}

// float32 division is correctly rounded, so this equals GradScaler's
// scale.double().reciprocal().float().
float DynamicLossScaler::inv_scale() const { return 1.0f / scale_; }

bool DynamicLossScaler::backoff_due() const { return hysteresis_tracker_ <= 1; }

float DynamicLossScaler::backoff_target() const {
  return std::max(scale_ * options_.backoff_factor, options_.min_scale);
}

bool DynamicLossScaler::can_shrink() const {
  const float next = backoff_target();
  return next < scale_ && usable_scale(next);
}

void DynamicLossScaler::check_not_unscaled(const std::vector<Tensor>& grads,
                                           const std::vector<std::string>& names) {
  // A gradient unscaled twice in one step would silently be divided by the
  // scale twice: keep the data pointers unscaled since the last update()
  // (sorted, so the check is n log n on vectors that keep their capacity).
  // scratch_ becomes the new set; unscale_and_check() adopts it once the
  // unscale succeeded.
  scratch_ = unscaled_;
  for (const Tensor& g : grads)
    if (g.numel() > 0) scratch_.push_back(g.data());
  std::sort(scratch_.begin(), scratch_.end());
  auto dup = std::adjacent_find(scratch_.begin(), scratch_.end());
  if (dup != scratch_.end()) {
    size_t i = 0;
    while (i < grads.size() && grads[i].data() != *dup) ++i;
    const std::string name = i < names.size() && !names[i].empty()
                                 ? "'" + names[i] + "'"
                                 : "#" + std::to_string(i);
    TUTTI_THROW(kInvalidArgument, "DynamicLossScaler::unscale_and_check: gradient ",
                name, " was already unscaled in step ", steps_,
                "; call update() before unscaling it again");
  }
}

bool DynamicLossScaler::unscale_and_check(const std::vector<Tensor>& grads,
                                          const StepCheckOptions& options) {
  const bool scaled = scale_ != 1.0f;
  if (scaled) check_not_unscaled(grads, options.names);
  const NonFiniteReport local = amp::unscale_and_check(grads, inv_scale(), options.stream);
  if (scaled) unscaled_.swap(scratch_);
  return record(local, options);
}

bool DynamicLossScaler::check(const std::vector<Tensor>& grads,
                              const StepCheckOptions& options) {
  return record(check_finite(grads, options.stream), options);
}

bool DynamicLossScaler::agree(const NonFiniteReport& local,
                              const StepCheckOptions& options) {
  return record(local, options);
}

bool DynamicLossScaler::policy_due() const {
  const bool at_min = dynamic() && backoff_due() && !can_shrink();
  const bool too_many = options_.max_consecutive_skips > 0 &&
                        consecutive_skips_ + 1 >= options_.max_consecutive_skips;
  return at_min || too_many;
}

bool DynamicLossScaler::record(const NonFiniteReport& local,
                               const StepCheckOptions& options) {
  const bool found = agree_flag(local.found, options.groups, options.already_agreed);
  checked_ = true;
  if (found) {
    // Every rank holds the same state and the same agreed flag, so every
    // rank of the groups takes this branch together (the gather is a
    // collective).  Only paid when update() is going to report.
    const std::string mine = local.found ? local.describe(options.names) : "";
    if (policy_due()) {
      const std::string all = gather_overflow_report(mine, options.groups);
      if (!all.empty()) overflow_report_ += (overflow_report_.empty() ? "" : "; ") + all;
    } else if (!mine.empty()) {
      TUTTI_LOG(kInfo) << "loss scaler step " << steps_ << ": non-finite gradients in "
                       << mine;
    }
  }
  found_ = found_ || found;
  return found_;
}

ScaleUpdate DynamicLossScaler::update() {
  TUTTI_ARG_CHECK(checked_, "DynamicLossScaler::update() at step ", steps_,
                  " without a non-finite check since the last update(): call "
                  "unscale_and_check(), check() or agree() first");
  ScaleUpdate u;
  u.old_scale = scale_;
  u.skipped = found_;
  const int64_t step = steps_;
  std::string policy;  // why at_min_scale applies, empty if it does not
  if (found_) {
    ++skipped_steps_;
    ++consecutive_skips_;
    last_overflow_step_ = step;
    if (dynamic()) {
      growth_tracker_ = 0;
      const bool due = backoff_due();
      hysteresis_tracker_ = std::max<int64_t>(hysteresis_tracker_ - 1, 0);
      if (due) {
        if (can_shrink()) {
          scale_ = backoff_target();
          u.backed_off = true;
          if (scale_ <= options_.min_scale)
            TUTTI_LOG(kWarn) << "loss scaler step " << step
                             << ": the loss scale reached its minimum " << scale_;
        } else {
          policy = detail::cat("an overflow needs a loss scale below the minimum ",
                               options_.min_scale, " (scale ", scale_, ")");
        }
      }
    }
    if (policy.empty() && options_.max_consecutive_skips > 0 &&
        consecutive_skips_ >= options_.max_consecutive_skips)
      policy = detail::cat(consecutive_skips_,
                           " steps in a row had non-finite gradients "
                           "(max_consecutive_skips ",
                           options_.max_consecutive_skips, ")");
  } else {
    consecutive_skips_ = 0;
    if (dynamic()) {
      if (options_.consecutive_hysteresis) hysteresis_tracker_ = options_.hysteresis;
      if (++growth_tracker_ >= options_.growth_interval) {
        growth_tracker_ = 0;
        hysteresis_tracker_ = options_.hysteresis;
        const float next = std::min(scale_ * options_.growth_factor, options_.max_scale);
        if (std::isfinite(next) && next > scale_) {
          scale_ = next;
          u.grew = true;
        }
      }
    }
  }
  ++steps_;
  u.new_scale = scale_;
  TUTTI_TIMELINE(instant(timeline::kAmp, "amp", u.skipped ? "skipped step" : "scale update", &timeline::Args().i("step", step).d("old_scale", u.old_scale).d("new_scale", u.new_scale).i("skipped_total", skipped_steps_)));
  const std::string report = overflow_report_;
  checked_ = false;
  found_ = false;
  overflow_report_.clear();
  unscaled_.clear();
  if (!policy.empty()) {
    const std::string msg = detail::cat(
        "loss scaler step ", step, ": ", policy, "; the step was skipped (",
        skipped_steps_, " skipped so far).  Non-finite gradients: ",
        report.empty() ? std::string("(no rank recorded names)") : report,
        ".  The gradients overflow even at the smallest scale or hold NaN: "
        "look for a diverging loss, a too-high learning rate or an operation "
        "that overflows in float16 (LossScalerOptions::at_min_scale kWarn "
        "keeps skipping instead)");
    if (options_.at_min_scale == MinScalePolicy::kError)
      TUTTI_THROW(kInvalidArgument, msg);
    TUTTI_LOG(kWarn) << msg;
  }
  return u;
}

StateDict DynamicLossScaler::state_dict() {
  const std::string& p = options_.state_prefix;
  auto one = [&](const char* name, auto* value) {
    NamedTensor t;
    t.name = p + "/" + name;
    t.tensor = Tensor::of(value, 1);
    return t;
  };
  return {one("scale", &scale_),
          one("growth_tracker", &growth_tracker_),
          one("hysteresis_tracker", &hysteresis_tracker_),
          one("steps", &steps_),
          one("skipped_steps", &skipped_steps_),
          one("consecutive_skips", &consecutive_skips_),
          one("last_overflow_step", &last_overflow_step_)};
}

void DynamicLossScaler::on_state_loaded() {
  const std::string& p = options_.state_prefix;
  if (!usable_scale(scale_))
    TUTTI_THROW(kCorrupt, "loaded ", p, "/scale is ", scale_,
                "; a loss scale is a positive finite number with a finite "
                "float reciprocal (>= 2^-127)");
  auto bad = [&](const char* name, int64_t v, const char* expected) {
    TUTTI_THROW(kCorrupt, "loaded ", p, "/", name, " is ", v, "; expected ", expected);
  };
  if (growth_tracker_ < 0) bad("growth_tracker", growth_tracker_, ">= 0");
  if (hysteresis_tracker_ < 0) bad("hysteresis_tracker", hysteresis_tracker_, ">= 0");
  if (steps_ < 0) bad("steps", steps_, ">= 0");
  if (skipped_steps_ < 0 || skipped_steps_ > steps_)
    bad("skipped_steps", skipped_steps_, "between 0 and steps");
  if (consecutive_skips_ < 0 || consecutive_skips_ > skipped_steps_)
    bad("consecutive_skips", consecutive_skips_, "between 0 and skipped_steps");
  if (last_overflow_step_ < -1 || last_overflow_step_ >= steps_)
    bad("last_overflow_step", last_overflow_step_, "-1 or a step before steps");
  // Options may legitimately change between runs (a smaller hysteresis):
  // clamp rather than fail.
  hysteresis_tracker_ = std::min(hysteresis_tracker_, options_.hysteresis);
  if (!dynamic() && scale_ != 1.0f) {
    TUTTI_LOG(kWarn) << "loaded loss scale " << scale_ << " reset to 1: this scaler's precision is "
                     << dtype_name(options_.precision) << " (no loss scaling)";
    scale_ = 1.0f;
  }
  checked_ = false;
  found_ = false;
  overflow_report_.clear();
  unscaled_.clear();
}

}  // namespace amp
}  // namespace tutti
