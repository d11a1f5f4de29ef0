#include "checkpoint/catalog.h"

#include <algorithm>
#include <cstdio>

#include "checkpoint/file_util.h"
#include "core/check.h"

namespace tutti {
namespace ckpt {
namespace {

bool parse_digits(const std::string& s, size_t b, size_t e, int64_t max, int64_t* out) {
  if (b >= e || e - b > 18) return false;
  int64_t v = 0;
  for (size_t i = b; i < e; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  if (v > max) return false;
  *out = v;
  return true;
}

}  // namespace

std::string checkpoint_name(int64_t step, int suffix) {
  char buf[64];
  if (suffix > 0)
    std::snprintf(buf, sizeof(buf), "step-%08lld.%d", static_cast<long long>(step), suffix);
  else
    std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

bool parse_checkpoint_name(const std::string& name, int64_t* step, int* suffix) {
  if (name.compare(0, 5, "step-") != 0) return false;
  const size_t dot = name.find('.', 5);
  int64_t st = 0, sf = 0;
  if (!parse_digits(name, 5, dot == std::string::npos ? name.size() : dot,
                    INT64_MAX / 10, &st))
    return false;
  if (dot != std::string::npos &&
      (!parse_digits(name, dot + 1, name.size(), 1 << 30, &sf) || sf == 0))
    return false;
  *step = st;
  *suffix = static_cast<int>(sf);
  return true;
}

std::vector<CatalogEntry> scan_catalog(const std::string& dir) {
  std::vector<CatalogEntry> out;
  if (!is_directory(dir)) return out;
  for (const auto& name : list_dir(dir)) {
    CatalogEntry e;
    if (!parse_checkpoint_name(name, &e.step, &e.suffix)) continue;
    const std::string path = join_path(dir, name);
    if (!is_directory(path)) continue;
    e.name = name;
    e.complete = path_exists(join_path(path, kManifestName));
    out.push_back(e);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_latest(const std::string& dir) {
  const std::string path = join_path(dir, kLatestName);
  if (!path_exists(path)) return "";
  try {
    std::string s = read_file(path, 4096);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    int64_t step;
    int suffix;
    return parse_checkpoint_name(s, &step, &suffix) ? s : "";
  } catch (const Error&) {
    return "";
  }
}

}  // namespace ckpt
}  // namespace tutti
