// The fused write-back's CPU twin (what the CPU path runs and what the CUDA
// kernel is compared with): the chunk table and the element semantics for
// every dtype, against a scalar reference, with poisoned outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "data_parallel/dp_test_util.h"
#include "data_parallel/unflatten.h"

namespace tutti {
namespace {

using test::Buffer;

const DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                         DType::kInt8,    DType::kUInt8,   DType::kInt32,    DType::kInt64};

// Scalar reference: floats divide in float32 (16-bit: then round once) or
// float64; integers truncate toward zero.
double reference(DType d, double x, int64_t div) {
  if (div == 1) return x;
  if (!dtype_is_floating(d)) return std::trunc(x / static_cast<double>(div));
  if (d == DType::kFloat64) return x / static_cast<double>(div);
  return test::stored(d, static_cast<double>(static_cast<float>(x) / static_cast<float>(div)));
}

TEST(UnflattenChunks, CutsSlotsAndSkipsEmptyOnes) {
  std::vector<float> a(12), b(0), c(5);
  auto chunks = dp::make_unflatten_chunks(
      DType::kFloat32, {{a.data(), 0, 12}, {b.data(), 12, 0}, {c.data(), 12, 5}}, 5);
  ASSERT_EQ(chunks.size(), 4u);  // 5 + 5 + 2, then 5
  EXPECT_EQ(chunks[1].dst, a.data() + 5);
  EXPECT_EQ(chunks[1].src_offset, 5);
  EXPECT_EQ(chunks[2].numel, 2);
  EXPECT_EQ(chunks[3].dst, c.data());
  EXPECT_EQ(chunks[3].src_offset, 12);
  EXPECT_EQ(chunks[3].numel, 5);
}

TEST(UnflattenScaleCpu, EveryDTypeAndDivisor) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(-120, 120);
  for (DType d : kDTypes) {
    for (int64_t div : {1, 2, 3, 4, 7}) {
      // Three slots of 1000, 1 and 2500 elements: chunks of 1024 split them.
      const int64_t sizes[] = {1000, 1, 2500};
      Buffer flat(d, 3501);
      flat.fill([&](int64_t) { return d == DType::kUInt8 ? std::fabs(u(rng)) : u(rng); });
      std::vector<Buffer> outs;
      std::vector<dp::UnflattenSlot> slots;
      int64_t off = 0;
      for (int64_t n : sizes) outs.emplace_back(d, n);
      for (size_t s = 0; s < outs.size(); ++s) {
        outs[s].fill([](int64_t) { return 99.0; });  // poison
        slots.push_back({outs[s].bytes.data(), off, sizes[s]});
        off += sizes[s];
      }
      auto chunks = dp::make_unflatten_chunks(d, slots, 1024);
      dp::unflatten_scale_cpu(flat.bytes.data(), d, chunks.data(), chunks.size(), div);
      off = 0;
      for (size_t s = 0; s < outs.size(); ++s) {
        EXPECT_TRUE(test::matches(outs[s], [&](int64_t i) { return reference(d, flat.get(off + i), div); }))
            << dtype_name(d) << " / " << div << " slot " << s;
        off += sizes[s];
      }
    }
  }
}

TEST(UnflattenScaleCpu, NonFiniteValuesPassThrough) {
  std::vector<float> flat = {INFINITY, -INFINITY, NAN, 6.0f}, out(4, 0.0f);
  auto chunks = dp::make_unflatten_chunks(DType::kFloat32, {{out.data(), 0, 4}});
  dp::unflatten_scale_cpu(flat.data(), DType::kFloat32, chunks.data(), chunks.size(), 3);
  EXPECT_EQ(out[0], INFINITY);
  EXPECT_EQ(out[1], -INFINITY);
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_EQ(out[3], 2.0f);
  EXPECT_THROW(dp::unflatten_scale_cpu(flat.data(), DType::kFloat32, chunks.data(), 1, 0), Error);
}

}  // namespace
}  // namespace tutti
