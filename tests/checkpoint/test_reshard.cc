// Resharding: a checkpoint written by a group of k ranks (tensors split
// along a dimension, flat ZeRO-style shards, replicated tensors, and TP
// shards replicated over DP ranks) loads into a group of any other size,
// every element exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "ckpt_test_util.h"
#include "common/test_util.h"

namespace tutti {
namespace {

// Uneven split of n into parts: (offset, length) of part i.
std::pair<int64_t, int64_t> split(int64_t n, int parts, int i) {
  const int64_t base = n / parts, rem = n % parts;
  const int64_t off = i * base + std::min<int64_t>(i, rem);
  return {off, base + (i < rem ? 1 : 0)};
}

// A model's state as one member of a group sees it: `parts` shards, this
// one being `index`.  Values are closed-form in the global coordinates.
struct ShardedState : Stateful {
  std::vector<float> rows, cols, flat2d;
  std::vector<double> cube;
  std::vector<int32_t> rep;
  std::vector<BFloat16> flat;
  int64_t scalar = 0;
  int parts, index;
  ShardedState(int parts_, int index_) : parts(parts_), index(index_) {
    auto [r0, rn] = split(6, parts, index);
    auto [c0, cn] = split(5, parts, index);
    auto [k0, kn] = split(3, parts, index);
    auto [f0, fn] = split(101, parts, index);
    auto [g0, gn] = split(70, parts, index);
    rows.resize(static_cast<size_t>(rn * 5));
    cols.resize(static_cast<size_t>(6 * cn));
    cube.resize(static_cast<size_t>(4 * kn * 2));
    flat.resize(static_cast<size_t>(fn));
    flat2d.resize(static_cast<size_t>(gn));
    rep.resize(7);
  }
  static double g2(int64_t i, int64_t j) { return static_cast<double>(i * 10 + j); }
  static double g3(int64_t a, int64_t b, int64_t c) { return static_cast<double>(a * 100 + b * 10 + c); }
  void fill() {
    auto [r0, rn] = split(6, parts, index);
    auto [c0, cn] = split(5, parts, index);
    auto [k0, kn] = split(3, parts, index);
    auto [f0, fn] = split(101, parts, index);
    auto [g0, gn] = split(70, parts, index);
    for (int64_t i = 0; i < rn; ++i)
      for (int64_t j = 0; j < 5; ++j) rows[static_cast<size_t>(i * 5 + j)] = static_cast<float>(g2(r0 + i, j));
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t j = 0; j < cn; ++j) cols[static_cast<size_t>(i * cn + j)] = static_cast<float>(g2(i, c0 + j));
    for (int64_t a = 0; a < 4; ++a)
      for (int64_t b = 0; b < kn; ++b)
        for (int64_t c = 0; c < 2; ++c) cube[static_cast<size_t>((a * kn + b) * 2 + c)] = g3(a, k0 + b, c);
    for (int64_t i = 0; i < fn; ++i) flat[static_cast<size_t>(i)] = BFloat16(static_cast<float>((f0 + i) % 50));
    for (int64_t i = 0; i < gn; ++i) flat2d[static_cast<size_t>(i)] = static_cast<float>(g0 + i) * 0.5f;
    for (int i = 0; i < 7; ++i) rep[static_cast<size_t>(i)] = 1000 + i;
    scalar = 12345;
  }
  void poison() {
    std::fill(rows.begin(), rows.end(), -1.f);
    std::fill(cols.begin(), cols.end(), -1.f);
    std::fill(cube.begin(), cube.end(), -1.0);
    std::fill(flat.begin(), flat.end(), BFloat16(-1.f));
    std::fill(flat2d.begin(), flat2d.end(), -1.f);
    std::fill(rep.begin(), rep.end(), -1);
    scalar = -1;
  }
  StateDict state_dict() override {
    auto [r0, rn] = split(6, parts, index);
    auto [c0, cn] = split(5, parts, index);
    auto [k0, kn] = split(3, parts, index);
    auto [f0, fn] = split(101, parts, index);
    auto [g0, gn] = split(70, parts, index);
    auto dimshard = [](std::vector<int64_t> g, int dim, int64_t off) {
      ShardInfo s;
      s.global_shape = std::move(g);
      s.dim = dim;
      s.offset = off;
      s.group = "tp";
      return s;
    };
    auto flatshard = [](std::vector<int64_t> g, int64_t off) {
      ShardInfo s;
      s.global_shape = std::move(g);
      s.flat = true;
      s.offset = off;
      s.group = "dp";
      return s;
    };
    return {
        {"rows", Tensor(rows.data(), DType::kFloat32, Shape{rn, 5}), dimshard({6, 5}, 0, r0)},
        {"cols", Tensor(cols.data(), DType::kFloat32, Shape{6, cn}), dimshard({6, 5}, 1, c0)},
        {"cube", Tensor(cube.data(), DType::kFloat64, Shape{4, kn, 2}), dimshard({4, 3, 2}, 1, k0)},
        {"flat", Tensor(flat.data(), DType::kBFloat16, Shape{fn}), flatshard({101}, f0)},
        {"flat2d", Tensor(flat2d.data(), DType::kFloat32, Shape{gn}), flatshard({10, 7}, g0)},
        {"rep", Tensor::of(rep), ShardInfo{}},
        {"scalar", Tensor(&scalar, DType::kInt64, Shape{}), ShardInfo{}},
    };
  }
  ::testing::AssertionResult exact() {
    ShardedState want(parts, index);
    want.fill();
    if (rows != want.rows) return ::testing::AssertionFailure() << "rows differ";
    if (cols != want.cols) return ::testing::AssertionFailure() << "cols differ";
    if (cube != want.cube) return ::testing::AssertionFailure() << "cube differs";
    for (size_t i = 0; i < flat.size(); ++i)
      if (flat[i].bits != want.flat[i].bits)
        return ::testing::AssertionFailure() << "flat element " << i << " differs";
    if (flat2d != want.flat2d) return ::testing::AssertionFailure() << "flat2d differs";
    if (rep != want.rep) return ::testing::AssertionFailure() << "rep differs";
    if (scalar != want.scalar) return ::testing::AssertionFailure() << "scalar differs";
    return ::testing::AssertionSuccess();
  }
};

std::vector<int> sizes_upto(int w, std::vector<int> want) {
  want.push_back(w);
  std::set<int> s;
  for (int x : want)
    if (x >= 1 && x <= w) s.insert(x);
  return {s.begin(), s.end()};
}

CheckpointOptions opts(const std::string& dir) {
  CheckpointOptions o;
  o.dir = dir;
  o.timeout_s = 20;
  return o;
}

// Every (writers, readers) pair of group sizes: ranks [0, ws) run
// save(writers, dir) on a group of their own, then ranks [0, rs) run
// check(readers, dir, ws) (true: as expected) on theirs.
template <typename Save, typename Check>
void writers_then_readers(const test::ScratchDir& tmp, const std::string& name, Save save,
                          Check check) {
  auto w = world();
  const int me = w->rank();
  for (int ws : sizes_upto(w->size(), {1, 2})) {
    const std::string dir = tmp.sub(name + "-" + std::to_string(ws));
    auto writers = w->split_group(me < ws ? 0 : -1, me, "writers");
    if (writers) save(writers, dir);
    w->barrier();
    for (int rs : sizes_upto(w->size(), {1, 2, 3})) {
      SCOPED_TRACE("written by " + std::to_string(ws) + ", read by " + std::to_string(rs));
      auto readers = w->split_group(me < rs ? 0 : -1, me, "readers");
      bool ok = true;
      if (readers) {
        ok = check(readers, dir, ws);
        EXPECT_TRUE(ok);
      }
      EXPECT_TRUE(test::all_ranks_ok(ok));
    }
  }
}

TEST(Reshard, AnyGroupSizeToAnyOther) {
  test::ScratchDir tmp(world());
  writers_then_readers(
      tmp, "written-by",
      [](const ProcessGroupPtr& writers, const std::string& dir) {
        ShardedState s(writers->size(), writers->rank());
        s.fill();
        CheckpointManager m(writers, opts(dir));
        m.save(5, {{"model", &s}});
        m.wait();
      },
      [](const ProcessGroupPtr& readers, const std::string& dir, int ws) {
        ShardedState s(readers->size(), readers->rank());
        s.poison();
        CheckpointManager m(readers, opts(dir));
        auto r = m.load({{"model", &s}});
        EXPECT_TRUE(s.exact());
        return r && r->step == 5 && r->saved_world_size == ws && s.exact();
      });
}

// Per-rank state (ShardInfo::per_rank): row <rank> of [world, 3, 2].  The
// same number of ranks gets its own rows back; another number calls the
// hook with every saved row, or fails naming the tensor without one.
struct PerRankState : Stateful {
  std::vector<float> v = std::vector<float>(6);
  std::vector<float> other = std::vector<float>(2);
  bool with_hook = true;
  std::vector<float> rows;  // what the hook received
  int hook_saved = 0, hook_world = 0, hook_rank = -1;
  static float value(int rank, int64_t i) { return static_cast<float>((rank + 1) * 10 + i); }
  void fill(int rank) {
    for (int64_t i = 0; i < 6; ++i) v[static_cast<size_t>(i)] = value(rank, i);
    other = {value(rank, 100), value(rank, 101)};
  }
  StateDict state_dict() override {
    ShardInfo s;
    s.per_rank = true;
    if (with_hook)
      s.on_resize = [this](const PerRankResize& r) {
        const float* p = r.saved.data_as<float>();
        rows.assign(p, p + r.saved.numel());
        hook_saved = r.saved_world;
        hook_world = r.world;
        hook_rank = r.rank;
        EXPECT_EQ(r.dst.data(), v.data());
        EXPECT_EQ(r.saved.shape(), Shape({r.saved_world, 3, 2}));
        for (float& x : v) x = -1.f;
      };
    ShardInfo plain;
    plain.per_rank = true;
    return {{"v", Tensor(v.data(), DType::kFloat32, Shape{3, 2}), s},
            {"other", Tensor::of(other), plain}};
  }
};

TEST(Reshard, PerRankStateRowsAndTheResizeHook) {
  test::ScratchDir tmp(world());
  writers_then_readers(
      tmp, "per-rank",
      [](const ProcessGroupPtr& writers, const std::string& dir) {
        PerRankState s;
        s.fill(writers->rank());
        CheckpointManager m(writers, opts(dir));
        m.save(3, {{"pr", &s}});
        m.wait();
      },
      [](const ProcessGroupPtr& readers, const std::string& dir, int ws) {
        const int rr = readers->rank(), rs = readers->size();
        PerRankState s;
        CheckpointManager m(readers, opts(dir));
        if (rs == ws) {
          auto r = m.load({{"pr", &s}});
          bool ok = r && s.hook_rank == -1;
          for (int64_t i = 0; i < 6; ++i) ok = ok && s.v[static_cast<size_t>(i)] == s.value(rr, i);
          return ok && s.other == std::vector<float>({s.value(rr, 100), s.value(rr, 101)});
        }
        // "other" has no hook: a mismatch on every rank, naming it.
        bool ok = false;
        try {
          m.load({{"pr", &s}});
        } catch (const Error& e) {
          ok = e.code() == ErrorCode::kMismatch &&
               std::string(e.what()).find("pr/other") != std::string::npos &&
               std::string(e.what()).find("per-rank state of " + std::to_string(ws)) !=
                   std::string::npos;
          EXPECT_TRUE(ok) << e.what();
        }
        LoadOptions lo;
        lo.optional = {"pr/other"};
        s.other = {7.f, 7.f};
        auto r = m.load({{"pr", &s}}, lo);
        ok = ok && r && r->skipped == std::vector<std::string>({"pr/other"}) &&
             s.other == std::vector<float>({7.f, 7.f});
        ok = ok && s.hook_saved == ws && s.hook_world == rs && s.hook_rank == rr &&
             s.rows.size() == static_cast<size_t>(ws) * 6;
        for (int row = 0; ok && row < ws; ++row)
          for (int64_t i = 0; i < 6; ++i)
            ok = ok && s.rows[static_cast<size_t>(row * 6 + i)] == s.value(row, i);
        return ok && s.v[0] == -1.f;
      });
}

// A resize reads every saved row and checks each row's checksum in place
// (not every shard in full): a flipped bit in a row falls back to the
// previous checkpoint.
TEST(Reshard, CorruptPerRankRowFallsBackOnAResize) {
  auto w = world();
  if (w->size() < 2) GTEST_SKIP() << "needs a resize: 1 writer, 2+ readers";
  test::ScratchDir tmp(w);
  const std::string dir = tmp.sub("corrupt-row");
  auto writer = w->split_group(w->rank() == 0 ? 0 : -1, 0, "writer");
  if (writer) {
    CheckpointManager m(writer, opts(dir));
    PerRankState s;
    s.fill(0);
    m.save(2, {{"pr", &s}});
    s.fill(5);
    m.save(3, {{"pr", &s}});
    m.wait();
    // Flip a bit inside step 3's "pr/v" (safetensors: u64 header length,
    // JSON header, data; offsets relative to the data).
    const std::string step3 = dir + "/step-00000003";
    const auto files = nlohmann::json::parse(test::read_text(step3 + "/manifest.json")).at("shards");
    const std::string shard = step3 + "/" + files.at(0).at("file").get<std::string>();
    const std::string raw = test::read_text(shard);
    uint64_t hlen = 0;
    std::memcpy(&hlen, raw.data(), 8);
    const auto header = nlohmann::json::parse(raw.substr(8, static_cast<size_t>(hlen)));
    const int64_t begin = header.at("pr/v").at("data_offsets").at(0).get<int64_t>();
    test::flip_bit(shard, static_cast<int64_t>(8 + hlen) + begin + 2);
  }
  w->barrier();
  PerRankState s;
  CheckpointManager m(w, opts(dir));
  LoadOptions lo;
  lo.optional = {"pr/other"};
  auto r = m.load({{"pr", &s}}, lo);
  bool ok = r && r->step == 2 && s.hook_saved == 1 && s.rows.size() == 6;
  for (int64_t i = 0; ok && i < 6; ++i) ok = s.rows[static_cast<size_t>(i)] == s.value(0, i);
  EXPECT_TRUE(ok);
  EXPECT_TRUE(test::all_ranks_ok(ok));
}

// Tensor parallelism of 2 inside data parallelism: ranks r and r+2 hold the
// same TP shard, so stored pieces overlap; loaders take each element once.
TEST(Reshard, TensorParallelShardsReplicatedOverDataParallel) {
  auto w = world();
  if (w->size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  test::ScratchDir tmp(w);
  {
    ShardedState s(2, w->rank() % 2);
    s.fill();
    CheckpointManager m(w, opts(tmp.path()));
    m.save(9, {{"model", &s}});
    m.wait();
  }
  for (int rs : sizes_upto(w->size(), {1, 3})) {
    SCOPED_TRACE("read by " + std::to_string(rs));
    auto readers = w->split_group(w->rank() < rs ? 0 : -1, w->rank(), "readers");
    bool ok = true;
    if (readers) {
      ShardedState s(rs, readers->rank());
      s.poison();
      CheckpointManager m(readers, opts(tmp.path()));
      ok = m.load_latest({{"model", &s}}).value_or(-1) == 9 && s.exact();
      EXPECT_TRUE(ok);
    }
    EXPECT_TRUE(test::all_ranks_ok(ok));
  }
}

}  // namespace
}  // namespace tutti
