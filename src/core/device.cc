#include "tutti/device.h"

#include <cstdlib>

#include "core/check.h"
#include "core/cuda_utils.h"

namespace tutti {

std::string Device::str() const {
  if (is_cpu()) return "cpu";
  return "cuda:" + std::to_string(index);
}

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    const std::string num = s.substr(5);
    char* end = nullptr;
    long idx = std::strtol(num.c_str(), &end, 10);
    if (!num.empty() && end && *end == '\0' && idx >= 0 && idx < 1024)
      return cuda(static_cast<int>(idx));
  }
  TUTTI_THROW(kInvalidArgument, "cannot parse device '", s,
              "' (expected cpu, cuda or cuda:N)");
}

bool cuda_built() {
#if TUTTI_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#if TUTTI_WITH_CUDA
  return cuda::device_count_noexcept();
#else
  return 0;
#endif
}

}  // namespace tutti
