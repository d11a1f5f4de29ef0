#include <gtest/gtest.h>

#include <vector>

#include "tutti/tutti.h"

namespace tutti {
namespace {

TEST(Shape, Basics) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.ndim(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ(Shape({0, 5}).numel(), 0);
  EXPECT_EQ(Shape(std::vector<int64_t>{2, 3, 4}), s);
  EXPECT_THROW(Shape({1, 1, 1, 1, 1, 1, 1, 1, 1}), Error);
}

TEST(Tensor, ViewsShareMemory) {
  std::vector<float> v(24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  Tensor t(v.data(), DType::kFloat32, Shape{2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.str(), "float32[2, 3, 4] cpu");
  Tensor f = t.flatten();
  EXPECT_EQ(f.ndim(), 1);
  Tensor s = t.slice(5, 9);
  EXPECT_EQ(s.numel(), 4);
  EXPECT_EQ(s.data_as<float>()[0], 5.0f);
  Tensor r = t.narrow_rows(1, 2);
  EXPECT_EQ(r.shape(), Shape({1, 3, 4}));
  EXPECT_EQ(r.data_as<float>()[0], 12.0f);
  EXPECT_EQ(t.view(Shape{6, 4}).shape()[0], 6);
  EXPECT_THROW(t.view(Shape{5, 5}), Error);
  EXPECT_THROW(t.slice(10, 30), Error);
  EXPECT_THROW(Tensor(nullptr, DType::kFloat32, Shape{3}), Error);
  EXPECT_NO_THROW(Tensor(nullptr, DType::kFloat32, Shape{0}));
}

TEST(Tensor, ErrorMessagesNameTheProblem) {
  std::vector<float> v(4);
  Tensor t = Tensor::of(v);
  try {
    t.view(Shape{3});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("float32[4]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[3]"), std::string::npos) << e.what();
  }
}

TEST(Device, ParseAndPrint) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(1).str(), "cuda:1");
  EXPECT_THROW(Device::parse("tpu"), Error);
  EXPECT_THROW(Device::parse("cuda:x"), Error);
  EXPECT_GE(cuda_device_count(), 0);
}

}  // namespace
}  // namespace tutti
