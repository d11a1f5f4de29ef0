#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>

#include "checkpoint/untrusted_json.h"

#include "core/check.h"
#include "tutti/tensor.h"
#include "tutti/config.h"

namespace tutti {
namespace ckpt {
namespace {

using json = nlohmann::json;

constexpr int kMaxNesting = 3;  // root -> tensor -> shape / data_offsets

const DType kAllDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                            DType::kFloat64, DType::kInt8,    DType::kUInt8,
                            DType::kInt32,   DType::kInt64};

uint64_t as_u64(const json& v, const std::string& what, const std::string& name,
                const char* field) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    TUTTI_THROW(kCorrupt, "'", what, "': tensor '", name, "': ", field,
                " holds ", v.dump(), " (expected a non-negative integer)");
  return v.get<uint64_t>();
}

StEntry parse_entry(const std::string& name, const json& v, const std::string& what) {
  if (!v.is_object())
    TUTTI_THROW(kCorrupt, "'", what, "': tensor '", name,
                "' is not a JSON object");
  StEntry e;
  e.name = name;
  for (auto it = v.begin(); it != v.end(); ++it)
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
      TUTTI_THROW(kCorrupt, "'", what, "': tensor '", name, "' has unknown field '",
                  it.key(), "'");
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string() ||
      !dtype_from_safetensors(dt->get<std::string>(), &e.dtype))
    TUTTI_THROW(kCorrupt, "'", what, "': tensor '", name, "' has dtype ",
                dt == v.end() ? "(missing)" : dt->dump(),
                " (expected one of F32 F16 BF16 F64 I8 U8 I32 I64)");
  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array() ||
      sh->size() > static_cast<size_t>(Shape::kMaxDims))
    TUTTI_THROW(kCorrupt, "'", what, "': tensor '", name, "' has shape ",
                sh == v.end() ? "(missing)" : sh->dump(),
                " (expected an array of at most ", Shape::kMaxDims,
                " non-negative integers)");
  for (const auto& d : *sh) {
    const uint64_t x = as_u64(d, what, name, "shape");
    if (x > static_cast<uint64_t>(INT64_MAX))
      TUTTI_THROW(kCorrupt, "'", what, "': tensor '", name, "': dimension ", x,
                  " is too large");
    e.shape.push_back(static_cast<int64_t>(x));
  }
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2)
    TUTTI_THROW(kCorrupt, "'", what, "': tensor '", name, "' has data_offsets ",
                off == v.end() ? "(missing)" : off->dump(),
                " (expected [begin, end])");
  e.begin = as_u64((*off)[0], what, name, "data_offsets");
  e.end = as_u64((*off)[1], what, name, "data_offsets");
  if (e.end < e.begin)
    TUTTI_THROW(kCorrupt, "'", what, "': tensor '", name, "' has data_offsets [",
                e.begin, ", ", e.end, "] with end before begin");
  const uint64_t numel = checked_numel(e.shape, what + "': tensor '" + name);
  const uint64_t es = dtype_size(e.dtype);
  if (numel > UINT64_MAX / es || numel * es != e.end - e.begin)
    TUTTI_THROW(kCorrupt, "'", what, "': tensor '", name, "' is ",
                dtype_safetensors_name(e.dtype), " with ", numel,
                " elements but data_offsets [", e.begin, ", ", e.end, "] span ",
                e.end - e.begin, " bytes");
  return e;
}

}  // namespace

bool dtype_from_safetensors(const std::string& s, DType* out) {
  for (DType d : kAllDTypes)
    if (s == dtype_safetensors_name(d)) {
      *out = d;
      return true;
    }
  return false;
}

uint64_t checked_numel(const std::vector<int64_t>& shape, const std::string& what) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) TUTTI_THROW(kCorrupt, "'", what, "': negative dimension ", d);
    const uint64_t u = static_cast<uint64_t>(d);
    if (u != 0 && n > UINT64_MAX / u)
      TUTTI_THROW(kCorrupt, "'", what, "': the element count of the shape overflows");
    n *= u;
  }
  return n;
}

std::string build_safetensors_header(
    const std::vector<StEntry>& entries,
    const std::map<std::string, std::string>& metadata, size_t align) {
  json root = json::object();
  for (const auto& e : entries) {
    TUTTI_ARG_CHECK(e.name != "__metadata__" && !e.name.empty(),
                    "tensor name '", e.name, "' is reserved in safetensors");
    TUTTI_ARG_CHECK(!root.contains(e.name), "duplicate tensor name '", e.name, "'");
    root[e.name] = {{"dtype", dtype_safetensors_name(e.dtype)},
                    {"shape", e.shape},
                    {"data_offsets", {e.begin, e.end}}};
  }
  if (!metadata.empty()) root["__metadata__"] = metadata;
  std::string text;
  try {
    text = root.dump();
  } catch (const json::exception& ex) {
    TUTTI_THROW(kInvalidArgument, "a tensor name or metadata value is not "
                "valid UTF-8: ", ex.what());
  }
  // Pad so that 8 + N is a multiple of `align`: the data region is aligned.
  TUTTI_CHECK(align >= 8 && align % 8 == 0);
  text.append((align - (8 + text.size()) % align) % align, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

uint64_t parse_header_length(const unsigned char prefix[8], uint64_t file_size,
                             uint64_t max_header_bytes, const std::string& what) {
  if (file_size < 8)
    TUTTI_THROW(kCorrupt, "'", what, "' has ", file_size,
                " bytes, fewer than the 8-byte safetensors header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(prefix[i]) << (8 * i);
  if (n > max_header_bytes)
    TUTTI_THROW(kCorrupt, "'", what, "': safetensors header length ", n,
                " exceeds the cap of ", max_header_bytes,
                " bytes (TUTTI_CKPT_MAX_HEADER_MB)");
  if (n < 2 || n > file_size - 8)
    TUTTI_THROW(kCorrupt, "'", what, "': safetensors header length ", n,
                " does not fit a file of ", file_size, " bytes");
  return n;
}

StHeader parse_header_json(const char* text, size_t n, uint64_t header_len,
                           uint64_t data_bytes, const std::string& what) {
  if (n == 0 || text[0] != '{')
    TUTTI_THROW(kCorrupt, "'", what, "': safetensors header does not start with '{'");
  if (std::memchr(text, '\0', n))
    TUTTI_THROW(kCorrupt, "'", what, "': safetensors header contains a NUL byte");
  const json root = parse_untrusted_json(text, n, kMaxNesting, what);
  if (!root.is_object())
    TUTTI_THROW(kCorrupt, "'", what, "': safetensors header is not a JSON object");
  StHeader h;
  h.header_len = header_len;
  h.data_bytes = data_bytes;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object())
        TUTTI_THROW(kCorrupt, "'", what, "': __metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          TUTTI_THROW(kCorrupt, "'", what, "': __metadata__ value of '", m.key(),
                      "' is not a string");
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    if (it.key().empty())
      TUTTI_THROW(kCorrupt, "'", what, "': a tensor has an empty name");
    h.entries.push_back(parse_entry(it.key(), *it, what));
  }
  // A total order (empty tensors share offsets): the index's order too.
  std::sort(h.entries.begin(), h.entries.end(), [](const StEntry& a, const StEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    return a.end != b.end ? a.end < b.end : a.name < b.name;
  });
  uint64_t expect = 0;
  for (const auto& e : h.entries) {
    if (e.begin != expect)
      TUTTI_THROW(kCorrupt, "'", what, "': tensor '", e.name, "' starts at byte ",
                  e.begin, " of the data but the previous tensor ends at ", expect,
                  " (tensors must tile the data without holes or overlap)");
    expect = e.end;
  }
  if (expect != data_bytes)
    TUTTI_THROW(kCorrupt, "'", what, "': the tensors cover ", expect,
                " bytes but the file holds ", data_bytes,
                " bytes of data (truncated or trailing bytes)");
  return h;
}

StHeader parse_safetensors(const void* data, size_t size,
                           uint64_t max_header_bytes, const std::string& what) {
  const auto* p = static_cast<const unsigned char*>(data);
  const uint64_t n = parse_header_length(p, size, max_header_bytes, what);
  return parse_header_json(reinterpret_cast<const char*>(p + 8),
                           static_cast<size_t>(n), n, size - 8 - n, what);
}

uint64_t max_header_bytes() {
  const int64_t mb = config::get_int("TUTTI_CKPT_MAX_HEADER_MB");
  TUTTI_ARG_CHECK(mb > 0 && mb <= 4096, "TUTTI_CKPT_MAX_HEADER_MB=", mb,
                  " (expected 1..4096)");
  return static_cast<uint64_t>(mb) << 20;
}

}  // namespace ckpt
}  // namespace tutti
