// The public optimizer step: argument checks (everything is checked before
// anything is written), the step's scalars, then the host loop
// (cpu_optim.h) or the CUDA launches (cuda_optim.h).
#include "tutti/optim.h"

#include <cmath>

#include "core/check.h"
#include "optim/cpu_optim.h"
#include "optim/cuda_optim.h"

namespace tutti {
namespace optim {
namespace {

bool float_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
}

// "optim::step (adam): " prefixes every message.
std::string op_of(const Hyper& h) {
  return std::string("optim::step (") + kind_name(h.kind) + "): ";
}

// "parameter #3 'fc.weight'" (the name when given).
std::string who(size_t i, const std::vector<std::string>& names) {
  std::string s = "parameter #" + std::to_string(i);
  if (i < names.size() && !names[i].empty()) s += " '" + names[i] + "'";
  return s;
}

void check_hyper(const std::string& op, const Hyper& h, float grad_scale) {
  // torch.optim's constructor checks; !(x >= 0) also rejects NaN.
  TUTTI_ARG_CHECK(std::isfinite(h.lr) && h.lr >= 0, op, "learning rate ", h.lr,
                  " must be finite and >= 0");
  TUTTI_ARG_CHECK(std::isfinite(h.weight_decay) && h.weight_decay >= 0, op,
                  "weight_decay ", h.weight_decay, " must be finite and >= 0");
  TUTTI_ARG_CHECK(std::isfinite(grad_scale), op, "grad_scale ", grad_scale,
                  " must be finite");
  TUTTI_ARG_CHECK(h.step >= 1, op, "step ", h.step, " must be >= 1 (1-based)");
  if (h.kind == Kind::kSgd) {
    TUTTI_ARG_CHECK(std::isfinite(h.momentum) && h.momentum >= 0, op, "momentum ",
                    h.momentum, " must be finite and >= 0");
    TUTTI_ARG_CHECK(std::isfinite(h.dampening), op, "dampening ", h.dampening,
                    " must be finite");
    TUTTI_ARG_CHECK(!h.nesterov || (h.momentum > 0 && h.dampening == 0), op,
                    "Nesterov momentum needs momentum > 0 and dampening == 0 (momentum ",
                    h.momentum, ", dampening ", h.dampening, ")");
  } else {
    TUTTI_ARG_CHECK(h.beta1 >= 0 && h.beta1 < 1, op, "beta1 ", h.beta1, " must be in [0, 1)");
    TUTTI_ARG_CHECK(h.beta2 >= 0 && h.beta2 < 1, op, "beta2 ", h.beta2, " must be in [0, 1)");
    TUTTI_ARG_CHECK(std::isfinite(h.eps) && h.eps >= 0, op, "eps ", h.eps,
                    " must be finite and >= 0");
  }
}

bool overlap(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const char* x = static_cast<const char*>(a.data());
  const char* y = static_cast<const char*>(b.data());
  return x < y + b.nbytes() && y < x + a.nbytes();
}

}  // namespace

// Coefficients of one step from the hyper-parameters, computed as torch's
// Python code computes them (double), then rounded to float32 where torch
// hands the scalar to a float32 kernel.
Coeffs make_coeffs(const Hyper& h, float grad_scale) {
  Coeffs c{};
  const double lr = h.lr, wd = h.weight_decay;
  c.grad_scale = grad_scale;
  c.kind = static_cast<uint8_t>(h.kind);
  c.maximize = h.maximize;
  c.has_weight_decay = h.weight_decay != 0;
  c.weight_decay = h.weight_decay;
  c.decay = static_cast<float>(1.0 - lr * wd);
  c.neg_lr = static_cast<float>(-lr);
  c.momentum = h.momentum;
  c.one_minus_dampening = static_cast<float>(1.0 - static_cast<double>(h.dampening));
  c.has_momentum = h.momentum != 0;
  c.first = h.step == 1;
  c.nesterov = h.nesterov;
  // exp_avg.lerp_(grad, 1 - beta1): ATen's lerp takes weight w (float) and
  // computes m + w*(g - m) for |w| < 0.5, else g + (w - 1)*(g - m), as one
  // fused multiply-add in its vector kernel.
  const float w = static_cast<float>(1.0 - static_cast<double>(h.beta1));
  c.lerp_small = std::fabs(w) < 0.5f;
  c.lerp_coeff = c.lerp_small ? w : w - 1.0f;
  c.beta2 = h.beta2;
  c.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(h.beta2));
  const double t = static_cast<double>(h.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), t);
  c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  c.eps = h.eps;
  c.neg_step_size = static_cast<float>(-(lr / bc1));
  return c;
}

int num_states(Kind kind) { return kind == Kind::kSgd ? 1 : 2; }

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kSgd: return "sgd";
    case Kind::kAdam: return "adam";
    case Kind::kAdamW: return "adamw";
  }
  return "unknown";
}

void step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
          const std::vector<std::vector<Tensor>>& states, const Hyper& hyper,
          float grad_scale, const std::vector<Tensor>& model_copies,
          void* stream, const std::vector<std::string>& names) {
  TUTTI_ARG_CHECK(hyper.kind == Kind::kSgd || hyper.kind == Kind::kAdam ||
                      hyper.kind == Kind::kAdamW,
                  "optim::step: unknown optimizer kind ", int(hyper.kind));
  const std::string op = op_of(hyper);
  check_hyper(op, hyper, grad_scale);
  const size_t n = params.size();
  TUTTI_ARG_CHECK(grads.size() == n, op, n, " parameters but ", grads.size(), " gradients");
  TUTTI_ARG_CHECK(model_copies.empty() || model_copies.size() == n, op, n,
                  " parameters but ", model_copies.size(), " model copies");
  // SGD without momentum keeps no state: its state list may be empty.
  const bool stateless = hyper.kind == Kind::kSgd && hyper.momentum == 0;
  const size_t want = static_cast<size_t>(num_states(hyper.kind));
  TUTTI_ARG_CHECK(states.size() == n || (stateless && states.empty()), op, n,
                  " parameters but ", states.size(), " state lists");
  if (n == 0) return;

  const Device device = params[0].device();
  std::vector<Entry> entries(n);
  for (size_t i = 0; i < n; ++i) {
    const Tensor& p = params[i];
    const Tensor& g = grads[i];
    TUTTI_ARG_CHECK(p.dtype() == DType::kFloat32, op, who(i, names), " is ", p.str(),
                    "; master parameters are float32");
    TUTTI_ARG_CHECK(float_dtype(g.dtype()), op, who(i, names), ": gradient ", g.str(),
                    " must be float32, float16 or bfloat16");
    // Every tensor of entry i against parameter #0's device and numel (a
    // fixed array: the checks allocate nothing unless one fails).
    struct Role {
      const char* name;
      const Tensor* t;
    };
    Role all[5] = {{"parameter", &p}, {"gradient", &g}};
    int count = 2;
    if (!states.empty()) {
      const std::vector<Tensor>& st = states[i];
      TUTTI_ARG_CHECK(st.size() == want || (stateless && st.empty()), op, who(i, names), " has ",
                      st.size(), " state tensors; ", kind_name(hyper.kind),
                      " keeps ", want, stateless ? " (or 0 without momentum)" : "");
      for (size_t k = 0; k < st.size(); ++k) {
        TUTTI_ARG_CHECK(st[k].dtype() == DType::kFloat32, op, who(i, names), ": state ", k, " is ",
                        st[k].str(), "; optimizer state is float32");
        all[count++] = {k == 0 ? "state 0" : "state 1", &st[k]};
      }
    }
    if (!model_copies.empty()) {
      TUTTI_ARG_CHECK(float_dtype(model_copies[i].dtype()), op, who(i, names), ": model copy ",
                      model_copies[i].str(), " must be float32, float16 or bfloat16");
      all[count++] = {"model copy", &model_copies[i]};
    }
    for (int a = 0; a < count; ++a) {
      const Tensor& t = *all[a].t;
      TUTTI_ARG_CHECK(t.device() == device, op, who(i, names), ": ", all[a].name, " is on ",
                      t.device().str(), " but parameter #0 is on ", device.str(),
                      "; one step runs on one device");
      TUTTI_ARG_CHECK(t.numel() == p.numel(), op, who(i, names), ": ", all[a].name, " ", t.str(),
                      " has ", t.numel(), " elements, the parameter ", p.str(),
                      " has ", p.numel());
      TUTTI_ARG_CHECK(t.data() != nullptr || t.numel() == 0, op, who(i, names), ": ", all[a].name,
                      " has no data");
      for (int b = 0; b < a; ++b)
        TUTTI_ARG_CHECK(!overlap(t, *all[b].t), op, who(i, names), ": ", all[a].name,
                        " overlaps the ", all[b].name);
    }
    Entry& e = entries[i];
    e.param = p.data_as<float>();
    e.grad = g.data();
    e.numel = p.numel();
    e.grad_dtype = g.dtype();
    if (!states.empty() && !states[i].empty() && !stateless) {
      e.state0 = states[i][0].data_as<float>();
      if (want == 2) e.state1 = states[i][1].data_as<float>();
    }
    if (!model_copies.empty()) {
      e.copy = model_copies[i].data();
      e.copy_dtype = model_copies[i].dtype();
    }
  }

  const Coeffs c = make_coeffs(hyper, grad_scale);
  if (device.is_cuda()) {
    cuda_step(entries, c, device.index, stream);
    return;
  }
  for (const Entry& e : entries) cpu_step(e, c);
}

}  // namespace optim
}  // namespace tutti
