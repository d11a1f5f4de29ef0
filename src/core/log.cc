#include "tutti/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "core/runtime_state.h"
#include "tutti/config.h"

namespace tutti {
namespace {

std::atomic<int> g_level{-1};  // -1: not read from the environment yet
// The config::generation() g_level was read (or set) at: config::reload()
// re-reads TUTTI_LOG_LEVEL, replacing a set_log_level() override too.
std::atomic<uint64_t> g_level_generation{0};

LogLevel parse_level(const std::string& s) {
  if (s == "error") return LogLevel::kError;
  if (s == "warn" || s == "warning") return LogLevel::kWarn;
  if (s == "info") return LogLevel::kInfo;
  if (s == "debug") return LogLevel::kDebug;
  if (s == "trace") return LogLevel::kTrace;
  std::fprintf(stderr,
               "[tutti] TUTTI_LOG_LEVEL='%s' is not one of error, warn, info, "
               "debug, trace; using warn\n",
               s.c_str());
  return LogLevel::kWarn;
}

}  // namespace

LogLevel log_level() {
  int l = g_level.load(std::memory_order_relaxed);
  const uint64_t gen = config::generation();
  if (l < 0 || g_level_generation.load(std::memory_order_relaxed) != gen) {
    l = static_cast<int>(parse_level(config::get_string("TUTTI_LOG_LEVEL")));
    g_level.store(l);
    g_level_generation.store(gen);
  }
  return static_cast<LogLevel>(l);
}

void set_log_level(LogLevel level) {
  g_level.store(static_cast<int>(level));
  g_level_generation.store(config::generation());
}

bool log_enabled(LogLevel level) {
  return static_cast<int>(level) <= static_cast<int>(log_level());
}

void log_message(LogLevel level, const std::string& message) {
  static const char kLetters[] = {'E', 'W', 'I', 'D', 'T'};
  const auto now = std::chrono::system_clock::now();
  const auto secs = std::chrono::system_clock::to_time_t(now);
  const int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(
          now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char prefix[96];
  // The world rank and size tutti::init() recorded (core/runtime_state).
  const int r = runtime_world_rank(), n = runtime_world_size();
  if (r >= 0)
    std::snprintf(prefix, sizeof(prefix), "[tutti %d/%d %c %02d:%02d:%02d.%03d] ",
                  r, n, kLetters[static_cast<int>(level)], tm.tm_hour,
                  tm.tm_min, tm.tm_sec, ms);
  else
    std::snprintf(prefix, sizeof(prefix), "[tutti %c %02d:%02d:%02d.%03d] ",
                  kLetters[static_cast<int>(level)], tm.tm_hour, tm.tm_min,
                  tm.tm_sec, ms);
  std::string line = prefix + message;
  if (line.empty() || line.back() != '\n') line += '\n';
  // One write() per line so that concurrent lines do not interleave.
  ssize_t off = 0;
  while (off < static_cast<ssize_t>(line.size())) {
    ssize_t w = ::write(2, line.data() + off, line.size() - off);
    if (w <= 0) break;
    off += w;
  }
}

}  // namespace tutti
