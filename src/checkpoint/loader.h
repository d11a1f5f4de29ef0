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

// When the directory holds no complete checkpoint (CheckpointOptions::
// fresh_start).
struct FreshStartRule {
  FreshStart policy = FreshStart::kAuto;  // kAuto, kAllow or kRefuse
  std::string source;                     // where the policy came from
  bool dir_used_before = true;  // rank 0: tutti.lock existed before this job
  int64_t restart_count = 0;    // TUTTI_RESTART_COUNT
};

// Resolves kFromSetting (TUTTI_CKPT_FRESH_START); kInvalidArgument for an
// unknown value.
FreshStartRule make_fresh_start_rule(FreshStart requested, bool dir_used_before);

// Rank 0, when no complete checkpoint exists: "" when starting fresh is
// fine, else the refusal (why a history was expected).
std::string fresh_start_refusal(const std::string& root, const FreshStartRule& rule);

std::optional<LoadResult> load_checkpoint(ProcessGroup& comm, const std::string& root,
                                          double timeout_s, const StateDict& dst,
                                          const LoadOptions& options,
                                          const FreshStartRule& fresh,
                                          HostBufferPool& pool);

// Single-process full verification ("" when valid).
std::string verify_checkpoint_dir(const std::string& path, HostBufferPool& pool);

}  // namespace ckpt
}  // namespace tutti
