// Deterministic fuzzing for every build: runs the fuzz targets over the
// seed corpus and over a fixed number of mutations of each seed (bit flips,
// byte overwrites with interesting values, truncations, duplicated and
// deleted ranges, header-length edits, JSON token splices).  ctest runs it
// with gcc and AddressSanitizer; libFuzzer (clang) explores further.
//
//   fuzz_replay SAFETENSORS_CORPUS_DIR MANIFEST_CORPUS_DIR [MUTATIONS_PER_SEED]
#include <dirent.h>

#include <algorithm>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard_index.h"
#include "fuzz_targets.h"

namespace {

using Bytes = std::string;

struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  size_t below(size_t n) { return n ? static_cast<size_t>(next() % n) : 0; }
};

std::vector<Bytes> read_dir(const std::string& dir) {
  std::vector<Bytes> out;
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  std::vector<std::string> names;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const auto& n : names) {
    std::ifstream in(dir + "/" + n, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    out.push_back(ss.str());
  }
  return out;
}

// A tutti shard built in memory, so the replay never depends on the corpus
// alone.
Bytes built_shard() {
  using namespace tutti;
  std::vector<ckpt::StoredTensor> ts(3);
  ShardInfo split;
  split.global_shape = {4, 2};
  split.dim = 0;
  split.offset = 2;
  ShardInfo flat;
  flat.global_shape = {9};
  flat.flat = true;
  flat.offset = 3;
  ts[0].name = "w";
  ts[0].placement = ckpt::make_placement({2, 2}, split, ErrorCode::kInvalidArgument, "w");
  ts[1].name = "m";
  ts[1].placement = ckpt::make_placement({5}, flat, ErrorCode::kInvalidArgument, "m");
  ts[2].name = "s";
  ts[2].dtype = DType::kInt64;
  ts[2].placement = ckpt::make_placement({}, ShardInfo{}, ErrorCode::kInvalidArgument, "s");
  std::vector<ckpt::StEntry> entries;
  uint64_t off = 0;
  for (auto& t : ts) {
    const uint64_t n = ckpt::checked_numel(t.placement.local_shape, "x") * dtype_size(t.dtype);
    t.begin = off;
    t.end = off + n;
    off += n;
    t.xxh64 = 0x1234;
    entries.push_back({t.name, t.dtype, t.placement.local_shape, t.begin, t.end});
  }
  return ckpt::build_safetensors_header(entries, ckpt::encode_shard_metadata(0, 2, 7, ts)) +
         Bytes(static_cast<size_t>(off), '\x01');
}

const char* kTokens[] = {"{", "}", "[", "]", ",", ":", "\"", "\\", "-1", "1e309",
                         "18446744073709551616", "\"__metadata__\"", "\"dtype\"",
                         "\"F32\"", "\"BF16\"", "null", "true", "[[[[[[[[", "\"\\u0000\"",
                         "\"data_offsets\":[0,0]", "\"shape\":[]", "\xff\xfe"};

Bytes mutate(const Bytes& in, Rng& rng) {
  Bytes b = in;
  const int edits = 1 + static_cast<int>(rng.below(4));
  for (int k = 0; k < edits; ++k) {
    switch (rng.below(8)) {
      case 0:  // bit flip
        if (!b.empty()) b[rng.below(b.size())] ^= static_cast<char>(1u << rng.below(8));
        break;
      case 1: {  // interesting byte
        static const unsigned char v[] = {0, 1, 0x7f, 0x80, 0xff, '0', '9', '"', '{', '['};
        if (!b.empty()) b[rng.below(b.size())] = static_cast<char>(v[rng.below(sizeof(v))]);
        break;
      }
      case 2:  // truncate
        b.resize(rng.below(b.size() + 1));
        break;
      case 3: {  // delete a range
        const size_t p = rng.below(b.size() + 1);
        b.erase(p, rng.below(b.size() - p + 1));
        break;
      }
      case 4: {  // duplicate a range
        const size_t p = rng.below(b.size() + 1);
        const size_t n = rng.below(std::min<size_t>(64, b.size() - p) + 1);
        b.insert(rng.below(b.size() + 1), b.substr(p, n));
        break;
      }
      case 5: {  // edit the 8-byte header length
        if (b.size() >= 8) {
          uint64_t n = 0;
          for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(b[i])) << (8 * i);
          const uint64_t choices[] = {n + 1, n - 1, n * 2, 0, ~0ull, 1ull << 63, b.size(), b.size() - 8};
          n = choices[rng.below(8)];
          for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((n >> (8 * i)) & 0xff);
        }
        break;
      }
      case 6:  // splice a JSON token
        b.insert(rng.below(b.size() + 1), kTokens[rng.below(sizeof(kTokens) / sizeof(*kTokens))]);
        break;
      case 7: {  // change a digit
        for (int tries = 0; tries < 16 && !b.empty(); ++tries) {
          const size_t p = rng.below(b.size());
          if (b[p] >= '0' && b[p] <= '9') {
            b[p] = static_cast<char>('0' + rng.below(10));
            break;
          }
        }
        break;
      }
    }
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: fuzz_replay SAFETENSORS_DIR MANIFEST_DIR [MUTATIONS]\n");
    return 2;
  }
  const int per_seed = argc > 3 ? std::atoi(argv[3]) : 4000;
  std::vector<Bytes> st = read_dir(argv[1]);
  std::vector<Bytes> mf = read_dir(argv[2]);
  if (st.empty() || mf.empty()) {
    std::fprintf(stderr, "empty corpus in %s or %s\n", argv[1], argv[2]);
    return 2;
  }
  st.push_back(built_shard());
  size_t runs = 0, parsed = 0;
  for (int which = 0; which < 2; ++which) {
    const auto& seeds = which == 0 ? st : mf;
    auto one = which == 0 ? tutti::fuzz::safetensors_one : tutti::fuzz::manifest_one;
    for (size_t s = 0; s < seeds.size(); ++s) {
      // Exactly-sized heap copies (no terminating NUL after the bytes, as
      // with libFuzzer), so that any read past the input is caught.
      const std::vector<uint8_t> seed(seeds[s].begin(), seeds[s].end());
      if (!one(seed.data(), seed.size())) {
        std::fprintf(stderr, "seed %zu of corpus %d does not parse: the corpus is stale\n", s, which);
        return 1;
      }
      Rng rng{0x9e3779b97f4a7c15ull ^ (s * 1000003u + static_cast<uint64_t>(which))};
      for (int i = 0; i < per_seed; ++i) {
        const Bytes m = mutate(seeds[s], rng);
        const std::vector<uint8_t> input(m.begin(), m.end());
        parsed += static_cast<size_t>(one(input.data(), input.size()));
        ++runs;
      }
    }
  }
  std::printf("PASS: %zu mutated inputs, %zu still parsed, none crashed\n", runs, parsed);
  return 0;
}
