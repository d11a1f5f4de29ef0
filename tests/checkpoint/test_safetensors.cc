// The safetensors writer and the untrusted-input parser.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/shard_index.h"
#include "tutti/config.h"
#include "tutti/error.h"

namespace tutti {
namespace ckpt {
namespace {

std::string with_length(const std::string& json, const std::string& data = "") {
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json + data;
}

// Expects kCorrupt whose message contains `needle`.
void expect_corrupt(const std::string& file, const std::string& needle,
                    uint64_t cap = 1 << 20) {
  try {
    parse_safetensors(file.data(), file.size(), cap, "test.safetensors");
    ADD_FAILURE() << "accepted: " << file.substr(8, 200);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' lacks '" << needle << "'";
    EXPECT_NE(std::string(e.what()).find("test.safetensors"), std::string::npos)
        << "message does not name the file: " << e.what();
  }
}

TEST(Safetensors, RoundTripEveryDtypeAndShape) {
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                          DType::kFloat64, DType::kInt8,    DType::kUInt8,
                          DType::kInt32,   DType::kInt64};
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {1}, {7}, {3, 5}, {2, 0, 4},
                                                    {1, 1, 1, 1, 1, 1, 1, 3}};
  std::vector<StEntry> entries;
  uint64_t off = 0;
  int k = 0;
  for (DType d : dtypes)
    for (const auto& s : shapes) {
      uint64_t n = 1;
      for (auto x : s) n *= static_cast<uint64_t>(x);
      StEntry e{"t" + std::to_string(k++) + "/é", d, s, off, off + n * dtype_size(d)};
      off = e.end;
      entries.push_back(e);
    }
  std::map<std::string, std::string> meta = {{"a", "1"}, {"json", "{\"x\": [1, 2]}"}};
  const std::string header = build_safetensors_header(entries, meta);
  EXPECT_EQ(header.size() % 8, 0u) << "data region must start 8-aligned";
  const std::string file = header + std::string(static_cast<size_t>(off), 'x');
  const StHeader h = parse_safetensors(file.data(), file.size(), 1 << 20, "rt");
  ASSERT_EQ(h.entries.size(), entries.size());
  EXPECT_EQ(h.metadata, meta);
  EXPECT_EQ(h.data_start(), header.size());
  EXPECT_EQ(h.data_bytes, off);
  for (const auto& e : entries) {
    bool found = false;
    for (const auto& g : h.entries)
      if (g.name == e.name) {
        found = true;
        EXPECT_EQ(g.dtype, e.dtype);
        EXPECT_EQ(g.shape, e.shape);
        EXPECT_EQ(g.begin, e.begin);
        EXPECT_EQ(g.end, e.end);
      }
    EXPECT_TRUE(found) << e.name;
  }
}

TEST(Safetensors, EmptyFileWithoutTensors) {
  const std::string file = build_safetensors_header({}, {});
  const StHeader h = parse_safetensors(file.data(), file.size(), 1 << 20, "empty");
  EXPECT_TRUE(h.entries.empty());
  EXPECT_EQ(h.data_bytes, 0u);
}

TEST(Safetensors, RejectsBadLengthPrefix) {
  expect_corrupt(std::string(5, '\0'), "fewer than the 8-byte");
  std::string f = with_length("{}");
  f[0] = 100;  // claims 100 bytes of header
  expect_corrupt(f, "does not fit a file");
  std::string big(8, '\0');
  big[7] = static_cast<char>(0x80);  // 2^63
  expect_corrupt(big + "{}", "exceeds the cap");
  expect_corrupt(with_length(std::string(2000, ' ')), "exceeds the cap", 1000);
}

TEST(Safetensors, RejectsMalformedHeaders) {
  const char* f32 = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  struct Case {
    std::string json, data, needle;
  } cases[] = {
      {"not json", "", "does not start with '{'"},
      {"{\"a\": ", "", "invalid JSON"},
      {"[1, 2]", "", "does not start with '{'"},
      {"{\"a\": 1}", "", "not a JSON object"},
      {R"({"a":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", "x", "dtype"},
      {R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "xxxx", "non-negative"},
      {R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "xxxx", "non-negative"},
      {R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", "xxxx", "at most"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "xxxx", "data_offsets"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "xxxx", "end before begin"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "xxxxxxxx", "span 8 bytes"},
      {R"({"a":{"dtype":"F64","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", "xxxxxxxx", "overflows"},
      {R"({"a":{"dtype":"U8","shape":[4611686018427387904],"data_offsets":[0,4611686018427387904]}})", "", "cover"},
      {std::string("{\"a\":{") + f32 + "},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}",
       std::string(16, 'x'), "without holes"},
      {std::string("{\"a\":{") + f32 + "},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
       std::string(8, 'x'), "without holes"},
      {std::string("{\"a\":{") + f32 + "}}", std::string(12, 'x'), "trailing"},
      {std::string("{\"a\":{") + f32 + "}}", std::string(4, 'x'), "cover"},
      {std::string("{\"a\":{") + f32 + "},\"a\":{" + f32 + "}}", std::string(8, 'x'), "repeats the key 'a'"},
      {R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(8, 'x'), "repeats the key 'dtype'"},
      {std::string("{\"a\":{") + f32 + ",\"extra\":1}}", std::string(8, 'x'), "unknown field"},
      {std::string("{\"a\":{") + f32 + "},\"__metadata__\":{\"k\":1}}", std::string(8, 'x'), "not a string"},
      {std::string("{\"a\":{") + f32 + "},\"__metadata__\":[]}", std::string(8, 'x'), "not an object"},
      {"{\"a\":[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}", "", "nests deeper"},
      {std::string("{\"\":{") + f32 + "}}", std::string(8, 'x'), "empty name"},
      {std::string("{\"a\xff\":{") + f32 + "}}", std::string(8, 'x'), "invalid JSON"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.json);
    expect_corrupt(with_length(c.json, c.data), c.needle);
  }
  std::string nul = with_length(std::string("{\"a\":{") + f32 + "}}", std::string(8, 'x'));
  nul[10] = '\0';
  expect_corrupt(nul, "NUL");
}

TEST(Safetensors, DeepNestingIsRejectedBeforeParsing) {
  // Ten million brackets: a recursive parser would overflow the stack.
  std::string deep = "{\"a\":" + std::string(10000000, '[');
  expect_corrupt(with_length(deep), "nests deeper", 64 << 20);
}

TEST(Safetensors, HeaderCapFromSetting) {
  setenv("TUTTI_CKPT_MAX_HEADER_MB", "1", 1);
  config::reload();
  EXPECT_EQ(max_header_bytes(), 1u << 20);
  setenv("TUTTI_CKPT_MAX_HEADER_MB", "0", 1);
  config::reload();
  EXPECT_THROW(max_header_bytes(), Error);
  unsetenv("TUTTI_CKPT_MAX_HEADER_MB");
  config::reload();
  EXPECT_EQ(max_header_bytes(), 100u << 20);
}

TEST(ShardIndex, TuttiMetadataRoundTripAndValidation) {
  StoredTensor t;
  t.name = "model/w";
  t.dtype = DType::kFloat32;
  ShardInfo info;
  info.global_shape = {4, 3};
  info.dim = 0;
  info.offset = 2;
  info.group = "tp";
  t.placement = make_placement({2, 3}, info, ErrorCode::kInvalidArgument, "w");
  t.group = "tp";
  t.xxh64 = 0x0123456789abcdefull;
  t.begin = 0;
  t.end = 24;
  auto meta = encode_shard_metadata(1, 2, 7, {t});
  const std::string file =
      build_safetensors_header({{t.name, t.dtype, {2, 3}, 0, 24}}, meta) + std::string(24, 'z');
  const StHeader h = parse_safetensors(file.data(), file.size(), 1 << 20, "s");
  const ShardIndex idx = decode_shard(h, "s", file.size());
  EXPECT_EQ(idx.rank, 1);
  EXPECT_EQ(idx.world_size, 2);
  EXPECT_EQ(idx.step, 7);
  ASSERT_EQ(idx.tensors.size(), 1u);
  EXPECT_EQ(idx.tensors[0].xxh64, t.xxh64);
  EXPECT_EQ(idx.tensors[0].placement.global_shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(idx.tensors[0].placement.offset, 2);
  EXPECT_EQ(idx.tensors[0].group, "tp");

  auto corrupt_meta = [&](std::map<std::string, std::string> m, const std::string& needle) {
    const std::string f =
        build_safetensors_header({{t.name, t.dtype, {2, 3}, 0, 24}}, m) + std::string(24, 'z');
    const StHeader hh = parse_safetensors(f.data(), f.size(), 1 << 20, "s");
    try {
      decode_shard(hh, "s", f.size());
      ADD_FAILURE() << "accepted metadata lacking " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto m = meta;
  m.erase("tutti.rank");
  corrupt_meta(m, "tutti.rank");
  m = meta;
  m["tutti.rank"] = "5";
  corrupt_meta(m, "impossible");
  m = meta;
  m["tutti.tensor.model/w"] =
      R"({"xxh64":"0123456789abcdef","global_shape":[4,3],"dim":0,"offset":3,"flat":false,"group":"tp"})";
  corrupt_meta(m, "outside the global shape");
  m = meta;
  m["tutti.tensor.model/w"] =
      R"({"xxh64":"0123456789ABCDEF","global_shape":[4,3],"dim":0,"offset":2,"flat":false,"group":"tp"})";
  corrupt_meta(m, "hexadecimal");
  m = meta;
  m["tutti.tensor.other"] = meta["tutti.tensor.model/w"];
  corrupt_meta(m, "describes 2 tensors");
}

}  // namespace
}  // namespace ckpt
}  // namespace tutti
