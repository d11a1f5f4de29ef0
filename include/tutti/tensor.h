// A non-owning, contiguous view of typed memory.
//
// tutti never owns user tensors: a Tensor names memory that the caller keeps
// alive (a std::vector, a torch tensor via DLPack, a cudaMalloc'd buffer) for
// as long as an operation on it is in flight.  Views are row-major and
// contiguous; strided framework tensors are rejected at the binding layer.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "tutti/device.h"
#include "tutti/dtype.h"
#include "tutti/export.h"

namespace tutti {

// A tensor shape with inline storage (no heap allocation): up to kMaxDims.
class TUTTI_API Shape {
 public:
  static constexpr int kMaxDims = 8;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims);
  Shape(const int64_t* dims, int ndim);

  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  const int64_t* data() const { return dims_; }
  // Product of the dimensions (1 for a scalar, ndim 0).
  int64_t numel() const;
  std::vector<int64_t> vec() const { return {dims_, dims_ + ndim_}; }
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  // "[2, 3]"
  std::string str() const;

 private:
  int64_t dims_[kMaxDims] = {};
  int ndim_ = 0;
};

class TUTTI_API Tensor {
 public:
  Tensor() = default;
  Tensor(void* data, DType dtype, Shape shape, Device device = Device::cpu());

  // A 1-D view over n elements of a typed array.
  template <typename T>
  static Tensor of(T* data, int64_t n, Device device = Device::cpu()) {
    return Tensor(static_cast<void*>(data), DTypeOf<T>::value, Shape{n},
                  device);
  }
  template <typename Vec>
  static Tensor of(Vec& v) {
    return of(v.data(), static_cast<int64_t>(v.size()));
  }

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  Device device() const { return device_; }
  int ndim() const { return shape_.ndim(); }
  int64_t numel() const { return numel_; }
  size_t element_size() const { return dtype_size(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel_) * element_size(); }
  bool defined() const { return data_ != nullptr || numel_ == 0; }
  bool is_cuda() const { return device_.is_cuda(); }

  // The same memory with another shape of equal numel.
  Tensor view(Shape shape) const;
  // The same memory seen as 1-D.
  Tensor flatten() const;
  // Elements [begin, end) of the flattened tensor, as a 1-D view.
  Tensor slice(int64_t begin, int64_t end) const;
  // Rows [begin, end) along dimension 0 (shape keeps its other dims).
  Tensor narrow_rows(int64_t begin, int64_t end) const;

  // "float32[4, 1024] cpu"
  std::string str() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kFloat32;
  Shape shape_;
  Device device_ = Device::cpu();
  int64_t numel_ = 0;
};

}  // namespace tutti
