// JSON from files tutti did not necessarily write (checkpoint headers,
// manifests, metadata answers): bounded nesting, duplicate keys rejected,
// invalid UTF-8 rejected, never an exception other than Error(kCorrupt).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace tutti {
namespace ckpt {

// Parses text[0, n).  Nesting deeper than max_depth (objects and arrays), a
// repeated key in any object, or malformed JSON is Error(kCorrupt) naming
// `what`.  The depth is checked by a linear scan before parsing, so no input
// can drive the parser or the value's destructor into deep recursion.
nlohmann::json parse_untrusted_json(const char* text, size_t n, int max_depth,
                                    const std::string& what);
inline nlohmann::json parse_untrusted_json(const std::string& text,
                                           int max_depth,
                                           const std::string& what) {
  return parse_untrusted_json(text.data(), text.size(), max_depth, what);
}

// Typed field access for validated documents: kCorrupt naming `what` and the
// field when it is absent or of another type.
int64_t json_int(const nlohmann::json& obj, const char* key, const std::string& what);
uint64_t json_uint(const nlohmann::json& obj, const char* key, const std::string& what);
std::string json_string(const nlohmann::json& obj, const char* key, const std::string& what);
bool json_bool(const nlohmann::json& obj, const char* key, const std::string& what);
const nlohmann::json& json_field(const nlohmann::json& obj, const char* key,
                                 const std::string& what);

// 16 lower-case hex digits, and back (kCorrupt for anything else).
std::string hex64(uint64_t v);
uint64_t parse_hex64(const std::string& s, const std::string& what);

}  // namespace ckpt
}  // namespace tutti
