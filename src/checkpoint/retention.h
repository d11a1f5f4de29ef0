// Removing checkpoints safely (rank 0, after a commit).
//
// Order of a deletion: unlink manifest.json, fsync the checkpoint directory
// (from here on the checkpoint is incomplete for every reader), then remove
// the shards and the directory.  A kill at any point leaves at worst an
// incomplete directory, which loaders ignore and the next retention pass
// removes.  The newest complete checkpoint is never removed.
#pragma once

#include <string>

#include "checkpoint/catalog.h"

namespace tutti {
namespace ckpt {

// Keeps the newest `keep_last` (>= 1) complete checkpoints, `current`
// always among them; removes older complete ones, incomplete leftovers
// other than `current`, and temp files of interrupted pointer updates.
// Failures are logged, not thrown: the new checkpoint is already committed.
void apply_retention(const std::string& root, const std::string& current,
                     int keep_last);

// Before `current` is published: complete checkpoints ordered after it are
// from a timeline the job abandoned (it resumed from an older one, e.g.
// because the newer failed verification).  They are renamed to
// "stale-<name>" so that the loader never prefers them over `current`.
void set_aside_newer(const std::string& root, const CatalogEntry& current);

// Removes a complete checkpoint in the safe order above.
void remove_checkpoint(const std::string& root, const std::string& name);

}  // namespace ckpt
}  // namespace tutti
