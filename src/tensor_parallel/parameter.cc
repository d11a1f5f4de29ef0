#include "tensor_parallel/parameter.h"

#include <algorithm>

#include "core/check.h"

namespace tutti {
namespace tp {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

float seeded_uniform(uint64_t seed, uint64_t salt, int64_t index) {
  const uint64_t h = mix(mix(mix(seed) ^ salt) + static_cast<uint64_t>(index));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

Parameter::Parameter(std::string name, std::vector<int64_t> global_shape,
                     int dim, int part, int parts, DType dtype, Device device)
    : name_(std::move(name)) {
  TUTTI_CHECK(dim < static_cast<int>(global_shape.size()), name_, " dim ", dim);
  std::vector<int64_t> local = global_shape;
  if (dim >= 0) {
    TUTTI_CHECK(global_shape[dim] % parts == 0, name_, " extent ",
                global_shape[dim], " parts ", parts);
    local[dim] = global_shape[dim] / parts;
    local_dim_ = local[dim];
    for (size_t i = dim + 1; i < global_shape.size(); ++i)
      inner_ *= global_shape[i];
    shard_.offset = part * local_dim_;
  }
  shard_.global_shape = global_shape;
  shard_.dim = dim;
  shard_.group = "tp";
  value_ = OwnedTensor(dtype, Shape(local), device);
  grad_ = OwnedTensor(dtype, Shape(local), device);
  fill_zero(value(), nullptr);
  fill_zero(grad(), nullptr);
  // The layer's stream may not be ordered after the legacy default stream.
  synchronize(device);
}

void Parameter::zero_grad(void* stream) { fill_zero(grad(), stream); }

int64_t Parameter::global_index(int64_t l) const {
  if (shard_.dim < 0) return l;
  const int64_t global_dim = shard_.global_shape[shard_.dim];
  const int64_t outer = l / (local_dim_ * inner_);
  const int64_t d = (l / inner_) % local_dim_;
  const int64_t in = l % inner_;
  return (outer * global_dim + shard_.offset + d) * inner_ + in;
}

void Parameter::init_uniform(uint64_t seed, uint64_t salt, double bound) {
  const int64_t n = value().numel();
  std::vector<float> v(n);
  for (int64_t l = 0; l < n; ++l)
    v[l] = static_cast<float>(
        bound * (2.0 * seeded_uniform(seed, salt, global_index(l)) - 1.0));
  std::vector<unsigned char> bytes(value().nbytes());
  convert(v.data(), DType::kFloat32, bytes.data(), value().dtype(), n);
  copy_from_host(value(), bytes.data());
}

void Parameter::load_full(const Tensor& full, const std::string& owner) {
  TUTTI_ARG_CHECK(!full.is_cuda(), owner, " load_from_full: '", name_,
                  "' must be a host tensor, got ", full.str());
  TUTTI_ARG_CHECK(dtype_is_floating(full.dtype()), owner, " load_from_full: '",
                  name_, "' must be a floating tensor, got ", full.str());
  TUTTI_ARG_CHECK(full.shape() == Shape(shard_.global_shape), owner,
                  " load_from_full: '", name_, "' is ", full.str(),
                  ", expected the global shape ",
                  Shape(shard_.global_shape).str());
  const int64_t n = value().numel();
  const size_t es = full.element_size();
  std::vector<unsigned char> slice(n * es), bytes(value().nbytes());
  const auto* src = static_cast<const unsigned char*>(full.data());
  for (int64_t l = 0; l < n; ++l)
    std::copy_n(src + global_index(l) * es, es, slice.data() + l * es);
  convert(slice.data(), full.dtype(), bytes.data(), value().dtype(), n);
  copy_from_host(value(), bytes.data());
}

TPParameter Parameter::describe() const {
  TPParameter p;
  p.name = name_;
  p.value = value();
  p.grad = grad();
  p.shard = shard_;
  return p;
}

}  // namespace tp
}  // namespace tutti
