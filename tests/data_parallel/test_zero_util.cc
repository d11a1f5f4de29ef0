#include "data_parallel/test_zero_util.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tutti {
namespace test {

optim::Hyper test_hyper(optim::Kind kind) {
  optim::Hyper h;
  h.kind = kind;
  if (kind == optim::Kind::kSgd) {
    h.lr = 0.1f;
    h.momentum = 0.9f;
    h.weight_decay = 0.01f;
  } else {
    h.lr = 0.01f;
    h.weight_decay = kind == optim::Kind::kAdamW ? 0.1f : 0.01f;
  }
  return h;
}

CheckpointOptions zero_ckpt_options(const std::string& dir) {
  CheckpointOptions o;
  o.dir = dir;
  o.timeout_s = 20;
  o.async = false;
  return o;
}

std::vector<ParamDecl> zero_decls(DType d) {
  return {{"w1", d, Shape{7, 3}}, {"b1", d, Shape{5}}, {"w2", d, Shape{4, 6}},
          {"b2", d, Shape{1}},    {"w3", d, Shape{13}}};
}

namespace {

ReducerOptions reducer_options(const ZeroConfig& c) {
  ReducerOptions o;
  o.bucket_cap_mb = 120.0 / (1 << 20);  // ~30 float32 elements: 3 buckets
  o.first_bucket_cap_mb = 0;
  o.learn_bucket_order = c.learn_order;
  o.gradient_as_bucket_view = c.bucket_view;
  o.backward_passes_per_step = c.passes;
  return o;
}

double init_value(int p, int64_t i, int variant) {
  return 0.5 * std::sin(0.37 * static_cast<double>(i) + p + 2.1 * variant);
}

double sample_grad(int sample, int p, int64_t i, int64_t t, int variant) {
  return 0.1 * std::cos(0.11 * static_cast<double>(i) * (p + 1) + 0.7 * sample + 1.3 * t +
                        0.9 * variant);
}

}  // namespace

ZeroModel::ZeroModel(ProcessGroupPtr g, const ZeroConfig& c)
    : group(std::move(g)), config(c), params(make_params(zero_decls(c.dtype))) {
  for (size_t p = 0; p < params.size(); ++p)
    params[p].param.fill([&](int64_t i) { return init_value(static_cast<int>(p), i, c.variant); });
  reducer.reset(new Reducer(group, reducer_options(c)));
  register_all(*reducer, params);
  reducer->build();
  if (c.stage > 0) {
    ShardedOptimizerOptions o;
    o.stage = c.stage;
    o.reduce_dtype = c.reduce_dtype;
    o.overlap_all_gather = c.overlap_all_gather;
    o.bucket_buffers = c.bucket_buffers;
    o.gather_buffers = c.gather_buffers;
    zero.reset(new ShardedOptimizer(*reducer, c.hyper, o));
    return;
  }
  const int ns = optim::num_states(c.hyper.kind);
  for (auto& p : params) {
    const std::vector<double> v = p.param.values();
    master.emplace_back(v.begin(), v.end());
    states.emplace_back(static_cast<size_t>(ns), std::vector<float>(v.size(), 0.f));
  }
}

ZeroModel::~ZeroModel() = default;

std::vector<double> ZeroModel::local_gradient(int p, int64_t t, float loss_scale) const {
  const int w = group->size(), r = group->rank();
  const int per_rank = kBatch / w;
  std::vector<double> v(static_cast<size_t>(params[static_cast<size_t>(p)].shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    double sum = 0;
    for (int s = r * per_rank; s < (r + 1) * per_rank; ++s)
      sum += sample_grad(s, p, static_cast<int64_t>(i), t, config.variant);
    v[i] = sum / per_rank * loss_scale;
  }
  if (t == config.overflow_step && r == config.overflow_rank && p == 1)
    v[0] = std::numeric_limits<double>::infinity();
  return v;
}

bool ZeroModel::backward(int64_t t, float loss_scale) {
  std::vector<int> order = config.ready_order;
  if (order.empty())
    for (int p = static_cast<int>(params.size()) - 1; p >= 0; --p) order.push_back(p);
  for (int p : order) {
    const Tensor g = reducer->gradient(p);
    const std::vector<double> v = local_gradient(p, t, loss_scale);
    convert(v.data(), DType::kFloat64, g.data(), g.dtype(), v.size());
    reducer->grad_ready(p);
  }
  return reducer->synchronize();
}

void ZeroModel::pass(int64_t t, const std::vector<int>& order, bool accumulate) {
  for (int p : order) {
    const Tensor g = reducer->gradient(p);
    std::vector<double> v = local_gradient(p, t);
    if (accumulate) {
      std::vector<double> old(v.size());
      convert(g.data(), g.dtype(), old.data(), DType::kFloat64, v.size());
      for (size_t i = 0; i < v.size(); ++i) v[i] += old[i];
    }
    convert(v.data(), DType::kFloat64, g.data(), g.dtype(), v.size());
    reducer->grad_ready(p);
  }
}

void ZeroModel::step(float grad_scale) {
  if (zero) {
    zero->step(grad_scale);
    return;
  }
  optim::Hyper h = config.hyper;
  h.step = ++ref_steps;
  std::vector<Tensor> ps, gs, copies;
  std::vector<std::vector<Tensor>> ss;
  for (size_t p = 0; p < params.size(); ++p) {
    ps.push_back(Tensor::of(master[p]));
    gs.push_back(reducer->gradient(static_cast<int>(p)));
    copies.push_back(params[p].param_tensor());
    std::vector<Tensor> st;
    for (auto& s : states[p]) st.push_back(Tensor::of(s));
    ss.push_back(std::move(st));
  }
  optim::step(ps, gs, ss, h, grad_scale, copies);
}

std::vector<Tensor> ZeroModel::check_tensors() {
  if (zero) return zero->gradient_shards();
  std::vector<Tensor> out;
  for (size_t p = 0; p < params.size(); ++p) out.push_back(reducer->gradient(static_cast<int>(p)));
  return out;
}

std::vector<unsigned char> ZeroModel::param_bytes() {
  std::vector<unsigned char> out;
  for (auto& p : params) out.insert(out.end(), p.param.bytes.begin(), p.param.bytes.end());
  return out;
}

std::vector<unsigned char> ZeroModel::param_bytes(int p) {
  return params[static_cast<size_t>(p)].param.bytes;
}

std::vector<double> ZeroModel::param_values() {
  std::vector<double> out;
  for (auto& p : params) {
    const std::vector<double> v = p.param.values();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

bool has_straddling_parameter(const Reducer& reducer, const ShardedOptimizer& zero) {
  for (const ZeroShard& s : zero.shards()) {
    const BucketLayout& l = reducer.buckets()[static_cast<size_t>(s.bucket)];
    for (const BucketSlot& slot : l.slots)
      for (int64_t cut = s.shard_numel; cut < l.numel; cut += s.shard_numel)
        if (slot.offset < cut && cut < slot.offset + slot.shape.numel()) return true;
  }
  return false;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return a.size() == b.size() ? m : std::numeric_limits<double>::infinity();
}

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, std::fabs(a[i] - b[i]) / (std::fabs(b[i]) + 1e-3));
  return a.size() == b.size() ? m : std::numeric_limits<double>::infinity();
}

}  // namespace test
}  // namespace tutti
