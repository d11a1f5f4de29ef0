#include "checkpoint/untrusted_json.h"

#include <cstring>
#include <set>
#include <vector>

#include "core/check.h"

namespace tutti {
namespace ckpt {
namespace {

using json = nlohmann::json;

void check_nesting(const char* s, size_t n, int max_depth, const std::string& what) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < n; ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth)
        TUTTI_THROW(kCorrupt, "'", what, "': JSON nests deeper than ", max_depth,
                    " levels (at byte ", i, ")");
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
}

}  // namespace

json parse_untrusted_json(const char* text, size_t n, int max_depth,
                          const std::string& what) {
  if (std::memchr(text, '\0', n))
    TUTTI_THROW(kCorrupt, "'", what, "': JSON text contains a NUL byte");
  check_nesting(text, n, max_depth, what);
  // nlohmann keeps the last of repeated keys silently; track each open
  // object's keys through the parser callback instead.
  std::vector<std::set<std::string>> open;
  std::string duplicate;
  auto cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      open.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (ev == json::parse_event_t::key && !open.empty() && parsed.is_string()) {
      if (!open.back().insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json v;
  try {
    v = json::parse(text, text + n, cb, /*allow_exceptions=*/false);
  } catch (const json::exception& e) {
    TUTTI_THROW(kCorrupt, "'", what, "': invalid JSON: ", e.what());
  }
  if (v.is_discarded()) TUTTI_THROW(kCorrupt, "'", what, "': invalid JSON");
  if (!duplicate.empty())
    TUTTI_THROW(kCorrupt, "'", what, "': JSON repeats the key '", duplicate, "'");
  return v;
}

const json& json_field(const json& obj, const char* key, const std::string& what) {
  if (!obj.is_object())
    TUTTI_THROW(kCorrupt, "'", what, "': expected a JSON object, found ",
                obj.type_name());
  auto it = obj.find(key);
  if (it == obj.end()) TUTTI_THROW(kCorrupt, "'", what, "': field '", key, "' is missing");
  return *it;
}

int64_t json_int(const json& obj, const char* key, const std::string& what) {
  const json& v = json_field(obj, key, what);
  if (v.is_number_integer() &&
      (!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)))
    return v.get<int64_t>();
  TUTTI_THROW(kCorrupt, "'", what, "': field '", key, "' holds ", v.dump(),
              " (expected an integer)");
}

uint64_t json_uint(const json& obj, const char* key, const std::string& what) {
  const json& v = json_field(obj, key, what);
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  TUTTI_THROW(kCorrupt, "'", what, "': field '", key, "' holds ", v.dump(),
              " (expected a non-negative integer)");
}

std::string json_string(const json& obj, const char* key, const std::string& what) {
  const json& v = json_field(obj, key, what);
  if (v.is_string()) return v.get<std::string>();
  TUTTI_THROW(kCorrupt, "'", what, "': field '", key, "' holds ", v.dump(),
              " (expected a string)");
}

bool json_bool(const json& obj, const char* key, const std::string& what) {
  const json& v = json_field(obj, key, what);
  if (v.is_boolean()) return v.get<bool>();
  TUTTI_THROW(kCorrupt, "'", what, "': field '", key, "' holds ", v.dump(),
              " (expected true or false)");
}

std::string hex64(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = digits[v & 15];
  return s;
}

uint64_t parse_hex64(const std::string& s, const std::string& what) {
  if (s.size() != 16)
    TUTTI_THROW(kCorrupt, "'", what, "': checksum '", s,
                "' is not 16 hexadecimal digits");
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else TUTTI_THROW(kCorrupt, "'", what, "': checksum '", s,
                     "' is not 16 lower-case hexadecimal digits");
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

}  // namespace ckpt
}  // namespace tutti
