// gpu_cnn: the --check verification.
//
// gradient_check(): the backward pass under test (GPU: cuDNN + cuBLAS + our
// kernels; CPU: the float host model) against central differences of the
// float64 host model, on tiny shapes, for every element of every parameter.
// The float64 host backward is held to the same differences with a much
// tighter bound, so a wrong reference cannot pass either.
//
// compare_models(): two backends on the full-size shapes, same parameters
// and batch: loss and every gradient must agree (this is where cuDNN picks
// the algorithms training will use).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "host_cnn.h"

namespace gpu_cnn {

namespace {

// max_i |a_i - b_i| / max_i |b_i| over one parameter's slot.
struct SlotError {
  double scale = 0;  // max |reference|
  double error = 0;  // max |difference| / scale
};

template <typename A, typename B>
SlotError slot_error(const std::vector<A>& a, const std::vector<B>& ref, const ParamSlot& s) {
  SlotError e;
  double diff = 0;
  for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
    e.scale = std::max(e.scale, std::fabs(static_cast<double>(ref[i])));
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - static_cast<double>(ref[i])));
  }
  e.error = e.scale > 0 ? diff / e.scale : diff;
  // NaN anywhere must fail the comparison below.
  if (std::isnan(diff) || std::isnan(e.scale)) e.error = std::nan("");
  return e;
}

bool within(double error, double tol) { return error <= tol; }  // false for NaN

}  // namespace

bool gradient_check(Model& model, bool log) {
  const Dims& d = model.dims();
  const ParamLayout& layout = model.layout();
  const std::vector<float> init = init_params(layout, 4242);
  const Batch batch = make_batch(d, 777);

  model.set_params(init);
  model.forward_backward(batch, [](int) {});
  const double model_loss = model.loss();
  const std::vector<float> got = model.grads_host();

  HostCnn<double> ref(d);
  std::copy(init.begin(), init.end(), ref.params().begin());
  const double ref_loss = ref.forward(batch.x.data(), batch.labels.data());
  ref.backward([](int) {});
  const std::vector<double> analytic = ref.grads();

  // Central differences in float64.  The step is small against the
  // pre-activations (no ReLU kink is crossed for this seed; a crossing
  // shows up as a float64 mismatch) and large against rounding.
  const double eps = 1e-6;
  std::vector<double> numeric(static_cast<size_t>(layout.total), 0.0);
  std::vector<double>& w = ref.params();
  for (const ParamSlot& s : layout.slots)
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
      const double saved = w[i];
      w[i] = saved + eps;
      const double up = ref.forward(batch.x.data(), batch.labels.data());
      w[i] = saved - eps;
      const double down = ref.forward(batch.x.data(), batch.labels.data());
      w[i] = saved;
      numeric[i] = (up - down) / (2 * eps);
    }

  const double tol = model.check_tolerance(), ref_tol = 1e-6;
  const double loss_error = std::fabs(model_loss - ref_loss) / std::max(1.0, std::fabs(ref_loss));
  bool ok = within(loss_error, tol * 0.1);
  if (log) {
    std::printf("gradient check on %s\n  model under test: %s\n", d.str().c_str(),
                model.describe().c_str());
    std::printf("  loss %.9f (float64 host %.9f, rel. diff %.2e)\n", model_loss, ref_loss,
                loss_error);
    std::printf("  %-14s %6s %11s %13s %13s\n", "parameter", "numel", "max|grad|",
                "float64 bwd", "under test");
  }
  for (const ParamSlot& s : layout.slots) {
    const SlotError r = slot_error(analytic, numeric, s);
    const SlotError m = slot_error(got, numeric, s);
    // A parameter without gradient (dead units) would make the check empty.
    const bool live = r.scale > 1e-7;
    const bool slot_ok = live && within(r.error, ref_tol) && within(m.error, tol);
    ok = ok && slot_ok;
    if (log)
      std::printf("  %-14s %6lld %11.3e %13.2e %13.2e %s\n", s.name.c_str(),
                  static_cast<long long>(s.numel), r.scale, r.error, m.error,
                  slot_ok ? "ok" : (live ? "FAIL" : "FAIL (no gradient)"));
  }
  if (log)
    std::printf("  relative errors vs central differences; bounds %.0e (float64), %.0e (under "
                "test): %s\n",
                ref_tol, tol, ok ? "PASS" : "FAIL");
  return ok;
}

bool compare_models(Model& a, Model& b, bool log) {
  const std::vector<float> init = init_params(a.layout(), 99);
  const Batch batch = make_batch(a.dims(), 31);
  double loss[2];
  std::vector<float> grads[2];
  Model* models[2] = {&a, &b};
  for (int k = 0; k < 2; ++k) {
    models[k]->set_params(init);
    models[k]->forward_backward(batch, [](int) {});
    loss[k] = models[k]->loss();
    grads[k] = models[k]->grads_host();
  }
  const double tol = std::max(a.check_tolerance(), b.check_tolerance());
  const double loss_error = std::fabs(loss[0] - loss[1]) / std::max(1.0, std::fabs(loss[1]));
  bool ok = within(loss_error, tol * 0.1);
  if (log) {
    std::printf("full-size comparison on %s\n  %s\n  vs %s\n", a.dims().str().c_str(),
                a.describe().c_str(), b.describe().c_str());
    std::printf("  loss %.7f vs %.7f (rel. diff %.2e)\n", loss[0], loss[1], loss_error);
  }
  for (const ParamSlot& s : a.layout().slots) {
    const SlotError e = slot_error(grads[0], grads[1], s);
    const bool slot_ok = e.scale > 0 && within(e.error, tol);
    ok = ok && slot_ok;
    if (log)
      std::printf("  %-14s max|grad| %.3e  rel. diff %.2e %s\n", s.name.c_str(), e.scale,
                  e.error, slot_ok ? "ok" : "FAIL");
  }
  if (log) std::printf("  bound %.0e: %s\n", tol, ok ? "PASS" : "FAIL");
  return ok;
}

}  // namespace gpu_cnn
