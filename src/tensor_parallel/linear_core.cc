#include "tensor_parallel/linear_core.h"

#include <cmath>

#include "core/check.h"
#include "tensor_parallel/layer_util.h"

namespace tutti {
namespace {

// Validates the configuration before any member is built from it.
const ProcessMeshPtr& checked(const ProcessMeshPtr& mesh,
                              const std::string& label, int64_t in, int64_t out,
                              int weight_dim, DType dtype) {
  TUTTI_ARG_CHECK(mesh != nullptr, label, ": the mesh is null");
  TUTTI_ARG_CHECK(in > 0 && out > 0, label, ": in_features ", in,
                  " and out_features ", out, " must be positive");
  TUTTI_ARG_CHECK(dtype == DType::kFloat32 || dtype == DType::kFloat16 ||
                      dtype == DType::kBFloat16,
                  label, ": dtype ", dtype_name(dtype),
                  " is not float32, float16 or bfloat16");
  if (weight_dim == 0)
    tp::check_divisible(label, "out_features", out, mesh->tp_size());
  else
    tp::check_divisible(label, "in_features", in, mesh->tp_size());
  return mesh;
}

}  // namespace

LinearCore::LinearCore(ProcessMeshPtr mesh_in, const char* kind,
                       const std::string& name, int64_t in_features,
                       int64_t out_features, int weight_dim, bool has_bias,
                       DType dtype_in, Device device_in, void* stream_in)
    : mesh(checked(mesh_in, tp::layer_label(kind, name), in_features,
                   out_features, weight_dim, dtype_in)),
      m(*mesh->impl()),
      label(tp::layer_label(kind, name)),
      in(in_features),
      out(out_features),
      dtype(dtype_in),
      device(device_in),
      stream(stream_in),
      weight(name + ".weight", {out_features, in_features}, weight_dim,
             m.tp_rank, m.tp_size, dtype_in, device_in) {
  if (has_bias)
    bias = std::make_unique<tp::Parameter>(
        name + ".bias", std::vector<int64_t>{out_features},
        weight_dim == 0 ? 0 : -1, m.tp_rank, m.tp_size, dtype_in, device_in);
}

TensorParallelLinear::TensorParallelLinear(std::unique_ptr<LinearCore> core)
    : core_(std::move(core)) {}
TensorParallelLinear::~TensorParallelLinear() = default;

Tensor TensorParallelLinear::weight() const { return core_->weight.value(); }
Tensor TensorParallelLinear::bias() const {
  return core_->bias ? core_->bias->value() : Tensor();
}
Tensor TensorParallelLinear::weight_grad() const {
  return core_->weight.grad();
}
Tensor TensorParallelLinear::bias_grad() const {
  return core_->bias ? core_->bias->grad() : Tensor();
}

void TensorParallelLinear::zero_grad() {
  core_->weight.zero_grad(core_->stream);
  if (core_->bias) core_->bias->zero_grad(core_->stream);
}

void TensorParallelLinear::init_from_seed(uint64_t seed) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(core_->in));
  core_->weight.init_uniform(seed, 0, bound);
  if (core_->bias) core_->bias->init_uniform(seed, 1, bound);
}

void TensorParallelLinear::load_from_full(const Tensor& full_weight,
                                          const Tensor& full_bias) {
  core_->weight.load_full(full_weight, core_->label);
  if (tp::is_absent(full_bias)) return;
  TUTTI_ARG_CHECK(core_->bias != nullptr, core_->label,
                  " load_from_full: a bias was given but the layer has none");
  core_->bias->load_full(full_bias, core_->label);
}

std::vector<TPParameter> TensorParallelLinear::parameters() const {
  std::vector<TPParameter> ps{core_->weight.describe()};
  if (core_->bias) ps.push_back(core_->bias->describe());
  return ps;
}

StateDict TensorParallelLinear::state_dict() {
  StateDict d{core_->weight.named()};
  if (core_->bias) d.push_back(core_->bias->named());
  return d;
}

int64_t TensorParallelLinear::in_features() const { return core_->in; }
int64_t TensorParallelLinear::out_features() const { return core_->out; }

}  // namespace tutti
