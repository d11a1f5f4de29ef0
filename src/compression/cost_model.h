// The cost model the "auto" compressor decides with (docs/compression.md).
//
// An all-reduce of B bytes is modelled as T(B) = latency + B * seconds_per_byte,
// fitted per bucket from two timed all-reduces: a small probe (latency) and
// the bucket itself.  A candidate's step time is its all-reduces' T plus its
// measured local arithmetic (encode + decode):
//   none      T(B)
//   fp16      T(B16) + c_cast                      (B16 = 2 bytes/element)
//   powersgd  T(B_P) + T(B_Q) + c_psgd             (two all-reduces)
// A lossier candidate (order: none < fp16 < powersgd) is chosen only when it
// predicts at least `min_gain` (a fraction) less time than the best less
// lossy one: compression costs accuracy, so a marginal gain is not worth it.
#pragma once

#include <cstdint>
#include <string>

namespace tutti {
namespace compression {

struct LinkModel {
  double latency_s = 0;
  double seconds_per_byte = 0;
  double seconds(double bytes) const {
    return bytes <= 0 ? 0 : latency_s + bytes * seconds_per_byte;
  }
};

// Fits T(B) through (small_bytes, t_small) and (big_bytes, t_big); a
// non-positive slope (noise, tiny buckets) means "latency bound".
LinkModel fit_link(double small_bytes, double t_small, double big_bytes,
                   double t_big);

enum class AutoChoice : int64_t { kNone = 0, kCast = 1, kPowerSgd = 2 };
const char* auto_choice_name(AutoChoice c);

struct AutoCandidates {
  double bucket_bytes = 0;
  bool cast_possible = false;  // no gain for a bucket already 16-bit
  double cast_bytes = 0;
  double cast_compute_s = 0;
  bool psgd_possible = false;  // some slot compresses
  double psgd_p_bytes = 0;     // first all-reduce (plain part + P)
  double psgd_q_bytes = 0;     // second all-reduce (Q)
  double psgd_compute_s = 0;
};

struct AutoDecision {
  AutoChoice choice = AutoChoice::kNone;
  double t_none = 0, t_cast = 0, t_psgd = 0;  // predicted seconds per step
};

AutoDecision decide(const LinkModel& link, const AutoCandidates& c,
                    double min_gain);

}  // namespace compression
}  // namespace tutti
