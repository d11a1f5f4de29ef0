// What the ULFM probes share (ulfm_probe.cc, ulfm_ops_probe.cc, ulfm_tp_probe.cc): the kill
// list, a rank's planned death with its time of death left in DIR for the
// survivors' detection bound, and the probes' check macro.
#pragma once

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "tutti/tutti.h"

namespace ulfm_probe {

// "RANK:AT": the rank (numbered at start) that dies, and when (an
// iteration or a step, as the mode says).
struct Kill {
  int rank;
  int64_t at;
};

inline std::vector<Kill> parse_kills(const char* spec) {
  std::vector<Kill> out;
  std::string s(spec);
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    Kill k{-1, -1};
    long long at = -1;
    if (std::sscanf(s.substr(pos, end - pos).c_str(), "%d:%lld", &k.rank, &at) == 2) {
      k.at = at;
      out.push_back(k);
    }
    pos = end + 1;
  }
  return out;
}

inline double wall_now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The dying rank leaves its time of death for the survivors' bound.
[[noreturn]] inline void die(const std::string& dir, int start_rank) {
  std::ofstream(dir + "/killed.rank" + std::to_string(start_rank)) << std::fixed << wall_now()
                                                                   << "\n";
  std::fflush(nullptr);
  raise(SIGKILL);
  _exit(9);
}

inline double killed_at(const std::string& dir, int start_rank) {
  std::ifstream f(dir + "/killed.rank" + std::to_string(start_rank));
  double t = 0;
  f >> t;
  return t;
}

struct Fail {
  std::string what;
};

template <typename... A>
std::string cat(const A&... a) {
  std::ostringstream s;
  (void)std::initializer_list<int>{((s << a), 0)...};
  return s.str();
}

// State over the world: w (float64[4], replicated) and v, this rank's
// slice of a float64[12] split in equal slices (12 divides by 4, 3, 2, 1).
struct SlicedState : tutti::Stateful {
  static constexpr int64_t kLen = 12;
  std::vector<double> w;
  std::vector<double> v;
  int64_t offset = 0;
  explicit SlicedState(double w0) : w(4, w0) {}
  // Lays v out for the current world (empty values).
  void shard() {
    const int64_t n = kLen / tutti::size();
    offset = n * tutti::rank();
    v.assign(static_cast<size_t>(n), 0.0);
  }
  tutti::StateDict state_dict() override {
    tutti::ShardInfo si;
    si.global_shape = {kLen};
    si.dim = 0;
    si.offset = offset;
    return {{"w", tutti::Tensor::of(w), tutti::ShardInfo()}, {"v", tutti::Tensor::of(v), si}};
  }
};

// A probe's main after the argument check: init; exit 77 (skipped) where
// recovery is not available; `body(res)` with DIR/result.rank<R> open (R:
// the rank at start), which ends in "OK" or "FAIL <why>"; shutdown.
inline int probe_main(const char* name, const std::string& dir,
                      const std::function<int(std::ofstream& res)>& body) {
  tutti::init();
  if (!tutti::recovery_available()) {
    if (tutti::rank() == 0) std::printf("%s: in-process recovery is not available here\n", name);
    tutti::shutdown();
    return 77;
  }
  const int start_rank = tutti::rank();
  std::ofstream res(dir + "/result.rank" + std::to_string(start_rank));
  int rc = 0;
  std::string failed;
  try {
    rc = body(res);
    res << "OK\n";
  } catch (const Fail& f) {
    failed = f.what;
  } catch (const std::exception& e) {
    failed = e.what();
  }
  if (!failed.empty()) {
    res << "FAIL " << failed << "\n";
    std::fprintf(stderr, "start rank %d: %s\n", start_rank, failed.c_str());
    rc = 1;
  }
  res.close();
  tutti::shutdown();
  return rc;
}

}  // namespace ulfm_probe

#define EXPECT(cond, ...)                                                                  \
  do {                                                                                     \
    if (!(cond))                                                                           \
      throw ::ulfm_probe::Fail{::ulfm_probe::cat("check failed: " #cond " ", __VA_ARGS__)}; \
  } while (0)
