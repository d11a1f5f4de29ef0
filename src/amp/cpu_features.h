// Whether the host CPU runs tutti's AVX2 + F16C loops (checked once).
#pragma once

namespace tutti {
namespace amp {

inline bool cpu_has_avx2_f16c() {
#if defined(__x86_64__)
  static const bool has =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return has;
#else
  return false;
#endif
}

}  // namespace amp
}  // namespace tutti
