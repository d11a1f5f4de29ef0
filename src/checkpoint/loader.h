// The collective load: every rank of the group considers the same
// candidates, newest first; a candidate is used only when every rank could
// read its manifest and headers, plan its part, and verify the checksums of
// every shard it reads (plus the shards assigned to it round-robin, so that
// each shard is verified by some rank).  Otherwise the next older one is
// tried, with the reason logged.
#pragma once

#include <optional>
#include <string>

#include "core/host_buffer.h"
#include "tutti/checkpoint.h"

namespace tutti {
namespace ckpt {

std::optional<LoadResult> load_checkpoint(ProcessGroup& comm, const std::string& root,
                                          double timeout_s, const StateDict& dst,
                                          const LoadOptions& options,
                                          HostBufferPool& pool);

// Single-process full verification ("" when valid).
std::string verify_checkpoint_dir(const std::string& path, HostBufferPool& pool);

}  // namespace ckpt
}  // namespace tutti
