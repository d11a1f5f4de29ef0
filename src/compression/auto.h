// The "auto" compressor: probes the link and the candidates' local cost for
// the first steps, then picks none / fp16 / PowerSGD per bucket
// (cost_model.h, docs/compression.md).
#pragma once

#include <memory>

#include "compression/common.h"

namespace tutti {
namespace compression {

std::shared_ptr<BucketCompressor> make_auto_compressor(
    const CompressorOptions& options);

}  // namespace compression
}  // namespace tutti
