// The once layout's arithmetic in one process: the cuts of the replicated
// stream, the election of writers over a simulated job of W ranks (each
// rank's Election, the all-reduce replaced by an element-wise MAX), and the
// manifest index (round trip, and the corruptions its parser must refuse).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "checkpoint/election.h"
#include "checkpoint/manifest.h"
#include "checkpoint/manifest_index.h"
#include "checkpoint/snapshot.h"
#include "checkpoint/untrusted_json.h"
#include "common/test_util.h"

namespace tutti {
namespace ckpt {
namespace {

TEST(CutStream, ClosedForm) {
  // 16 bytes in 4 ranges of 4: tensor 0 (5 x 2 bytes) -> ranks 0, 1, 2;
  // tensor 1 is empty; tensor 2 (3 x 2 bytes) starts inside range 2.
  const auto cuts = cut_stream({10, 0, 6}, {2, 1, 2}, 4, 4);
  const std::vector<std::vector<uint64_t>> want = {
      {0, 0, 0, 2}, {0, 1, 2, 2}, {0, 2, 4, 1}, {2, 2, 0, 1}, {2, 3, 1, 2}};
  ASSERT_EQ(cuts.size(), want.size());
  for (size_t i = 0; i < cuts.size(); ++i)
    EXPECT_EQ((std::vector<uint64_t>{cuts[i].tensor, static_cast<uint64_t>(cuts[i].writer),
                                     cuts[i].first, cuts[i].count}),
              want[i])
        << "cut " << i;
}

TEST(CutStream, SmallStateLandsOnRankZeroAndRangesSpreadOverRanks) {
  for (const auto& c : cut_stream({100, 28}, {4, 4}, 64, 1 << 20)) EXPECT_EQ(c.writer, 0);
  // 8 MiB in 1 MiB chunks over 32 ranks: 8 ranges, written by ranks 0, 4, ..., 28.
  std::set<int> writers;
  for (const auto& c : cut_stream({8 << 20}, {4}, 32, 1 << 20)) writers.insert(c.writer);
  EXPECT_EQ(writers, (std::set<int>{0, 4, 8, 12, 16, 20, 24, 28}));
}

// Every element of every tensor is cut exactly once, and no writer gets
// more than its share plus one element per tensor it touches.
TEST(CutStream, TilesEveryTensorExactlyOnce) {
  uint64_t seed = 12345;
  auto next = [&] { return seed = seed * 6364136223846793005ull + 1442695040888963407ull; };
  for (int round = 0; round < 200; ++round) {
    const int world = 1 + static_cast<int>(next() % 13);
    const size_t n = 1 + next() % 6;
    std::vector<uint64_t> bytes, elem;
    uint64_t total = 0;
    for (size_t t = 0; t < n; ++t) {
      const uint64_t e = uint64_t{1} << (next() % 4);
      bytes.push_back(e * (next() % 50));
      elem.push_back(e);
      total += bytes.back();
    }
    const uint64_t chunk = 1 + next() % 64;
    std::vector<std::vector<int>> owner(n);
    for (size_t t = 0; t < n; ++t) owner[t].assign(bytes[t] / elem[t], -1);
    std::map<int, uint64_t> load;
    for (const auto& c : cut_stream(bytes, elem, world, chunk)) {
      ASSERT_GE(c.writer, 0);
      ASSERT_LT(c.writer, world);
      for (uint64_t i = c.first; i < c.first + c.count; ++i) {
        ASSERT_EQ(owner[c.tensor][i], -1) << "element cut twice";
        owner[c.tensor][i] = c.writer;
      }
      load[c.writer] += c.count * elem[c.tensor];
    }
    for (size_t t = 0; t < n; ++t)
      for (int o : owner[t]) ASSERT_NE(o, -1) << "element never cut";
    const uint64_t ranges = std::max<uint64_t>(1, std::min<uint64_t>(world, total / chunk));
    for (const auto& kv : load) EXPECT_LE(kv.second, total / ranges + 8 * n) << "round " << round;
  }
}

// A simulated job: each rank's state, Election, and the MAX all-reduces.
struct Job {
  std::vector<StateDict> states;
  std::vector<std::vector<float>> storage;  // owns the tensors' memory
  std::vector<std::vector<Placement>> placements;
  std::vector<std::vector<WriteItem>> items;
  std::vector<std::vector<std::string>> divergent;
  std::vector<bool> agreed;
};

std::vector<int64_t> max_of(const std::vector<std::vector<int64_t>>& words) {
  std::vector<int64_t> out = words.at(0);
  for (const auto& w : words) {
    EXPECT_EQ(w.size(), out.size());
    for (size_t i = 0; i < out.size() && i < w.size(); ++i) out[i] = std::max(out[i], w[i]);
  }
  return out;
}

void elect(Job& job, uint64_t chunk) {
  const int world = static_cast<int>(job.states.size());
  ElectionConfig cfg;
  cfg.chunk_bytes = chunk;
  std::vector<std::unique_ptr<Election>> e;
  std::vector<std::vector<int64_t>> w1, w2;
  job.placements.reserve(static_cast<size_t>(world));  // each Election keeps a reference
  for (int r = 0; r < world; ++r) {
    job.placements.push_back(describe_state(job.states[r], 1));
    e.push_back(std::make_unique<Election>(job.states[r], job.placements[r], cfg, r, world));
    w1.push_back(e[r]->catalog_words(false));
  }
  const std::vector<int64_t> r1 = max_of(w1);
  for (int r = 0; r < world; ++r) {
    job.agreed.push_back(e[r]->catalogs_agree(r1));
    std::vector<uint64_t> digests;
    for (size_t i : e[r]->digest_sources()) {
      const Tensor& t = job.states[r][i].tensor;
      uint64_t h = 1469598103934665603ull;
      for (size_t b = 0; b < t.nbytes(); ++b)
        h = (h ^ static_cast<const unsigned char*>(t.data())[b]) * 1099511628211ull;
      digests.push_back(h);
    }
    w2.push_back(e[r]->slot_words(digests));
  }
  // As in save(): the second all-reduce runs only when the catalogs agree.
  const std::vector<int64_t> r2 = job.agreed[0] ? max_of(w2) : std::vector<int64_t>{};
  for (int r = 0; r < world; ++r) {
    if (!job.agreed[r]) e[r]->set_fallback("catalogs differ");
    job.items.push_back(e[r]->decide(job.agreed[r] ? r2 : std::vector<int64_t>{}));
    job.divergent.push_back(e[r]->divergent());
  }
}

// Elements of tensor `name` written by each rank: global flat index -> writers.
std::map<uint64_t, std::vector<int>> writers_of(const Job& job, const std::string& name) {
  std::map<uint64_t, std::vector<int>> out;
  for (size_t r = 0; r < job.items.size(); ++r)
    for (const WriteItem& it : job.items[r]) {
      if (job.states[r][it.src].name != name) continue;
      for (const Run& run : placement_runs(it.placement))
        for (uint64_t g = run.begin; g < run.begin + run.len; ++g)
          out[g].push_back(static_cast<int>(r));
    }
  return out;
}

NamedTensor tensor(Job& job, const std::string& name, std::vector<float> v, ShardInfo s = {}) {
  job.storage.push_back(std::move(v));
  std::vector<float>& b = job.storage.back();
  return {name, Tensor(b.data(), DType::kFloat32, Shape{static_cast<int64_t>(b.size())}), s};
}

// Replicated tensors with the same values on W ranks: every element is
// written by exactly one rank; 4 KiB chunks spread them.  A tensor whose
// values differ on one rank is written by every rank.  TP pieces (dim 0,
// 2 parts) replicated over W/2 ranks: each piece by exactly one holder.
TEST(Election, SimulatedJobsWriteEachElementOnce) {
  for (int world : {1, 2, 3, 4, 8, 16}) {
    SCOPED_TRACE("world " + std::to_string(world));
    Job job;
    job.storage.reserve(64 * 5);
    for (int r = 0; r < world; ++r) {
      StateDict st;
      std::vector<float> big(3000), small(5), odd(7);
      for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i);
      for (size_t i = 0; i < odd.size(); ++i) odd[i] = static_cast<float>(r == world - 1 ? 100 + i : i);
      st.push_back(tensor(job, "big", big));
      st.push_back(tensor(job, "small", small));
      st.push_back(tensor(job, "odd", odd));
      ShardInfo tp;
      tp.global_shape = {4};
      tp.dim = 0;
      tp.offset = (r % 2) * 2;
      st.push_back(tensor(job, "tp", {static_cast<float>(r % 2), 1}, tp));
      ShardInfo fl;
      fl.global_shape = {static_cast<int64_t>(world) * 3};
      fl.flat = true;
      fl.offset = r * 3;
      st.push_back(tensor(job, "zero", {1, 2, 3}, fl));
      job.states.push_back(std::move(st));
    }
    elect(job, 4096);
    for (bool a : job.agreed) EXPECT_TRUE(a);
    for (const char* name : {"big", "small", "zero"}) {
      const auto w = writers_of(job, name);
      for (const auto& kv : w) EXPECT_EQ(kv.second.size(), 1u) << name << " element " << kv.first;
    }
    EXPECT_EQ(writers_of(job, "big").size(), 3000u);
    EXPECT_EQ(writers_of(job, "zero").size(), static_cast<size_t>(world) * 3);
    std::set<int> big_writers;
    for (const auto& kv : writers_of(job, "big")) big_writers.insert(kv.second[0]);
    // 12,000 + 20 replicated bytes in 4 KiB chunks: min(W, 2) ranges.
    EXPECT_EQ(big_writers.size(), static_cast<size_t>(std::min(world, 2)));
    const auto tp = writers_of(job, "tp");
    ASSERT_EQ(tp.size(), static_cast<size_t>(std::min(world, 2) * 2));
    for (const auto& kv : tp) {
      ASSERT_EQ(kv.second.size(), 1u) << "tp element " << kv.first;
      EXPECT_EQ(kv.second[0] % 2, static_cast<int>(kv.first / 2)) << "written by a holder";
    }
    const auto odd = writers_of(job, "odd");
    for (const auto& kv : odd)
      EXPECT_EQ(kv.second.size(), static_cast<size_t>(world)) << "odd element " << kv.first;
    EXPECT_EQ(job.divergent[0], world > 1 ? std::vector<std::string>{"odd"}
                                          : std::vector<std::string>{});
  }
}

// Ranks whose catalogs differ fall back to the per-rank layout together.
TEST(Election, DifferentCatalogsWriteEverything) {
  Job job;
  job.storage.reserve(8);
  for (int r = 0; r < 3; ++r) {
    StateDict st;
    st.push_back(tensor(job, "w", {1, 2, 3}));
    if (r == 1) st.push_back(tensor(job, "extra", {4}));
    job.states.push_back(std::move(st));
  }
  elect(job, 4096);
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(job.agreed[r]);
    EXPECT_EQ(job.items[r].size(), job.states[r].size()) << "rank " << r << " writes all";
  }
}

// The index survives its JSON and refuses overlaps, gaps, a piece in a shard
// the manifest does not list, and a placement that does not fit its bytes.
TEST(ManifestIndex, RoundTripAndCorruptions) {
  auto piece = [](const std::string& name, std::vector<int64_t> local, ShardInfo s, uint64_t b) {
    StoredTensor t;
    t.name = name;
    t.placement = make_placement(local, s, ErrorCode::kInvalidArgument, name);
    t.begin = b;
    t.end = b + 4 * static_cast<uint64_t>(local.empty() ? 1 : local[0] * (local.size() > 1 ? local[1] : 1));
    t.xxh64 = b + 1;
    return t;
  };
  ShardInfo f0, f1, d1;
  f0.global_shape = f1.global_shape = {6};
  f0.flat = f1.flat = true;
  f1.offset = 4;
  d1.global_shape = {2, 4};
  d1.dim = 1;
  d1.offset = 2;
  ShardInfo d0 = d1;
  d0.offset = 0;
  TensorIndex idx;
  add_piece(&idx, 0, piece("a", {4}, f0, 0));
  add_piece(&idx, 0, piece("m", {2, 2}, d0, 16));
  add_piece(&idx, 1, piece("a", {2}, f1, 0));
  add_piece(&idx, 1, piece("m", {2, 2}, d1, 8));
  add_piece(&idx, 1, piece("s", {}, ShardInfo{}, 24));
  finish_index(&idx);
  const std::vector<ShardExtent> shards = {{0, 2, 32}, {1, 3, 28}};
  const nlohmann::json j = index_to_json(idx);
  const TensorIndex back = parse_index(j, shards, "m.json");
  EXPECT_EQ(index_to_json(back), j);
  EXPECT_TRUE(stored_once(back.at("a")));
  auto refuses = [&](const std::string& why, nlohmann::json bad, std::vector<ShardExtent> sh) {
    try {
      parse_index(bad, sh, "m.json");
      ADD_FAILURE() << why << ": accepted " << bad.dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << why << ": " << e.what();
    }
  };
  nlohmann::json gap = j;
  gap["a"]["pieces"][1][4] = {{"flat", 3}};  // [3, 5): element 5 uncovered, 3 twice
  refuses("gap", gap, shards);
  nlohmann::json unlisted = j;
  unlisted["s"]["pieces"][0][0] = 2;
  refuses("unlisted shard", unlisted, shards);
  nlohmann::json misfit = j;
  misfit["m"]["pieces"][0][4] = {{"dim", 1}, {"offset", 0}, {"extent", 3}};
  refuses("placement larger than its bytes", misfit, shards);
  refuses("tiling", j, {{0, 2, 32}, {1, 3, 40}});
  nlohmann::json overlap = j;
  overlap["s"]["pieces"][0][1] = 20;
  overlap["s"]["pieces"][0][2] = 24;
  refuses("overlapping bytes", overlap, shards);
  TensorIndex uncovered;
  add_piece(&uncovered, 0, piece("a", {4}, f0, 0));
  EXPECT_THROW(finish_index(&uncovered), Error) << "a save whose pieces leave a gap";
}

}  // namespace
}  // namespace ckpt
}  // namespace tutti
