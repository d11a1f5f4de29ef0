// The Compressor interface's out-of-line pieces, option defaults and the
// factory.
#include "tutti/compression.h"

#include "compression/auto.h"
#include "compression/cast.h"
#include "compression/common.h"
#include "compression/onebit.h"
#include "compression/powersgd.h"
#include "compression/topk.h"
#include "core/check.h"
#include "tutti/config.h"

namespace tutti {

Compressor::~Compressor() = default;

CompressorOptions CompressorOptions::from_env() {
  CompressorOptions o;
  o.topk_ratio = config::get_double("TUTTI_TOPK_RATIO");
  o.powersgd_rank = static_cast<int>(config::get_int("TUTTI_POWERSGD_RANK"));
  o.powersgd_start_step = config::get_int("TUTTI_POWERSGD_START_STEP");
  o.onebit_chunk = config::get_int("TUTTI_ONEBIT_CHUNK");
  o.auto_probe_steps = static_cast<int>(config::get_int("TUTTI_AUTO_PROBE_STEPS"));
  return o;
}

std::shared_ptr<Compressor> make_compressor(const std::string& name,
                                            const CompressorOptions& o) {
  using namespace compression;
  if (name == "none") return make_none_compressor();
  if (name == "fp16") return make_cast_compressor(DType::kFloat16);
  if (name == "bf16") return make_cast_compressor(DType::kBFloat16);
  if (name == "topk") return make_topk_compressor(o.topk_ratio);
  if (name == "powersgd") {
    PowerSgdOptions po;
    po.rank = o.powersgd_rank;
    po.start_step = o.powersgd_start_step;
    po.min_compression = o.powersgd_min_compression;
    po.seed = o.seed;
    return std::make_shared<PowerSgdCompressor>(po, "compressor/powersgd");
  }
  if (name == "onebit") return make_onebit_compressor(o.onebit_chunk);
  if (name == "auto") return make_auto_compressor(o);
  TUTTI_THROW(kInvalidArgument, "unknown compressor '", name,
              "' (TUTTI_COMPRESSION): expected none, fp16, bf16, topk, "
              "powersgd, onebit or auto");
}

}  // namespace tutti
