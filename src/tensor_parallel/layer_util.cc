#include "tensor_parallel/layer_util.h"

#include "core/check.h"

namespace tutti {
namespace tp {

std::string layer_label(const char* kind, const std::string& name) {
  return detail::cat(kind, " '", name, "'");
}

void check_divisible(const std::string& owner, const char* what, int64_t size,
                     int tp_size, bool may_be_zero) {
  const bool positive = size > 0 || (may_be_zero && size == 0);
  TUTTI_ARG_CHECK(positive && size % tp_size == 0, owner, ": ", what, " ", size,
                  positive ? " is not divisible by tp_size "
                           : " must be positive (tp_size ",
                  tp_size, positive ? "" : ")");
}

int64_t rows_of(const Tensor& t, int64_t cols, const std::string& owner,
                const char* role) {
  TUTTI_ARG_CHECK(t.ndim() >= 1 && t.shape()[t.ndim() - 1] == cols, owner, ": ",
                  role, " ", t.str(), " must have last dimension ", cols);
  return t.numel() / cols;
}

Tensor view_2d(const Tensor& t, int64_t cols, int64_t expected_rows,
               DType dtype, Device device, const std::string& owner,
               const char* role) {
  TUTTI_ARG_CHECK(!is_absent(t), owner, ": ", role, " is missing");
  TUTTI_ARG_CHECK(t.dtype() == dtype && t.device() == device, owner, ": ", role,
                  " ", t.str(), " must be ", dtype_name(dtype), " on ",
                  device.str());
  const int64_t rows = rows_of(t, cols, owner, role);
  TUTTI_ARG_CHECK(expected_rows < 0 || rows == expected_rows, owner, ": ", role,
                  " ", t.str(), " has ", rows, " rows of ", cols, ", expected ",
                  expected_rows, " rows");
  return t.view(Shape{rows, cols});
}

}  // namespace tp
}  // namespace tutti
