// The checkpoint directory as a catalog:
//   <dir>/step-00000020/             one checkpoint (complete when it holds
//        manifest.json                manifest.json)
//        rank-00000.safetensors
//   <dir>/step-00000020.1/           the same step saved again later
//   <dir>/latest                     the name of the newest committed one
//   <dir>/stale-step-00000030/       a newer checkpoint set aside because
//                                    training resumed from an older one
// Order: by step, then by suffix.  Directories without a manifest are
// leftovers of interrupted saves or deletions; nothing reads them and
// retention removes them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tutti {
namespace ckpt {

struct CatalogEntry {
  std::string name;
  int64_t step = 0;
  int suffix = 0;
  bool complete = false;
  bool operator<(const CatalogEntry& o) const {
    return step != o.step ? step < o.step : suffix < o.suffix;
  }
};

constexpr const char* kManifestName = "manifest.json";
constexpr const char* kLatestName = "latest";

std::string checkpoint_name(int64_t step, int suffix);
// True for "step-<digits>" and "step-<digits>.<digits>".
bool parse_checkpoint_name(const std::string& name, int64_t* step, int* suffix);
// Checkpoint directories under dir, oldest first (empty if dir is missing).
std::vector<CatalogEntry> scan_catalog(const std::string& dir);
// The name `latest` holds, or "" when missing or not a checkpoint name.
std::string read_latest(const std::string& dir);

}  // namespace ckpt
}  // namespace tutti
