#include "checkpoint/retention.h"

#include <algorithm>

#include "checkpoint/fault_inject.h"
#include "checkpoint/file_util.h"
#include "tutti/error.h"
#include "tutti/log.h"

namespace tutti {
namespace ckpt {

void remove_checkpoint(const std::string& root, const std::string& name) {
  const std::string path = join_path(root, name);
  remove_file(join_path(path, kManifestName));
  fsync_dir(path);
  fault::fault_point("during_retention");
  remove_tree(path);
}

void apply_retention(const std::string& root, const std::string& current,
                     int keep_last) {
  keep_last = std::max(1, keep_last);
  std::vector<CatalogEntry> all;
  try {
    all = scan_catalog(root);
  } catch (const Error& e) {
    TUTTI_LOG(kWarn) << "checkpoint retention skipped: " << e.message();
    return;
  }
  std::vector<std::string> complete;
  for (const auto& e : all)
    if (e.complete) complete.push_back(e.name);
  // Newest first; `current` counts as kept whatever its position.
  std::reverse(complete.begin(), complete.end());
  int kept = 0;
  bool current_kept = false;
  std::vector<std::string> doomed;
  for (const auto& name : complete) {
    if (name == current) {
      current_kept = true;
      ++kept;
    } else if (kept < keep_last - (current_kept ? 0 : 1)) {
      ++kept;
    } else {
      doomed.push_back(name);
    }
  }
  // Oldest first, so a kill mid-way leaves the newest ones.
  std::reverse(doomed.begin(), doomed.end());
  bool changed = false;
  for (const auto& name : doomed) {
    try {
      remove_checkpoint(root, name);
      changed = true;
      TUTTI_LOG(kInfo) << "checkpoint retention: removed " << name;
    } catch (const Error& e) {
      TUTTI_LOG(kWarn) << "checkpoint retention: could not remove " << name << ": "
                       << e.message();
    }
  }
  for (const auto& e : all) {
    if (e.complete || e.name == current) continue;
    try {
      remove_tree(join_path(root, e.name));
      changed = true;
      TUTTI_LOG(kInfo) << "checkpoint retention: removed incomplete leftover "
                       << e.name;
    } catch (const Error& err) {
      TUTTI_LOG(kWarn) << "checkpoint retention: could not remove leftover "
                       << e.name << ": " << err.message();
    }
  }
  try {
    for (const auto& name : list_dir(root))
      if (name.compare(0, 8, ".latest.") == 0 ||
          name.compare(0, 15, ".manifest.json.") == 0) {
        remove_file(join_path(root, name));
        changed = true;
      }
    if (changed) fsync_dir(root);
  } catch (const Error& e) {
    TUTTI_LOG(kWarn) << "checkpoint retention: " << e.message();
  }
}

void set_aside_newer(const std::string& root, const CatalogEntry& current) {
  for (const auto& e : scan_catalog(root)) {
    if (!e.complete || !(current < e)) continue;
    const std::string to = join_path(root, "stale-" + e.name);
    remove_tree(to);
    rename_path(join_path(root, e.name), to);
    TUTTI_LOG(kWarn) << "checkpoint " << e.name
                     << " is newer than the one being saved (" << current.name
                     << "): this job resumed from an older checkpoint, so "
                     << e.name << " was renamed to stale-" << e.name
                     << " and will not be loaded";
  }
  fsync_dir(root);
}

}  // namespace ckpt
}  // namespace tutti
