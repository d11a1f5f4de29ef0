// Rank-prefixed logging to stderr.
//
//   TUTTI_LOG(kInfo) << "built " << n << " buckets";
// prints "[tutti 1/4 I] built 3 buckets" as one write, so lines from several
// threads or ranks do not interleave mid-line.  The level comes from
// TUTTI_LOG_LEVEL (error, warn, info, debug, trace; default warn).
#pragma once

#include <sstream>
#include <string>

#include "tutti/export.h"

namespace tutti {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

// TUTTI_LOG_LEVEL, re-read after every config::reload().
TUTTI_API LogLevel log_level();
// Overrides TUTTI_LOG_LEVEL until the next config::reload().
TUTTI_API void set_log_level(LogLevel level);
TUTTI_API bool log_enabled(LogLevel level);
TUTTI_API void log_message(LogLevel level, const std::string& message);

class TUTTI_API LogLine {
 public:
  explicit LogLine(LogLevel level) : level_(level) {}
  ~LogLine() { log_message(level_, stream_.str()); }
  template <typename T>
  LogLine& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace tutti

// A for-loop rather than if/else, so the macro is safe inside an unbraced if.
#define TUTTI_LOG(level)                                                   \
  for (bool tutti_log_on_ = ::tutti::log_enabled(::tutti::LogLevel::level); \
       tutti_log_on_; tutti_log_on_ = false)                               \
  ::tutti::LogLine(::tutti::LogLevel::level)
