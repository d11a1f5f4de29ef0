// The bucket plan: which gradient goes into which fusion bucket, where.
//
// Gradients become ready roughly in reverse registration order (the last
// layer's first), so buckets are filled walking the parameters backwards.
// Each (dtype, device) has its own open bucket; a bucket is closed before a
// tensor would take it over its cap, so a bucket exceeds the cap only when
// one tensor alone does.  The first bucket of each (dtype, device) has its
// own, usually smaller, cap so that communication starts early.  After the
// first step the reducer may re-plan in the observed ready order (the same
// packing rules over another order).  Buckets are
// numbered in creation order, which is the launch order.  The plan is a pure
// function of the parameter list and the caps: ranks that agree on both
// agree on the plan.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "tutti/compression.h"
#include "tutti/tensor.h"

namespace tutti {
namespace dp {

struct ParamSpec {
  std::string name;
  DType dtype = DType::kFloat32;  // the gradient's dtype
  Device device = Device::cpu();
  Shape shape;
};

struct PlannedBucket {
  BucketLayout layout;      // id, dtype, device, numel, slots
  std::vector<int> params;  // parameter index of each slot
  size_t bytes = 0;         // layout.numel * element size
};

// cap_bytes > 0; first_cap_bytes == 0 means cap_bytes.  Packs the
// parameters in reverse registration order.
std::vector<PlannedBucket> plan_buckets(const std::vector<ParamSpec>& params,
                                        size_t cap_bytes,
                                        size_t first_cap_bytes);
// As above, packing the parameters in `order` (every index exactly once):
// the learned plan, in the order gradients were observed to become ready.
std::vector<PlannedBucket> plan_buckets(const std::vector<ParamSpec>& params,
                                        const std::vector<int>& order,
                                        size_t cap_bytes,
                                        size_t first_cap_bytes);
// Reverse registration order 0..n-1 -> n-1..0.
std::vector<int> reverse_order(int n);

// MiB -> bytes, at least 1 byte for any positive size.
size_t mib_to_bytes(double mib);

}  // namespace dp
}  // namespace tutti
