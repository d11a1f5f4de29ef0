#include "data_parallel/bucket_plan.h"

#include <cmath>
#include <map>
#include <tuple>

#include "core/check.h"

namespace tutti {
namespace dp {

size_t mib_to_bytes(double mib) {
  if (!(mib > 0)) return 0;
  const double bytes = std::ceil(mib * 1024.0 * 1024.0);
  return bytes < 1 ? 1 : static_cast<size_t>(bytes);
}

std::vector<int> reverse_order(int n) {
  std::vector<int> order(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) order[static_cast<size_t>(i)] = n - 1 - i;
  return order;
}

std::vector<PlannedBucket> plan_buckets(const std::vector<ParamSpec>& params,
                                        size_t cap_bytes,
                                        size_t first_cap_bytes) {
  return plan_buckets(params, reverse_order(static_cast<int>(params.size())),
                      cap_bytes, first_cap_bytes);
}

std::vector<PlannedBucket> plan_buckets(const std::vector<ParamSpec>& params,
                                        const std::vector<int>& order,
                                        size_t cap_bytes,
                                        size_t first_cap_bytes) {
  TUTTI_CHECK(cap_bytes > 0);
  TUTTI_CHECK_EQ(order.size(), params.size());
  if (first_cap_bytes == 0) first_cap_bytes = cap_bytes;
  struct Open {
    int bucket = -1;   // open bucket for this key, -1: none
    size_t bytes = 0;  // its size so far
    int closed = 0;    // buckets of this key closed so far
  };
  using Key = std::tuple<int, int, int>;  // dtype, device type, device index
  std::map<Key, Open> open;
  std::vector<PlannedBucket> buckets;
  for (const int i : order) {
    TUTTI_CHECK(i >= 0 && static_cast<size_t>(i) < params.size());
    const ParamSpec& p = params[static_cast<size_t>(i)];
    Open& o = open[Key(static_cast<int>(p.dtype), static_cast<int>(p.device.type),
                       p.device.index)];
    const size_t bytes = static_cast<size_t>(p.shape.numel()) * dtype_size(p.dtype);
    auto cap = [&] { return o.closed == 0 ? first_cap_bytes : cap_bytes; };
    if (o.bucket >= 0 && o.bytes > 0 && o.bytes + bytes > cap()) {
      o.bucket = -1;
      o.bytes = 0;
      ++o.closed;
    }
    if (o.bucket < 0) {
      o.bucket = static_cast<int>(buckets.size());
      PlannedBucket b;
      b.layout.id = o.bucket;
      b.layout.dtype = p.dtype;
      b.layout.device = p.device;
      buckets.push_back(std::move(b));
    }
    PlannedBucket& b = buckets[static_cast<size_t>(o.bucket)];
    BucketSlot slot;
    slot.name = p.name;
    slot.offset = b.layout.numel;
    slot.shape = p.shape;
    b.layout.slots.push_back(std::move(slot));
    b.params.push_back(i);
    b.layout.numel += p.shape.numel();
    b.bytes += bytes;
    o.bytes += bytes;
    if (o.bytes >= cap()) {  // full: the next tensor opens a new bucket
      o.bucket = -1;
      o.bytes = 0;
      ++o.closed;
    }
  }
  return buckets;
}

}  // namespace dp
}  // namespace tutti
