// Helpers for the compression tests: per-rank random gradients that every
// rank can regenerate, bucket layouts, state save/restore, cross-rank
// comparisons.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/compression.h"
#include "tutti/tutti.h"

namespace tutti {
namespace test {

// Gradient values for (seed, rank, step): normal(0, 1) * scale, rounded to
// `dtype` and returned as doubles (what the bucket holds).
std::vector<double> gradient_values(int64_t n, DType dtype, uint64_t seed,
                                    int rank, int64_t step, double scale = 1.0);

// A typed host bucket.
struct HostBucket {
  DType dtype;
  std::vector<unsigned char> bytes;
  HostBucket(DType d, int64_t n)
      : dtype(d), bytes(static_cast<size_t>(n) * dtype_size(d) + 1) {}
  int64_t numel() const {
    return static_cast<int64_t>((bytes.size() - 1) / dtype_size(dtype));
  }
  Tensor tensor() { return Tensor(bytes.data(), dtype, Shape{numel()}); }
  void set(const std::vector<double>& v);
  std::vector<double> get() const;
};

// A layout with the given slot shapes placed back to back from offset 0
// (numel may leave a gap at the end, which belongs to no slot).
BucketLayout make_layout(int id, DType dtype, int64_t numel,
                         const std::vector<Shape>& shapes);
// The layouts the parametrised tests use for a bucket of n elements: 2-D
// slots that PowerSGD compresses, 1-D slots and a gap where n allows.
BucketLayout test_layout(int id, DType dtype, int64_t n);

// Host copies of every state tensor (the state_dict() order).
std::vector<std::vector<char>> save_state(Compressor& c);
// Writes saved copies into c's state tensors (names and sizes must match)
// and calls on_state_loaded().
void load_state(Compressor& c, const std::vector<std::vector<char>>& saved);
// The state tensor called `name` as float64 values (empty if absent).
std::vector<double> state_values(Compressor& c, const std::string& name);

// Every rank's copy of a byte range, in rank order.
std::vector<std::vector<unsigned char>> gather_all(const void* data,
                                                   size_t bytes);

// Unit roundoff of a floating dtype (2^-24 for float32, ...).
double unit_roundoff(DType dtype);

}  // namespace test
}  // namespace tutti
