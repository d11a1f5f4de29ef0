// The Compressor interface's out-of-line pieces and option defaults.
#include "tutti/compression.h"

#include "core/check.h"
#include "tutti/config.h"

namespace tutti {

Compressor::~Compressor() = default;

CompressorOptions CompressorOptions::from_env() {
  CompressorOptions o;
  o.topk_ratio = config::get_double("TUTTI_TOPK_RATIO");
  o.powersgd_rank = static_cast<int>(config::get_int("TUTTI_POWERSGD_RANK"));
  o.powersgd_start_step = config::get_int("TUTTI_POWERSGD_START_STEP");
  o.auto_probe_steps = static_cast<int>(config::get_int("TUTTI_AUTO_PROBE_STEPS"));
  return o;
}

}  // namespace tutti
