#include "compression/compression_test_util.h"

#include <cstring>
#include <random>

namespace tutti {
namespace test {

std::vector<double> gradient_values(int64_t n, DType dtype, uint64_t seed,
                                    int rank, int64_t step, double scale) {
  std::mt19937_64 rng(seed * 1000003ull + static_cast<uint64_t>(rank) * 7919ull +
                      static_cast<uint64_t>(step) * 104729ull);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(static_cast<size_t>(n));
  unsigned char tmp[8];
  for (auto& x : v) {
    store_from_double(tmp, dtype, 0, normal(rng) * scale);
    x = load_as_double(tmp, dtype, 0);
  }
  return v;
}

void HostBucket::set(const std::vector<double>& v) {
  for (size_t i = 0; i < v.size(); ++i) store_from_double(bytes.data(), dtype, i, v[i]);
}

std::vector<double> HostBucket::get() const {
  std::vector<double> v(static_cast<size_t>(numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_double(bytes.data(), dtype, i);
  return v;
}

BucketLayout make_layout(int id, DType dtype, int64_t numel,
                         const std::vector<Shape>& shapes) {
  BucketLayout l;
  l.id = id;
  l.dtype = dtype;
  l.numel = numel;
  int64_t off = 0;
  int k = 0;
  for (const Shape& s : shapes) {
    BucketSlot slot;
    slot.name = "param" + std::to_string(k++);
    slot.offset = off;
    slot.shape = s;
    off += s.numel();
    l.slots.push_back(slot);
  }
  return l;
}

BucketLayout test_layout(int id, DType dtype, int64_t n) {
  if (n >= 100000)  // a big matrix, a 1-D slot, a small matrix, a gap
    return make_layout(id, dtype, n, {Shape{100, 1000}, Shape{5000}, Shape{3, 5}});
  if (n == 1001) return make_layout(id, dtype, n, {Shape{13, 77}});
  if (n >= 1000)
    return make_layout(id, dtype, n, {Shape{20, 40}, Shape{150}, Shape{2, 3, 4}});
  if (n > 0) return make_layout(id, dtype, n, {Shape{n}});
  return make_layout(id, dtype, 0, {});
}

std::vector<std::vector<char>> save_state(Compressor& c) {
  std::vector<std::vector<char>> out;
  for (const NamedTensor& nt : c.state_dict()) {
    const char* p = static_cast<const char*>(nt.tensor.data());
    out.emplace_back(p, p + nt.tensor.nbytes());
  }
  return out;
}

void load_state(Compressor& c, const std::vector<std::vector<char>>& saved) {
  StateDict sd = c.state_dict();
  if (sd.size() != saved.size())
    throw std::runtime_error("state has " + std::to_string(sd.size()) +
                             " tensors, saved " + std::to_string(saved.size()));
  for (size_t i = 0; i < sd.size(); ++i) {
    if (sd[i].tensor.nbytes() != saved[i].size())
      throw std::runtime_error("state tensor " + sd[i].name + " changed size");
    std::memcpy(sd[i].tensor.data(), saved[i].data(), saved[i].size());
  }
  c.on_state_loaded();
}

std::vector<double> state_values(Compressor& c, const std::string& name) {
  for (const NamedTensor& nt : c.state_dict())
    if (nt.name == name) {
      std::vector<double> v(static_cast<size_t>(nt.tensor.numel()));
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = load_as_double(nt.tensor.data(), nt.tensor.dtype(), i);
      return v;
    }
  return {};
}

std::vector<std::vector<unsigned char>> gather_all(const void* data,
                                                   size_t bytes) {
  auto w = world();
  std::vector<unsigned char> mine(static_cast<const unsigned char*>(data),
                                  static_cast<const unsigned char*>(data) + bytes);
  std::vector<unsigned char> all(bytes * static_cast<size_t>(w->size()));
  if (bytes) w->allgather(Tensor::of(mine), Tensor::of(all));
  std::vector<std::vector<unsigned char>> out;
  for (int r = 0; r < w->size(); ++r)
    out.emplace_back(all.begin() + r * bytes, all.begin() + (r + 1) * bytes);
  return out;
}

double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return 1.1102230246251565e-16;
    case DType::kFloat16: return 1.0 / 2048;
    case DType::kBFloat16: return 1.0 / 256;
    default: return 1.0 / 16777216;
  }
}

}  // namespace test
}  // namespace tutti
