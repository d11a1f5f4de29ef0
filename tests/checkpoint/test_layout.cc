// The once layout end to end on 1-4 ranks: replicated state written once
// (bytes and writers in closed form), TP pieces replicated over DP written by
// one holder, every load bit-exact at any group size with replicated state
// read once per node; the per-rank layout (manifest version 2) and version 1
// manifests still load; a save whose pieces leave a gap publishes nothing;
// failure reports gathered once and capped.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include <nlohmann/json.hpp>

#include "checkpoint/agreement.h"
#include "checkpoint/election.h"
#include "checkpoint/problem_report.h"
#include "ckpt_test_util.h"
#include "common/test_util.h"
#include "tutti/config.h"

namespace tutti {
namespace {

using test::ScratchDir;

// Replicated state, the same on every rank: 600,000 float32 + 100,000
// float64 + an empty int32 + one int64 = 3,200,008 bytes.
struct Model : Stateful {
  std::vector<float> w = std::vector<float>(600000);
  std::vector<double> b = std::vector<double>(100000);
  std::vector<int32_t> e;
  int64_t step = 0;
  static constexpr uint64_t kBytes = 600000 * 4 + 100000 * 8 + 8;
  void fill(int64_t s) {
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>((i * 7 + s) % 1000);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<double>(i) * 0.5 + s;
    step = s;
  }
  void poison() {
    std::fill(w.begin(), w.end(), -1.f);
    std::fill(b.begin(), b.end(), -1.0);
    step = -1;
  }
  bool holds(int64_t s) const {
    Model m;
    m.fill(s);
    return w == m.w && b == m.b && step == s;
  }
  StateDict state_dict() override {
    return {{"w", Tensor::of(w), {}},
            {"b", Tensor::of(b), {}},
            {"e", Tensor(e.data(), DType::kInt32, Shape{0}), {}},
            {"step", Tensor(&step, DType::kInt64, Shape{}), {}}};
  }
};

CheckpointOptions opts(const std::string& dir,
                       CheckpointLayout layout = CheckpointLayout::kOnce) {
  CheckpointOptions o;
  o.dir = dir;
  o.async = false;
  o.timeout_s = 20;
  o.layout = layout;
  return o;
}

// 1 MiB chunks for the duration of a test.
struct SmallChunks {
  SmallChunks() {
    setenv("TUTTI_CKPT_CHUNK_MB", "1", 1);
    config::reload();
  }
  ~SmallChunks() {
    unsetenv("TUTTI_CKPT_CHUNK_MB");
    config::reload();
  }
};

int64_t sum(const ProcessGroupPtr& g, int64_t v) {
  g->allreduce(Tensor::of(&v, 1), ReduceOp::kSum);
  return v;
}

// Saves the Model of `step` on every rank of `w`; returns the tensor bytes
// all ranks wrote together, after checking each rank's state size.
int64_t save_model(const ProcessGroupPtr& w, const std::string& dir, int64_t step,
                   CheckpointLayout layout) {
  Model m;
  m.fill(step);
  CheckpointManager mgr(w, opts(dir, layout));
  mgr.save(step, {{"model", &m}});
  const SaveStats st = mgr.last_save_stats();
  EXPECT_EQ(st.bytes, Model::kBytes);
  return sum(w, static_cast<int64_t>(st.written_bytes));
}

nlohmann::json manifest(const std::string& dir) {
  return nlohmann::json::parse(test::read_text(dir + "/manifest.json"));
}

std::vector<int> shard_ranks(const nlohmann::json& m) {
  std::vector<int> out;
  for (const auto& s : m["shards"]) out.push_back(s["rank"].get<int>());
  return out;
}

std::vector<int> groups_upto(int w) {
  std::set<int> s = {1, 2, 3, w};
  std::vector<int> out;
  for (int x : s)
    if (x <= w) out.push_back(x);
  return out;
}

// 3,200,008 bytes in 1 MiB chunks: 3 ranges, written by ranks k * W / 3
// (all on rank 0 at W = 1); the sum of every rank's written bytes is the
// state's size whatever W.  Every group size loads it bit-exact; a node's
// ranks split the replicated reads, so they open each shard about once
// between them instead of once each.
TEST(OnceLayout, ReplicatedStateIsWrittenOnceAndLoadsAnywhere) {
  SmallChunks chunks;
  auto w = world();
  const int W = w->size();
  ScratchDir tmp(w);
  EXPECT_EQ(save_model(w, tmp.path(), 7, CheckpointLayout::kOnce),
            static_cast<int64_t>(Model::kBytes))
      << "replicated state is written once, not W times";
  w->barrier();
  const auto m = manifest(tmp.sub("step-00000007"));
  EXPECT_EQ(m["version"], 3);
  EXPECT_EQ(m["layout"], "once");
  std::set<int> writers;
  for (int k = 0; k < std::min(W, 3); ++k) writers.insert(k * W / std::min(W, 3));
  EXPECT_EQ(shard_ranks(m), std::vector<int>(writers.begin(), writers.end()));
  uint64_t data = 0;
  for (const auto& s : m["shards"]) data += s["data_bytes"].get<uint64_t>();
  EXPECT_EQ(data, Model::kBytes);
  for (int r = 0; r < W; ++r)
    EXPECT_EQ(test::exists(tmp.sub("step-00000007/rank-0000" + std::to_string(r) + ".safetensors")),
              writers.count(r) == 1)
        << "rank " << r;
  for (int rs : groups_upto(W)) {
    SCOPED_TRACE("read by " + std::to_string(rs));
    auto readers = w->split_group(w->rank() < rs ? 0 : -1, w->rank(), "readers");
    bool ok = true;
    if (readers) {
      Model got;
      got.poison();
      CheckpointManager mgr(readers, opts(tmp.path()));
      auto r = mgr.load({{"model", &got}});
      ok = r && r->step == 7 && got.holds(7);
      EXPECT_TRUE(ok);
      const int S = static_cast<int>(writers.size());
      const auto opened = sum(readers, static_cast<int64_t>(r ? r->files_opened : 0));
      const auto read = sum(readers, static_cast<int64_t>(r ? r->bytes_read : 0));
      // One node: each shard is opened once, by the rank that verifies it
      // and reads its pieces for the others, plus the manifest on rank 0;
      // each byte is read twice (verified, then copied).  Without node
      // sharing every rank would open every shard (rs * S) and read every
      // replicated byte (rs * T).
      EXPECT_EQ(opened, S + 1) << "files opened by the " << rs << " readers";
      EXPECT_LE(static_cast<uint64_t>(read), 2 * Model::kBytes + (S + 1) * 16384u)
          << "bytes read by the " << rs << " readers";
      if (readers->rank() == 0)
        std::printf("read by %d: %lld files, %lld bytes in all\n", rs,
                    static_cast<long long>(opened), static_cast<long long>(read));
    }
    EXPECT_TRUE(test::all_ranks_ok(ok));
  }
}

// Tensor parallelism of 2 inside data parallelism (ranks r and r + 2 hold
// the same TP piece), a replicated norm and ZeRO-style flat optimizer
// state: every byte is written once, each TP piece by one of its holders.
struct TpState : Stateful {
  int tp, dp, world, rank;
  std::vector<float> col, norm, opt;
  TpState(int world_, int rank_, int tp_) : tp(tp_), world(world_), rank(rank_) {
    col.resize(static_cast<size_t>(8 * 6 / tp));
    norm.resize(6);
    opt.resize(5);
  }
  static float g(int64_t i, int64_t j) { return static_cast<float>(i * 10 + j); }
  void fill() {
    const int64_t c0 = (rank % tp) * (6 / tp), cn = 6 / tp;
    for (int64_t i = 0; i < 8; ++i)
      for (int64_t j = 0; j < cn; ++j) col[static_cast<size_t>(i * cn + j)] = g(i, c0 + j);
    for (int i = 0; i < 6; ++i) norm[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i);
    for (int i = 0; i < 5; ++i) opt[static_cast<size_t>(i)] = static_cast<float>(rank * 5 + i);
  }
  void poison() {
    std::fill(col.begin(), col.end(), -1.f);
    std::fill(norm.begin(), norm.end(), -1.f);
    std::fill(opt.begin(), opt.end(), -1.f);
  }
  StateDict state_dict() override {
    ShardInfo c;
    c.global_shape = {8, 6};
    c.dim = 1;
    c.offset = (rank % tp) * (6 / tp);
    c.group = "tp";
    ShardInfo z;
    z.global_shape = {static_cast<int64_t>(world) * 5};
    z.flat = true;
    z.offset = rank * 5;
    z.group = "dp";
    return {{"col", Tensor(col.data(), DType::kFloat32, Shape{8, 6 / tp}), c},
            {"norm", Tensor::of(norm), {}},
            {"opt", Tensor::of(opt), z}};
  }
};

TEST(OnceLayout, TensorParallelPiecesAreWrittenByOneHolder) {
  auto w = world();
  const int W = w->size();
  if (W % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  ScratchDir tmp(w);
  {
    TpState s(W, w->rank(), 2);
    s.fill();
    CheckpointManager mgr(w, opts(tmp.path()));
    mgr.save(3, {{"m", &s}});
    EXPECT_EQ(sum(w, static_cast<int64_t>(mgr.last_save_stats().written_bytes)),
              8 * 6 * 4 + 6 * 4 + W * 5 * 4);
  }
  w->barrier();
  const auto m = manifest(tmp.sub("step-00000003"));
  const auto& col = m["tensors"]["m/col"]["pieces"];
  ASSERT_EQ(col.size(), 2u);
  for (const auto& p : col) {
    const int offset = p[4]["offset"].get<int>();
    EXPECT_EQ(p[0].get<int>() % 2, offset / 3) << "written by a holder of the piece: " << p.dump();
  }
  for (int rs : groups_upto(W)) {
    SCOPED_TRACE("read by " + std::to_string(rs));
    auto readers = w->split_group(w->rank() < rs ? 0 : -1, w->rank(), "readers");
    bool ok = true;
    if (readers) {
      // Read with TP 1 (whole columns) and the flat state re-split.
      TpState got(rs, readers->rank(), 1);
      got.opt.resize(static_cast<size_t>(W * 5 / rs + (readers->rank() < W * 5 % rs)));
      got.poison();
      StateDict want = got.state_dict();
      for (NamedTensor& nt : want) nt.name = "m/" + nt.name;
      int64_t off = 0;
      for (int r = 0; r < readers->rank(); ++r) off += W * 5 / rs + (r < W * 5 % rs);
      want[2].shard.global_shape = {static_cast<int64_t>(W) * 5};
      want[2].shard.offset = off;
      CheckpointManager mgr(readers, opts(tmp.path()));
      ok = mgr.load_latest(want).value_or(-1) == 3;
      for (int64_t i = 0; i < 8; ++i)
        for (int64_t j = 0; j < 6; ++j) ok = ok && got.col[static_cast<size_t>(i * 6 + j)] == TpState::g(i, j);
      for (int i = 0; i < 6; ++i) ok = ok && got.norm[static_cast<size_t>(i)] == 0.5f * i;
      for (size_t i = 0; i < got.opt.size(); ++i)
        ok = ok && got.opt[i] == static_cast<float>(off + static_cast<int64_t>(i));
      EXPECT_TRUE(ok);
    }
    EXPECT_TRUE(test::all_ranks_ok(ok));
  }
}

// The per-rank layout writes what older tutti wrote (manifest version 2,
// every rank every tensor: W copies of replicated state); a once-layout
// manager loads it, and a version 1 manifest (no checksum, no parent) too.
TEST(PerRankLayout, WritesVersion2AndOldManifestsStillLoad) {
  SmallChunks chunks;
  auto w = world();
  const int W = w->size();
  ScratchDir tmp(w);
  EXPECT_EQ(save_model(w, tmp.path(), 4, CheckpointLayout::kPerRank),
            static_cast<int64_t>(W * Model::kBytes));
  w->barrier();
  const auto m = manifest(tmp.sub("step-00000004"));
  EXPECT_EQ(m["version"], 2);
  EXPECT_FALSE(m.contains("tensors"));
  EXPECT_EQ(shard_ranks(m).size(), static_cast<size_t>(W));
  {
    Model got;
    got.poison();
    CheckpointManager mgr(w, opts(tmp.path()));
    auto r = mgr.load({{"model", &got}});
    EXPECT_TRUE(r && r->step == 4 && got.holds(4));
  }
  w->barrier();
  if (w->rank() == 0) {  // as tutti before version 2 wrote it
    nlohmann::json v1 = m;
    v1.erase("manifest_xxh64");
    v1.erase("parent");
    v1["version"] = 1;
    test::write_text(tmp.sub("step-00000004/manifest.json"), v1.dump(1));
  }
  w->barrier();
  Model got;
  got.poison();
  CheckpointManager mgr(w, opts(tmp.path()));
  auto r = mgr.load({{"model", &got}});
  EXPECT_TRUE(r && r->step == 4 && got.holds(4)) << "a version 1 manifest loads";
}

// Flat pieces that leave every other 5 elements unwritten: a save that
// could never load is refused before its manifest, on every rank.
TEST(OnceLayout, PiecesThatLeaveAGapPublishNothing) {
  auto w = world();
  const int W = w->size();
  ScratchDir tmp(w);
  std::vector<float> x(5, 1.f);
  ShardInfo s;
  s.global_shape = {static_cast<int64_t>(W) * 10};
  s.flat = true;
  s.offset = w->rank() * 10;
  CheckpointManager mgr(w, opts(tmp.path()));
  const std::string msg = test::expect_error(
      [&] { mgr.save(1, StateDict{{"g/x", Tensor::of(x), s}}); }, ErrorCode::kInvalidArgument);
  test::expect_contains(msg, "checkpoint step 1");
  test::expect_contains(msg, "not published");
  test::expect_contains(msg, "tensor 'g/x' F32[" + std::to_string(W * 10) + "]: " +
                                 std::to_string(W * 5) + " elements (the first at flat index 5) "
                                 "were written by no rank");
  w->barrier();
  EXPECT_TRUE(test::complete_checkpoints(tmp.path()).empty());
}

// Three failing ranks, two texts kept per kind: every rank gets the same
// summary, with the lowest ranks' texts and the others counted.
TEST(ProblemReports, AreGatheredOnceAndCapped) {
  auto w = world();
  const int W = w->size(), r = w->rank();
  ckpt::Agreement agree(*w, 20, "test");
  const int64_t kind = r == 0 ? 2 : 1;
  ckpt::reset_protocol_counts();
  auto got = ckpt::gather_problems(agree, kind, "rank " + std::to_string(r) + ": bad", "testing",
                                   nullptr, /*cap=*/2);
  const auto counts = ckpt::protocol_counts();
  ASSERT_EQ(got.count(2), 1u);
  EXPECT_EQ(got[2].text, "rank 0: bad");
  EXPECT_EQ(got[2].rank_list(), "rank 0");
  if (W > 1) {
    ASSERT_EQ(got.count(1), 1u);
    EXPECT_EQ(got[1].count, static_cast<uint64_t>(W - 1));
    std::string want = "rank 1: bad";
    if (W > 2) want += "; rank 2: bad";
    if (W > 3) want += "; and " + std::to_string(W - 3) + " more ranks";
    EXPECT_EQ(got[1].text, want);
    EXPECT_EQ(got[1].rank_list(), W == 2 ? "rank 1" : W == 3 ? "ranks 1, 2" : "ranks 1, 2, ... (3 ranks)");
  }
  // The tree: rank 0 receives from ceil(log2 W) children, two messages each;
  // every other rank sends one aggregate (two messages).
  int log2w = 0;
  while ((1 << log2w) < W) ++log2w;
  EXPECT_EQ(counts.messages_received, r == 0 ? 2u * log2w : counts.messages_received);
  EXPECT_LE(counts.messages_received, 2u * log2w);
  EXPECT_EQ(counts.messages_sent, r == 0 ? 0u : 2u);
}

}  // namespace
}  // namespace tutti
