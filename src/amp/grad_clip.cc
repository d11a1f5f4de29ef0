// Global-norm gradient clipping over a model-parallel group.
//
// Combining partial norms: each rank contributes the squared norm of its
// sharded tensors plus, on group rank 0 only, its replicated tensors
// (Megatron's rule: replicated parameters counted once).  The partials are
// all-gathered and added in rank order on every rank, rather than
// all-reduced, so every rank computes a bit-identical total whatever
// reduction order the transport uses: the clip coefficient, and thus the
// parameters, stay identical across the group.
#include <cmath>
#include <limits>

#include "core/check.h"
#include "tutti/amp.h"

namespace tutti {
namespace amp {
namespace {

bool is_inf_norm(double t) { return std::isinf(t) && t > 0; }

void check_options(const std::vector<Tensor>& grads, const ClipOptions& o) {
  TUTTI_ARG_CHECK(o.norm_type == 2.0 || is_inf_norm(o.norm_type),
                  "amp::clip_grad_norm: norm_type ", o.norm_type,
                  " is not supported (2 or infinity)");
  TUTTI_ARG_CHECK(o.replicated.empty() || o.replicated.size() == grads.size(),
                  "amp::clip_grad_norm: ", o.replicated.size(),
                  " replicated flags for ", grads.size(), " gradients");
  TUTTI_ARG_CHECK(o.eps >= 0, "amp::clip_grad_norm: eps ", o.eps, " is negative");
}

// Every rank's value over the group, combined in rank order.
double combine_over_group(double mine, Communicator* group, bool max) {
  if (group == nullptr || group->size() == 1) return mine;
  std::vector<double> all(group->size());
  OpOptions o;
  o.name = "amp grad norm";
  group->allgather(Tensor::of(&mine, 1), Tensor::of(all), o);
  double acc = max ? all[0] : 0.0;
  for (size_t r = 0; r < all.size(); ++r) {
    if (!max) {
      acc += all[r];
    } else if (std::isnan(all[r]) || std::isnan(acc)) {
      acc = std::numeric_limits<double>::quiet_NaN();
    } else {
      acc = std::max(acc, all[r]);
    }
  }
  return acc;
}

double norm_of(const std::vector<Tensor>& grads, const ClipOptions& o,
               TensorNorms* norms) {
  check_options(grads, o);
  *norms = multi_tensor_norms(grads, o.stream);
  const bool first = o.group == nullptr || o.group->rank() == 0;
  if (o.norm_type == 2.0) {
    double sharded = 0, replicated = 0;
    for (size_t i = 0; i < grads.size(); ++i)
      (!o.replicated.empty() && o.replicated[i] ? replicated : sharded) +=
          norms->sum_squares[i];
    return std::sqrt(combine_over_group(sharded + (first ? replicated : 0.0),
                                        o.group, false));
  }
  double m = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    // A NaN sum means a NaN element: the max-norm is NaN, too.
    const double v = std::isnan(norms->sum_squares[i])
                         ? std::numeric_limits<double>::quiet_NaN()
                         : norms->max_abs[i];
    m = std::isnan(v) || std::isnan(m) ? std::numeric_limits<double>::quiet_NaN()
                                       : std::max(m, v);
  }
  return combine_over_group(m, o.group, true);
}

}  // namespace

double grad_norm(const std::vector<Tensor>& grads, const ClipOptions& options) {
  TensorNorms norms;
  return norm_of(grads, options, &norms);
}

ClipResult clip_grad_norm(const std::vector<Tensor>& grads, double max_norm,
                          const ClipOptions& options) {
  TUTTI_ARG_CHECK(std::isfinite(max_norm) && max_norm > 0,
                  "amp::clip_grad_norm: max_norm ", max_norm,
                  " must be finite and positive");
  ClipResult r;
  TensorNorms norms;
  r.total_norm = norm_of(grads, options, &norms);
  if (!std::isfinite(r.total_norm)) {
    r.non_finite = true;
    if (options.error_if_nonfinite) {
      NonFiniteReport local;
      for (size_t i = 0; i < grads.size(); ++i)
        if (!std::isfinite(norms.sum_squares[i])) local.tensors.push_back(static_cast<int>(i));
      TUTTI_THROW(kInvalidArgument, "amp::clip_grad_norm: the total gradient norm is ",
                  r.total_norm,
                  options.group ? " over group '" + options.group->name() + "'" : std::string(),
                  "; non-finite here: ",
                  local.tensors.empty() ? std::string("none (another rank's)")
                                        : local.describe(options.names),
                  " (error_if_nonfinite)");
    }
    return r;  // gradients untouched: the AMP step is skipped anyway
  }
  const double coef = max_norm / (r.total_norm + options.eps);
  if (coef < 1.0) {
    r.clip_coef = coef;
    r.clipped = true;
    scale_copy(grads, grads, static_cast<float>(coef), options.stream);
  }
  return r;
}

}  // namespace amp
}  // namespace tutti
