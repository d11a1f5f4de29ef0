// Fused optimizer step (tutti._C.optim) over DLPack tensors; tutti.optim
// (python/tutti/optim.py) is the documented wrapper.  The step runs without
// the GIL.
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "core/check.h"
#include "tutti/optim.h"

namespace tutti {
namespace py {
optim::Kind parse_optim_kind(const std::string& s) {
  if (s == "sgd") return optim::Kind::kSgd;
  if (s == "adam") return optim::Kind::kAdam;
  if (s == "adamw") return optim::Kind::kAdamW;
  TUTTI_THROW(kInvalidArgument, "optimizer kind '", s,
              "' is not one of 'sgd', 'adam', 'adamw'");
}

optim::Hyper make_hyper(const std::string& kind, float lr, float momentum, float dampening,
                        bool nesterov, float beta1, float beta2, float eps,
                        float weight_decay, bool maximize) {
  optim::Hyper h;
  h.kind = parse_optim_kind(kind);
  h.lr = lr;
  h.momentum = momentum;
  h.dampening = dampening;
  h.nesterov = nesterov;
  h.beta1 = beta1;
  h.beta2 = beta2;
  h.eps = eps;
  h.weight_decay = weight_decay;
  h.maximize = maximize;
  return h;
}

void bind_optim(pyb::module_& parent) {
  pyb::module_ m = parent.def_submodule(
      "optim", "Fused multi-tensor SGD/Adam/AdamW step (use tutti.optim)");
  m.def("num_states",
        [](const std::string& kind) { return optim::num_states(parse_optim_kind(kind)); },
        pyb::arg("kind"), "State tensors per parameter: sgd 1, adam/adamw 2.");
  m.def(
      "step",
      [](pyb::handle params, pyb::handle grads, pyb::handle states, const std::string& kind,
         float lr, float momentum, float dampening, bool nesterov, float beta1, float beta2,
         float eps, float weight_decay, bool maximize, int64_t step, float grad_scale,
         pyb::handle model_copies, int64_t stream,
         std::optional<std::vector<std::string>> names) {
        optim::Hyper h = make_hyper(kind, lr, momentum, dampening, nesterov, beta1, beta2,
                                    eps, weight_decay, maximize);
        h.step = step;
        auto p = import_tensors(params, "params");
        auto g = import_tensors(grads, "grads");
        // states: one sequence of tensors per parameter.
        std::vector<std::vector<PyTensor>> s;
        if (!states.is_none()) {
          size_t i = 0;
          for (const auto& per_param : pyb::reinterpret_borrow<pyb::sequence>(states)) {
            const std::string what = "states[" + std::to_string(i++) + "]";
            s.push_back(import_tensors(per_param, what.c_str()));
          }
        }
        std::vector<PyTensor> c;
        if (!model_copies.is_none()) c = import_tensors(model_copies, "model_copies");
        std::vector<std::vector<Tensor>> state_views;
        for (const auto& per_param : s) state_views.push_back(views(per_param));
        const std::vector<std::string> n = names ? *names : std::vector<std::string>{};
        pyb::gil_scoped_release nogil;
        optim::step(views(p), views(g), state_views, h, grad_scale, views(c),
                    as_stream(stream), n);
      },
      pyb::arg("params"), pyb::arg("grads"), pyb::arg("states"), pyb::kw_only(),
      pyb::arg("kind") = "adam", pyb::arg("lr") = 1e-3f, pyb::arg("momentum") = 0.f,
      pyb::arg("dampening") = 0.f, pyb::arg("nesterov") = false, pyb::arg("beta1") = 0.9f,
      pyb::arg("beta2") = 0.999f, pyb::arg("eps") = 1e-8f, pyb::arg("weight_decay") = 0.f,
      pyb::arg("maximize") = false, pyb::arg("step") = 1, pyb::arg("grad_scale") = 1.f,
      pyb::arg("model_copies") = pyb::none(), pyb::arg("stream") = 0,
      pyb::arg("names") = pyb::none(),
      "One fused step of torch.optim.{SGD,Adam,AdamW} semantics over float32 "
      "params (in place), with their float32 states (in place).");
}

}  // namespace py
}  // namespace tutti
