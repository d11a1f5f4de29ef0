// Removing checkpoints safely (rank 0, after a commit).
//
// Order of a deletion: unlink manifest.json, fsync the checkpoint directory
// (from here on the checkpoint is incomplete for every reader), then remove
// the shards and the directory.  A kill at any point leaves at worst an
// incomplete directory, which loaders ignore and the next retention pass
// removes.  The newest complete checkpoint is never removed.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/catalog.h"

namespace tutti {
namespace ckpt {

// Keeps the newest `keep_last` (>= 1) complete checkpoints of `current`'s
// timeline (the chain of manifest parents from `current`), `current` always
// among them, and removes its older ones.  Complete checkpoints outside the
// timeline (another run's history, abandoned timelines) are neither counted
// nor removed.  Also removes incomplete leftovers other than `current` and
// temp files of interrupted pointer updates.  Failures are logged, not
// thrown: the new checkpoint is already committed.
void apply_retention(const std::string& root, const std::string& current,
                     int keep_last);

// The newest complete checkpoint ordered after `current`, or "" (a save of
// `current` refuses to publish under such a history: see commit.cc).
std::string newer_complete(const std::string& root, const CatalogEntry& current);

// After a job resumed from `loaded`: the complete checkpoints ordered after
// it belong to a timeline the job abandoned.  Each is renamed
// "abandoned-<name>" ("abandoned-<name>-<k>" when taken) so that no load
// ever returns to it and retention never counts it; they are kept for
// inspection and never removed by tutti.  Returns the names set aside;
// kIo when a rename fails.
std::vector<std::string> abandon_newer(const std::string& root, const CatalogEntry& loaded);

// Removes a complete checkpoint in the safe order above.
void remove_checkpoint(const std::string& root, const std::string& name);

}  // namespace ckpt
}  // namespace tutti
