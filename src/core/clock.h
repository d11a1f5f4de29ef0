// Elapsed wall time for the logs and statistics (a monotonic clock).
#pragma once

#include <chrono>

namespace tutti {

// Seconds from `t` to now on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace tutti
