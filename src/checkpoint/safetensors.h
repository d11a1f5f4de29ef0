// The safetensors file layout: an 8-byte little-endian header length N, N
// bytes of JSON header, then the raw tensor bytes.
//
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
//    "__metadata__": {"key": "string value", ...}}
//
// data_offsets are relative to the first byte after the header; the tensors
// tile the data region exactly (no holes, no overlap, nothing after the
// last), as the reference implementation requires, so every byte of a valid
// file is accounted for.  The writer pads the header with spaces so the data
// starts 8-byte aligned.
//
// The parser treats its input as hostile: the header length is capped,
// every offset and size is checked for overflow and against the file, JSON
// nesting is bounded before parsing, duplicate keys are rejected, and
// dtype x shape must equal the byte length.  Every rejection is
// Error(kCorrupt) naming the file (`what`) and the offending entry.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tutti/dtype.h"

namespace tutti {
namespace ckpt {

struct StEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // empty: a scalar (1 element)
  uint64_t begin = 0;          // byte offsets into the data region
  uint64_t end = 0;
};

struct StHeader {
  std::vector<StEntry> entries;  // sorted by (begin, end, name)
  std::map<std::string, std::string> metadata;
  uint64_t header_len = 0;       // N
  uint64_t data_bytes = 0;       // size of the data region
  uint64_t data_start() const { return 8 + header_len; }
};

// "F32" -> kFloat32, ...; false for a name tutti has no dtype for.
bool dtype_from_safetensors(const std::string& name, DType* out);

// Element count of a shape with overflow checks (kCorrupt naming `what`).
uint64_t checked_numel(const std::vector<int64_t>& shape, const std::string& what);

// The 8-byte length prefix plus the JSON header, space-padded so that the
// data region starts at a multiple of `align` (8, or 4096 for direct I/O;
// trailing spaces are valid JSON and the safetensors reference pads the
// same way).  Entries must already have their offsets; names must be valid
// UTF-8 (else kInvalidArgument).
std::string build_safetensors_header(
    const std::vector<StEntry>& entries,
    const std::map<std::string, std::string>& metadata, size_t align = 8);

// Validates the 8-byte prefix against the file size and the cap; returns N.
uint64_t parse_header_length(const unsigned char prefix[8], uint64_t file_size,
                             uint64_t max_header_bytes, const std::string& what);

// Parses and validates the N JSON bytes; data_bytes = file size - 8 - N.
StHeader parse_header_json(const char* json, size_t n, uint64_t header_len,
                           uint64_t data_bytes, const std::string& what);

// The whole file in memory (tests, fuzzing).
StHeader parse_safetensors(const void* data, size_t size,
                           uint64_t max_header_bytes, const std::string& what);

// The configured cap (TUTTI_CKPT_MAX_HEADER_MB) in bytes.
uint64_t max_header_bytes();

}  // namespace ckpt
}  // namespace tutti
