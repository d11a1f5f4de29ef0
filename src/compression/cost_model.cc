#include "compression/cost_model.h"

#include <algorithm>

namespace tutti {
namespace compression {

LinkModel fit_link(double small_bytes, double t_small, double big_bytes,
                   double t_big) {
  LinkModel m;
  if (big_bytes > small_bytes && t_big > t_small) {
    m.seconds_per_byte = (t_big - t_small) / (big_bytes - small_bytes);
    m.latency_s = std::max(0.0, t_small - small_bytes * m.seconds_per_byte);
  } else {
    m.seconds_per_byte = 0;
    m.latency_s = std::max(t_small, t_big);
  }
  return m;
}

const char* auto_choice_name(AutoChoice c) {
  switch (c) {
    case AutoChoice::kNone: return "none";
    case AutoChoice::kCast: return "fp16";
    case AutoChoice::kPowerSgd: return "powersgd";
  }
  return "invalid";
}

AutoDecision decide(const LinkModel& link, const AutoCandidates& c,
                    double min_gain) {
  AutoDecision d;
  d.t_none = link.seconds(c.bucket_bytes);
  d.t_cast = c.cast_possible ? link.seconds(c.cast_bytes) + c.cast_compute_s : 0;
  d.t_psgd = c.psgd_possible ? link.seconds(c.psgd_p_bytes) +
                                   link.seconds(c.psgd_q_bytes) + c.psgd_compute_s
                             : 0;
  double best = d.t_none;
  const double keep = 1.0 - min_gain;
  if (c.cast_possible && d.t_cast <= keep * best) {
    d.choice = AutoChoice::kCast;
    best = d.t_cast;
  }
  if (c.psgd_possible && d.t_psgd <= keep * best) {
    d.choice = AutoChoice::kPowerSgd;
  }
  return d;
}

}  // namespace compression
}  // namespace tutti
