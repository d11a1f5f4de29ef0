// gpu_cnn: shapes, parameter layout, initialisation and the synthetic data.
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "cnn.h"

namespace gpu_cnn {

namespace {

// splitmix64: a small, portable generator (the data must be the same bits on
// every machine and backend).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 24 random bits: exact in float.
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
};

}  // namespace

uint64_t mix_seed(uint64_t a, uint64_t b) {
  Rng r(a * 0x2545F4914F6CDD1Dull + b);
  return r.next();
}

void Dims::validate() const {
  auto need = [](bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("gpu_cnn: bad dimensions: ") + what);
  };
  need(batch >= 1, "batch must be >= 1");
  need(channels >= 1 && height >= 1 && width >= 1, "image dimensions must be >= 1");
  need(k1 >= 1 && k2 >= 1 && hidden >= 1, "layer widths must be >= 1");
  need(classes >= 2, "classes must be >= 2");
  need(kernel >= 1 && pad >= 0 && stride1 >= 1 && stride2 >= 1, "bad kernel/pad/stride");
  need(h1() >= 1 && w1() >= 1 && h2() >= 1 && w2() >= 1, "image too small for the convolutions");
}

std::string Dims::str() const {
  std::ostringstream o;
  o << "x[" << batch << "," << channels << "," << height << "," << width << "] -> conv"
    << kernel << "x" << kernel << "/" << stride1 << " [" << k1 << "," << h1() << "," << w1()
    << "] -> conv" << kernel << "x" << kernel << "/" << stride2 << " [" << k2 << "," << h2()
    << "," << w2() << "] -> fc " << flat() << "x" << hidden << " -> fc " << hidden << "x"
    << classes;
  return o.str();
}

Dims tiny_dims() {
  Dims d;
  d.batch = 3;
  d.channels = 2;
  d.height = 6;
  d.width = 5;  // odd and unequal: catches H/W mix-ups
  d.k1 = 3;
  d.k2 = 4;
  d.hidden = 5;
  d.classes = 3;
  return d;
}

ParamLayout::ParamLayout(const Dims& d) {
  const int64_t r = d.kernel;
  const std::vector<std::pair<std::string, std::vector<int64_t>>> decl = {
      {"conv1.weight", {d.k1, d.channels, r, r}}, {"conv1.bias", {d.k1}},
      {"conv2.weight", {d.k2, d.k1, r, r}},       {"conv2.bias", {d.k2}},
      {"fc1.weight", {d.hidden, d.flat()}},       {"fc1.bias", {d.hidden}},
      {"fc2.weight", {d.classes, d.hidden}},      {"fc2.bias", {d.classes}}};
  constexpr int64_t kAlign = 64;  // elements: 256 bytes of float32
  for (const auto& p : decl) {
    ParamSlot s;
    s.name = p.first;
    s.shape = p.second;
    s.numel = 1;
    for (int64_t x : s.shape) s.numel *= x;
    s.offset = total;
    total += (s.numel + kAlign - 1) / kAlign * kAlign;
    slots.push_back(s);
  }
}

std::vector<float> init_params(const ParamLayout& layout, uint64_t seed) {
  std::vector<float> flat(static_cast<size_t>(layout.total), 0.0f);
  Rng rng(mix_seed(seed, 0x1217));
  for (const ParamSlot& s : layout.slots) {
    const bool bias = s.shape.size() == 1;
    int64_t fan_in = 1;
    for (size_t i = 1; i < s.shape.size(); ++i) fan_in *= s.shape[i];
    const float bound = bias ? 0.1f : static_cast<float>(std::sqrt(3.0 / fan_in));
    for (int64_t i = 0; i < s.numel; ++i)
      flat[s.offset + i] = (2.0f * rng.uniform() - 1.0f) * bound;
  }
  return flat;
}

Batch make_batch(const Dims& d, uint64_t seed) {
  Batch b;
  b.x.resize(static_cast<size_t>(d.batch * d.image()));
  b.labels.resize(static_cast<size_t>(d.batch));
  Rng rng(mix_seed(seed, 0xBA7C));
  const int64_t plane = int64_t{d.height} * d.width;
  for (int n = 0; n < d.batch; ++n) {
    float* img = b.x.data() + n * d.image();
    for (int64_t i = 0; i < d.image(); ++i) img[i] = rng.uniform() - 0.5f;
    const int cy = rng.below(d.height), cx = rng.below(d.width);
    for (int c = 0; c < d.channels; ++c)
      for (int y = cy - 1; y <= cy + 1; ++y)
        for (int x = cx - 1; x <= cx + 1; ++x)
          if (y >= 0 && y < d.height && x >= 0 && x < d.width)
            img[c * plane + y * d.width + x] += 1.5f;
    const int quadrant = (2 * cy >= d.height ? 2 : 0) + (2 * cx >= d.width ? 1 : 0);
    b.labels[n] = quadrant % d.classes;
  }
  return b;
}

}  // namespace gpu_cnn
