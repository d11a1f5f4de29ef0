// TUTTI_* environment settings, read in one place.
//
// Every setting tutti understands is declared once, with its type, default
// and meaning, in the table in src/core/config.cc; docs/settings.md lists the
// same table (a test keeps the two in step).  Values are parsed on first use
// and cached; a malformed value is an Error(kInvalidArgument) that names the
// variable, the value and what was expected.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/export.h"

namespace tutti {
namespace config {

struct SettingInfo {
  const char* name;           // "TUTTI_TIMEOUT"
  const char* type;           // "int", "float", "bool", "string"
  const char* default_value;  // as it would be written in the environment
  const char* help;           // one sentence
};

// All settings, in documentation order.
TUTTI_API const std::vector<SettingInfo>& all_settings();

// Typed reads.  `name` must be a declared setting (else kInternal).
TUTTI_API int64_t get_int(const char* name);
TUTTI_API double get_double(const char* name);
TUTTI_API bool get_bool(const char* name);
TUTTI_API std::string get_string(const char* name);

// Drops the cache so that the next read sees the current environment.  For
// tests and for Python code that changes os.environ before tutti.init().
TUTTI_API void reload();

// Incremented by every reload(); lets hot paths cache values and refresh
// them only when the environment was re-read.
TUTTI_API uint64_t generation();

}  // namespace config
}  // namespace tutti
