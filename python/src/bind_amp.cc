// Mixed precision (tutti._C.amp): the dynamic loss scaler, the fused
// multi-tensor operations and global-norm clipping over DLPack tensors.
// Every call that may issue a collective or wait for a device releases the
// GIL.
#include <pybind11/stl.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "bindings.h"
#include "convert.h"
#include "core/check.h"
#include "tutti/amp.h"
#include "tutti/process_group.h"

namespace tutti {
namespace py {
namespace {

using amp::ClipOptions;
using amp::DynamicLossScaler;
using amp::NonFiniteReport;
using amp::StepCheckOptions;

// Communicator arguments keep their owners alive for the call.
struct Groups {
  std::vector<CommunicatorPtr> owners;
  std::vector<Communicator*> ptrs;
};

Groups parse_groups(const pyb::handle& groups) {
  Groups g;
  if (groups.is_none()) return g;
  if (pyb::isinstance<ProcessGroup>(groups)) {
    g.owners.push_back(groups.cast<std::shared_ptr<ProcessGroup>>());
  } else {
    for (const auto& item : pyb::reinterpret_borrow<pyb::sequence>(groups)) {
      TUTTI_ARG_CHECK(pyb::isinstance<ProcessGroup>(item),
                      "groups must hold tutti.ProcessGroup objects");
      g.owners.push_back(item.cast<std::shared_ptr<ProcessGroup>>());
    }
  }
  for (auto& o : g.owners) g.ptrs.push_back(o.get());
  return g;
}

std::vector<std::string> names_or_empty(const std::optional<std::vector<std::string>>& n) {
  return n ? *n : std::vector<std::string>{};
}

// Runs a multi-tensor check on imported tensors without the GIL.
template <typename F>
NonFiniteReport run_nogil(F&& f) {
  pyb::gil_scoped_release nogil;
  return f();
}

ClipOptions clip_options(double norm_type, const Groups& g,
                         std::optional<std::vector<bool>> replicated,
                         std::optional<std::vector<std::string>> names,
                         bool error_if_nonfinite, double eps, int64_t stream) {
  TUTTI_ARG_CHECK(g.ptrs.size() <= 1, "clip: `group` is one model-parallel group");
  ClipOptions o;
  o.norm_type = norm_type;
  o.group = g.ptrs.empty() ? nullptr : g.ptrs[0];
  if (replicated) o.replicated = *replicated;
  o.names = names_or_empty(names);
  o.error_if_nonfinite = error_if_nonfinite;
  o.eps = eps;
  o.stream = as_stream(stream);
  return o;
}

StepCheckOptions check_options(std::optional<std::vector<std::string>> names,
                               const Groups& g, bool already_agreed, int64_t stream) {
  StepCheckOptions o;
  o.names = names_or_empty(names);
  o.groups = g.ptrs;
  o.already_agreed = already_agreed;
  o.stream = as_stream(stream);
  return o;
}

amp::MinScalePolicy parse_policy(const std::string& s) {
  if (s == "error") return amp::MinScalePolicy::kError;
  if (s == "warn") return amp::MinScalePolicy::kWarn;
  TUTTI_THROW(kInvalidArgument, "at_min_scale '", s, "' is not 'error' or 'warn'");
}

// The keyword arguments the step checks share.
#define TUTTI_CHECK_ARGS                                                   \
  pyb::kw_only(), pyb::arg("names") = pyb::none(),                        \
      pyb::arg("groups") = pyb::none(), pyb::arg("already_agreed") = false, \
      pyb::arg("stream") = 0

#define TUTTI_CLIP_ARGS                                                     \
  pyb::kw_only(), pyb::arg("norm_type") = 2.0, pyb::arg("group") = pyb::none(), \
      pyb::arg("replicated") = pyb::none(), pyb::arg("names") = pyb::none(),   \
      pyb::arg("error_if_nonfinite") = false, pyb::arg("eps") = 1e-6,          \
      pyb::arg("stream") = 0

}  // namespace

void bind_amp(pyb::module_& parent) {
  pyb::module_ m = parent.def_submodule(
      "amp", "Mixed precision: dynamic loss scaling, fused unscale + "
             "non-finite check, clipping and casts on DLPack tensors.");

  pyb::class_<NonFiniteReport>(m, "NonFiniteReport",
                               "Which tensors of a list held NaN/Inf.")
      .def(pyb::init([](bool found, std::vector<int> tensors) {
             NonFiniteReport r;
             r.found = found;
             r.tensors = std::move(tensors);
             return r;
           }),
           pyb::arg("found") = false, pyb::arg("tensors") = std::vector<int>{})
      .def_readonly("found", &NonFiniteReport::found)
      .def_readonly("tensors", &NonFiniteReport::tensors, "Indices, ascending.")
      .def("describe", &NonFiniteReport::describe, pyb::arg("names"),
           pyb::arg("limit") = 8, "\"'fc1.weight', 'fc2.bias'\" for messages.")
      .def("__bool__", [](const NonFiniteReport& r) { return r.found; })
      .def("__repr__", [](const NonFiniteReport& r) {
        return "<NonFiniteReport found=" + std::string(r.found ? "True" : "False") +
               " tensors=" + std::string(pyb::str(pyb::cast(r.tensors))) + ">";
      });

  m.def("scale_copy",
        [](pyb::handle src, pyb::handle dst, float scale, int64_t stream) {
          auto s = import_tensors(src, "src"), d = import_tensors(dst, "dst");
          return run_nogil([&] {
            return amp::scale_copy(views(s), views(d), scale, as_stream(stream));
          });
        },
        pyb::arg("src"), pyb::arg("dst"), pyb::arg("scale"), pyb::arg("stream") = 0,
        "dst[i] = src[i] * scale (float32 math, one rounding) and a report of "
        "the destinations holding NaN/Inf.  One fused pass.");
  m.def("unscale_and_check",
        [](pyb::handle tensors, float inv_scale, int64_t stream) {
          auto t = import_tensors(tensors, "tensors");
          return run_nogil([&] {
            return amp::unscale_and_check(views(t), inv_scale, as_stream(stream));
          });
        },
        pyb::arg("tensors"), pyb::arg("inv_scale"), pyb::arg("stream") = 0,
        "t *= inv_scale in place for every tensor, fused with the NaN/Inf check.");
  m.def("check_finite",
        [](pyb::handle tensors, int64_t stream) {
          auto t = import_tensors(tensors, "tensors");
          return run_nogil([&] { return amp::check_finite(views(t), as_stream(stream)); });
        },
        pyb::arg("tensors"), pyb::arg("stream") = 0, "The NaN/Inf check alone.");
  m.def("copy_master_to_model",
        [](pyb::handle master, pyb::handle model, int64_t stream) {
          auto a = import_tensors(master, "master"), b = import_tensors(model, "model");
          return run_nogil([&] {
            return amp::copy_master_to_model(views(a), views(b), as_stream(stream));
          });
        },
        pyb::arg("master"), pyb::arg("model"), pyb::arg("stream") = 0,
        "model[i] = round(master[i]) (float32 -> float16/bfloat16 copies).");
  m.def("model_grads_to_master",
        [](pyb::handle model_grads, pyb::handle master_grads, float inv_scale,
           int64_t stream) {
          auto a = import_tensors(model_grads, "model_grads");
          auto b = import_tensors(master_grads, "master_grads");
          return run_nogil([&] {
            return amp::model_grads_to_master(views(a), views(b), inv_scale,
                                              as_stream(stream));
          });
        },
        pyb::arg("model_grads"), pyb::arg("master_grads"), pyb::arg("inv_scale"),
        pyb::arg("stream") = 0,
        "master[i] = float32(model[i]) * inv_scale, widened, unscaled and "
        "checked in one pass.");
  m.def("multi_tensor_norms",
        [](pyb::handle tensors, int64_t stream) {
          auto t = import_tensors(tensors, "tensors");
          amp::TensorNorms n;
          {
            pyb::gil_scoped_release nogil;
            n = amp::multi_tensor_norms(views(t), as_stream(stream));
          }
          return pyb::make_tuple(n.sum_squares, n.max_abs);
        },
        pyb::arg("tensors"), pyb::arg("stream") = 0,
        "(sum_squares, max_abs): per-tensor lists, one pass.");
  m.def("grad_norm",
        [](pyb::handle grads, double norm_type, pyb::handle group,
           std::optional<std::vector<bool>> replicated,
           std::optional<std::vector<std::string>> names, bool error_if_nonfinite,
           double eps, int64_t stream) {
          auto t = import_tensors(grads, "grads");
          Groups g = parse_groups(group);
          ClipOptions o = clip_options(norm_type, g, replicated, names,
                                       error_if_nonfinite, eps, stream);
          pyb::gil_scoped_release nogil;
          return amp::grad_norm(views(t), o);
        },
        pyb::arg("grads"), TUTTI_CLIP_ARGS,
        "The global gradient norm (2 or inf); partial norms combined over the "
        "model-parallel `group` (collective there), `replicated` tensors counted once.");

  pyb::class_<amp::ClipResult>(m, "ClipResult",
                               "What clip_grad_norm did: total_norm, clip_coef, clipped, non_finite.")
      .def_readonly("total_norm", &amp::ClipResult::total_norm)
      .def_readonly("clip_coef", &amp::ClipResult::clip_coef)
      .def_readonly("clipped", &amp::ClipResult::clipped)
      .def_readonly("non_finite", &amp::ClipResult::non_finite)
      .def("__repr__", [](const amp::ClipResult& r) {
        return "<ClipResult total_norm=" + std::to_string(r.total_norm) +
               " clip_coef=" + std::to_string(r.clip_coef) + ">";
      });
  m.def("clip_grad_norm",
        [](pyb::handle grads, double max_norm, double norm_type, pyb::handle group,
           std::optional<std::vector<bool>> replicated,
           std::optional<std::vector<std::string>> names, bool error_if_nonfinite,
           double eps, int64_t stream) {
          auto t = import_tensors(grads, "grads");
          Groups g = parse_groups(group);
          ClipOptions o = clip_options(norm_type, g, replicated, names,
                                       error_if_nonfinite, eps, stream);
          pyb::gil_scoped_release nogil;
          return amp::clip_grad_norm(views(t), max_norm, o);
        },
        pyb::arg("grads"), pyb::arg("max_norm"), TUTTI_CLIP_ARGS,
        "Scales the gradients in place by max_norm / (norm + eps) when that is "
        "below 1 (torch.nn.utils.clip_grad_norm_); returns a ClipResult.");

  pyb::class_<amp::ScaleUpdate>(m, "ScaleUpdate", "What update() decided.")
      .def_readonly("skipped", &amp::ScaleUpdate::skipped)
      .def_readonly("backed_off", &amp::ScaleUpdate::backed_off)
      .def_readonly("grew", &amp::ScaleUpdate::grew)
      .def_readonly("old_scale", &amp::ScaleUpdate::old_scale)
      .def_readonly("new_scale", &amp::ScaleUpdate::new_scale)
      .def("__repr__", [](const amp::ScaleUpdate& u) {
        return std::string("<ScaleUpdate skipped=") + (u.skipped ? "True" : "False") +
               " " + std::to_string(u.old_scale) + " -> " +
               std::to_string(u.new_scale) + ">";
      });

  pyb::class_<DynamicLossScaler, Stateful, std::shared_ptr<DynamicLossScaler>> scaler(
      m, "DynamicLossScaler",
      "torch.cuda.amp.GradScaler's rules (plus hysteresis and bounds) with the "
      "skip decision agreed across ranks.  A step: loss * scale -> backward "
      "-> unscale_and_check(grads) -> step unless it returned True -> update().");
  scaler.def(pyb::init([](pyb::handle precision, float init_scale, float growth_factor,
                        float backoff_factor, int64_t growth_interval,
                        int64_t hysteresis, bool consecutive_hysteresis,
                        float min_scale, float max_scale, const std::string& at_min_scale,
                        int64_t max_consecutive_skips, const std::string& state_prefix) {
             amp::LossScalerOptions o;
             o.precision = parse_dtype(precision);
             o.init_scale = init_scale;
             o.growth_factor = growth_factor;
             o.backoff_factor = backoff_factor;
             o.growth_interval = growth_interval;
             o.hysteresis = hysteresis;
             o.consecutive_hysteresis = consecutive_hysteresis;
             o.min_scale = min_scale;
             o.max_scale = max_scale;
             o.at_min_scale = parse_policy(at_min_scale);
             o.max_consecutive_skips = max_consecutive_skips;
             o.state_prefix = state_prefix;
             return std::make_shared<DynamicLossScaler>(o);
           }),
           pyb::kw_only(), pyb::arg("precision") = "float16",
           pyb::arg("init_scale") = 65536.0f, pyb::arg("growth_factor") = 2.0f,
           pyb::arg("backoff_factor") = 0.5f, pyb::arg("growth_interval") = 2000,
           pyb::arg("hysteresis") = 1, pyb::arg("consecutive_hysteresis") = false,
           pyb::arg("min_scale") = 1.0f,
           pyb::arg("max_scale") = std::numeric_limits<float>::infinity(),
           pyb::arg("at_min_scale") = "error", pyb::arg("max_consecutive_skips") = 0,
           pyb::arg("state_prefix") = "amp/loss_scaler",
           "precision float16: dynamic scaling; bfloat16/float32: the scale "
           "stays 1 and only NaN/Inf steps are skipped.  at_min_scale: 'error' "
           "or 'warn'.")
      .def_property_readonly("scale", &DynamicLossScaler::scale,
                             "Multiply the loss by this before backward.")
      .def_property_readonly("inv_scale", &DynamicLossScaler::inv_scale)
      .def_property_readonly("dynamic", &DynamicLossScaler::dynamic)
      .def("agree",
           [](DynamicLossScaler& s, const NonFiniteReport& local,
              std::optional<std::vector<std::string>> names, pyb::handle groups,
              bool already_agreed, int64_t stream) {
             Groups g = parse_groups(groups);
             auto o = check_options(names, g, already_agreed, stream);
             pyb::gil_scoped_release nogil;
             return s.agree(local, o);
           },
           pyb::arg("local"), TUTTI_CHECK_ARGS,
           "Agrees on a check done elsewhere (a NonFiniteReport) and records it.")
      .def_property_readonly("found_non_finite", &DynamicLossScaler::found_non_finite)
      .def("update", [](DynamicLossScaler& s) {
        pyb::gil_scoped_release nogil;
        return s.update();
      }, "Ends the step: applies the scale rules to the agreed result.")
      .def_property_readonly("steps", &DynamicLossScaler::steps)
      .def_property_readonly("skipped_steps", &DynamicLossScaler::skipped_steps)
      .def_property_readonly("consecutive_skips", &DynamicLossScaler::consecutive_skips)
      .def_property_readonly("growth_tracker", &DynamicLossScaler::growth_tracker)
      .def_property_readonly("hysteresis_tracker", &DynamicLossScaler::hysteresis_tracker)
      .def_property_readonly("last_overflow_step", &DynamicLossScaler::last_overflow_step)
      .def_property_readonly("options", [](const DynamicLossScaler& s) {
        const auto& o = s.options();
        pyb::dict d;
        d["precision"] = std::string(dtype_name(o.precision));
        d["init_scale"] = o.init_scale;
        d["growth_factor"] = o.growth_factor;
        d["backoff_factor"] = o.backoff_factor;
        d["growth_interval"] = o.growth_interval;
        d["hysteresis"] = o.hysteresis;
        d["consecutive_hysteresis"] = o.consecutive_hysteresis;
        d["min_scale"] = o.min_scale;
        d["max_scale"] = o.max_scale;
        d["at_min_scale"] = o.at_min_scale == amp::MinScalePolicy::kError ? "error" : "warn";
        d["max_consecutive_skips"] = o.max_consecutive_skips;
        d["state_prefix"] = o.state_prefix;
        return d;
      })
      .def("__repr__", [](const DynamicLossScaler& s) {
        return "<tutti.amp.DynamicLossScaler scale=" + std::to_string(s.scale()) +
               " steps=" + std::to_string(s.steps()) + ">";
      });
  // unscale_and_check and check take the same arguments.
  using CheckFn = bool (DynamicLossScaler::*)(const std::vector<Tensor>&,
                                              const StepCheckOptions&);
  const std::tuple<const char*, CheckFn, const char*> checks[] = {
      {"unscale_and_check", &DynamicLossScaler::unscale_and_check,
       "Unscales in place, checks for NaN/Inf and agrees over `groups`; "
       "True: skip this step (the same on every rank)."},
      {"check", &DynamicLossScaler::check,
       "The same for gradients that are already unscaled (only reads them)."}};
  for (const auto& [name, fn, doc] : checks) {
    scaler.def(name,
               [fn = fn](DynamicLossScaler& s, pyb::handle grads,
                         std::optional<std::vector<std::string>> names,
                         pyb::handle groups, bool already_agreed, int64_t stream) {
                 auto t = import_tensors(grads, "grads");
                 Groups g = parse_groups(groups);
                 auto o = check_options(names, g, already_agreed, stream);
                 pyb::gil_scoped_release nogil;
                 return (s.*fn)(views(t), o);
               },
               pyb::arg("grads"), TUTTI_CHECK_ARGS, doc);
  }
}

}  // namespace py
}  // namespace tutti
