#include "checkpoint/retention.h"

#include <algorithm>
#include <set>

#include "checkpoint/fault_inject.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "tutti/error.h"
#include "tutti/log.h"

namespace tutti {
namespace ckpt {
namespace {

// The names on `current`'s chain of manifest parents.  A manifest that
// cannot be read ends the chain (its ancestors are then left alone).
std::set<std::string> timeline_of(const std::string& root, const std::string& current,
                                  const std::vector<CatalogEntry>& all) {
  std::set<std::string> complete, line;
  for (const auto& e : all)
    if (e.complete) complete.insert(e.name);
  std::string name = current;
  while (!name.empty() && complete.count(name) && line.insert(name).second) {
    try {
      name = read_manifest(join_path(root, name)).parent;
    } catch (const Error& e) {
      TUTTI_LOG(kWarn) << "checkpoint retention: the timeline ends at " << name << ": "
                       << e.message();
      break;
    }
  }
  return line;
}

}  // namespace

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
  // Newest first: this timeline's complete checkpoints.  `current` counts
  // as kept whatever its position.
  const std::set<std::string> line = timeline_of(root, current, all);
  std::vector<std::string> complete;
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (it->complete && line.count(it->name)) complete.push_back(it->name);
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

std::string newer_complete(const std::string& root, const CatalogEntry& current) {
  const auto all = scan_catalog(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (it->complete && current < *it) return it->name;
  return "";
}

std::vector<std::string> abandon_newer(const std::string& root, const CatalogEntry& loaded) {
  std::vector<std::string> moved;
  const auto all = scan_catalog(root);
  // Newest first: a kill half-way leaves the oldest abandoned ones, which a
  // restart that falls back again abandons in turn.
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!it->complete || !(loaded < *it)) continue;
    std::string to = "abandoned-" + it->name;
    for (int k = 2; path_exists(join_path(root, to)); ++k)
      to = "abandoned-" + it->name + "-" + std::to_string(k);
    rename_path(join_path(root, it->name), join_path(root, to));
    moved.push_back(to);
    TUTTI_LOG(kWarn) << "checkpoint " << it->name << " is newer than " << loaded.name
                     << ", which this job resumed from: its timeline is abandoned, "
                     << "kept as " << to << " (never loaded, never counted by "
                     << "keep_last; remove it by hand)";
  }
  if (!moved.empty()) fsync_dir(root);
  return moved;
}

}  // namespace ckpt
}  // namespace tutti
