#include "tutti/tensor.h"

#include <sstream>

#include "core/check.h"

namespace tutti {

Shape::Shape(std::initializer_list<int64_t> dims) {
  TUTTI_ARG_CHECK(dims.size() <= kMaxDims, "shape has ", dims.size(),
                  " dimensions; tutti supports at most ", kMaxDims);
  for (int64_t d : dims) dims_[ndim_++] = d;
}

Shape::Shape(const std::vector<int64_t>& dims)
    : Shape(dims.data(), static_cast<int>(dims.size())) {}

Shape::Shape(const int64_t* dims, int ndim) {
  TUTTI_ARG_CHECK(ndim >= 0 && ndim <= kMaxDims, "shape has ", ndim,
                  " dimensions; tutti supports at most ", kMaxDims);
  for (int i = 0; i < ndim; ++i) dims_[i] = dims[i];
  ndim_ = ndim;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < ndim_; ++i) os << (i ? ", " : "") << dims_[i];
  os << "]";
  return os.str();
}

Tensor::Tensor(void* data, DType dtype, Shape shape, Device device)
    : data_(data), dtype_(dtype), shape_(shape), device_(device) {
  for (int i = 0; i < shape_.ndim(); ++i)
    TUTTI_ARG_CHECK(shape_[i] >= 0, "tensor shape ", shape_.str(),
                    " has a negative dimension");
  numel_ = shape_.numel();
  TUTTI_ARG_CHECK(data_ != nullptr || numel_ == 0, "tensor ",
                  dtype_name(dtype), shape_.str(),
                  " has a null data pointer but ", numel_, " elements");
}

Tensor Tensor::view(Shape shape) const {
  TUTTI_ARG_CHECK(shape.numel() == numel_, "cannot view ", str(), " as ",
                  shape.str(), ": element counts differ");
  return Tensor(data_, dtype_, shape, device_);
}

Tensor Tensor::flatten() const { return view(Shape{numel_}); }

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  TUTTI_ARG_CHECK(0 <= begin && begin <= end && end <= numel_, "slice [",
                  begin, ", ", end, ") out of range for ", str());
  char* base = static_cast<char*>(data_);
  return Tensor(base ? base + begin * element_size() : nullptr, dtype_,
                Shape{end - begin}, device_);
}

Tensor Tensor::narrow_rows(int64_t begin, int64_t end) const {
  TUTTI_ARG_CHECK(ndim() >= 1, "narrow_rows on a scalar tensor ", str());
  TUTTI_ARG_CHECK(0 <= begin && begin <= end && end <= shape_[0], "rows [",
                  begin, ", ", end, ") out of range for ", str());
  const int64_t row = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  Shape s = shape_;
  s[0] = end - begin;
  char* base = static_cast<char*>(data_);
  return Tensor(base ? base + begin * row * element_size() : nullptr, dtype_, s,
                device_);
}

std::string Tensor::str() const {
  return std::string(dtype_name(dtype_)) + shape_.str() + " " + device_.str();
}

}  // namespace tutti
