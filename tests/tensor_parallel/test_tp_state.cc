// Sharding facts: what state_dict() and parameters() say about each shard,
// that the shards reassemble into the global tensors from ShardInfo alone,
// that a model written at one tp_size loads at another, and the TP-aware
// gradient norm (replicated parameters counted once).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "tensor_parallel/tp_test_util.h"

namespace tutti {
namespace {

using tptest::view;

constexpr int64_t kH = 12, kF = 24, kV = 36;

// The three sharded layer kinds of a tiny model, on one mesh.
struct Model {
  std::unique_ptr<ColumnParallelLinear> fc1;
  std::unique_ptr<RowParallelLinear> fc2;
  std::unique_ptr<VocabParallelEmbedding> emb;
  explicit Model(const ProcessMeshPtr& mesh) {
    ColumnParallelLinearOptions co;
    co.name = "mlp.fc1";
    co.gather_output = false;
    RowParallelLinearOptions ro;
    ro.name = "mlp.fc2";
    ro.input_is_parallel = true;
    VocabParallelEmbeddingOptions eo;
    eo.name = "wte";
    fc1 = std::make_unique<ColumnParallelLinear>(mesh, kH, kF, co);
    fc2 = std::make_unique<RowParallelLinear>(mesh, kF, kH, ro);
    emb = std::make_unique<VocabParallelEmbedding>(mesh, kV, kH, eo);
  }
  void init(uint64_t seed) {
    fc1->init_from_seed(seed);
    fc2->init_from_seed(seed + 1);
    emb->init_from_seed(seed + 2);
  }
  StateDict state() {
    StateDict d;
    for (Stateful* s :
         {static_cast<Stateful*>(fc1.get()), static_cast<Stateful*>(fc2.get()),
          static_cast<Stateful*>(emb.get())})
      for (auto& t : s->state_dict()) d.push_back(t);
    return d;
  }
  std::vector<TPParameter> params() const {
    std::vector<TPParameter> ps;
    for (auto v : {fc1->parameters(), fc2->parameters(), emb->parameters()})
      ps.insert(ps.end(), v.begin(), v.end());
    return ps;
  }
};

TEST(ShardInfo, StateDictDescribesEachShard) {
  for (const auto& mesh : tptest::all_meshes()) {
    SCOPED_TRACE(mesh->str());
    const int p = mesh->tp_size(), r = mesh->tp_rank();
    Model m(mesh);
    const StateDict d = m.state();
    ASSERT_EQ(d.size(), 5u);
    struct Want {
      const char* name;
      std::vector<int64_t> global;
      int dim;
      int64_t offset;
      Shape local;
    };
    const Want want[] = {
        {"mlp.fc1.weight", {kF, kH}, 0, r * kF / p, Shape{kF / p, kH}},
        {"mlp.fc1.bias", {kF}, 0, r * kF / p, Shape{kF / p}},
        {"mlp.fc2.weight", {kH, kF}, 1, r * kF / p, Shape{kH, kF / p}},
        {"mlp.fc2.bias", {kH}, -1, 0, Shape{kH}},
        {"wte.weight", {kV, kH}, 0, r * kV / p, Shape{kV / p, kH}},
    };
    const auto params = m.params();
    for (size_t i = 0; i < d.size(); ++i) {
      SCOPED_TRACE(want[i].name);
      EXPECT_EQ(d[i].name, want[i].name);
      EXPECT_EQ(d[i].shard.global_shape, want[i].global);
      EXPECT_EQ(d[i].shard.dim, want[i].dim);
      EXPECT_EQ(d[i].shard.offset, want[i].offset);
      EXPECT_EQ(d[i].shard.group, "tp");
      EXPECT_FALSE(d[i].shard.flat);
      EXPECT_EQ(d[i].tensor.shape(), want[i].local);
      // parameters() agrees, and names the replicated one.
      EXPECT_EQ(params[i].name, d[i].name);
      EXPECT_EQ(params[i].value.data(), d[i].tensor.data());
      EXPECT_EQ(params[i].grad.shape(), d[i].tensor.shape());
      EXPECT_EQ(params[i].tp_replicated(), want[i].dim < 0);
    }
  }
}

TEST(ShardInfo, ShardsReassembleIntoTheSameGlobalTensorsAtEveryTpSize) {
  const auto meshes = tptest::all_meshes();
  Model dense(meshes[0]);  // tp_size 1: every rank holds the global tensors
  dense.init(7);
  const StateDict want = dense.state();
  for (const auto& mesh : meshes) {
    SCOPED_TRACE(mesh->str());
    Model m(mesh);
    m.init(7);
    const StateDict got = m.state();
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(tptest::assemble(*mesh, got[i]), tptest::read(want[i].tensor))
          << got[i].name;
  }
}

// A checkpoint written at tp_size a (the global tensors assembled from the
// shards by their ShardInfo) loads into a model at tp_size b by copying the
// region each new shard's ShardInfo names; the loaded model computes what
// the saved one did.
TEST(ShardInfo, ACheckpointWrittenAtOneTpSizeLoadsAtAnother) {
  const auto meshes = tptest::all_meshes();
  const int64_t rows = 5;
  auto x = tptest::random_floats(3, rows * kH);
  for (const auto& from : meshes)
    for (const auto& to : meshes) {
      SCOPED_TRACE("written at " + from->str() + ", loaded at " + to->str());
      Model saved(from);
      saved.init(11);
      std::vector<std::vector<float>> checkpoint;
      for (const NamedTensor& t : saved.state())
        checkpoint.push_back(tptest::assemble(*from, t));
      Model loaded(to);
      const StateDict d = loaded.state();
      for (size_t i = 0; i < d.size(); ++i)
        tptest::load_region(checkpoint[i], d[i]);
      for (Stateful* s : {static_cast<Stateful*>(loaded.fc1.get()),
                          static_cast<Stateful*>(loaded.fc2.get())})
        s->on_state_loaded();
      // Same shards as initialising at the new size directly (exact).
      Model direct(to);
      direct.init(11);
      const StateDict e = direct.state();
      for (size_t i = 0; i < d.size(); ++i)
        EXPECT_EQ(tptest::read(d[i].tensor), tptest::read(e[i].tensor))
            << d[i].name;
      // And the same function: fc2(fc1(x)) at both sizes, within the float32
      // sum bound of two chained GEMMs (k = 12, then 24 terms, values < 1).
      auto run = [&](Model& m, int p) {
        std::vector<float> h(rows * kF / p), y(rows * kH);
        m.fc1->forward(view(x, {rows, kH}), view(h, {rows, kF / p}));
        m.fc2->forward(view(h, {rows, kF / p}), view(y, {rows, kH}));
        return y;
      };
      const auto y_from = run(saved, from->tp_size());
      const auto y_to = run(loaded, to->tp_size());
      std::vector<double> expect(y_from.begin(), y_from.end());
      EXPECT_TRUE(
          tptest::near(y_to, expect, 64 * std::ldexp(1.0, -24) * (kH + kF)));
    }
}

TEST(TpGradNorm, CountsReplicatedGradientsOnceAndEqualsTheDenseNorm) {
  const auto meshes = tptest::all_meshes();
  const int64_t rows = 7;
  auto x = tptest::random_floats(5, rows * kH),
       dy = tptest::random_floats(6, rows * kH);
  std::vector<int64_t> ids{0, 5, 35, 5, 17, 20, 1};
  auto demb = tptest::random_floats(8, rows * kH);
  auto run = [&](Model& m, int p) {
    std::vector<float> h(rows * kF / p), y(rows * kH), dh(rows * kF / p);
    m.fc1->forward(view(x, {rows, kH}), view(h, {rows, kF / p}));
    m.fc2->forward(view(h, {rows, kF / p}), view(y, {rows, kH}));
    m.fc2->backward(view(h, {rows, kF / p}), view(dy, {rows, kH}),
                    view(dh, {rows, kF / p}));
    m.fc1->backward(view(x, {rows, kH}), view(dh, {rows, kF / p}), Tensor());
    m.emb->backward(Tensor(ids.data(), DType::kInt64, Shape{rows}),
                    view(demb, {rows, kH}));
  };
  Model dense(meshes[0]);
  dense.init(3);
  run(dense, 1);
  double want = 0, replicated = 0;
  for (const auto& prm : dense.params())
    for (float g : tptest::read(prm.grad)) {
      want += static_cast<double>(g) * g;
      if (prm.name == "mlp.fc2.bias") replicated += static_cast<double>(g) * g;
    }
  ASSERT_GT(replicated,
            1e-3 * want);  // large enough that double counting shows
  for (const auto& mesh : meshes) {
    SCOPED_TRACE(mesh->str());
    Model m(mesh);
    m.init(3);
    run(m, mesh->tp_size());
    const double got = tp_grad_norm_squared(*mesh, m.params());
    // Gradients agree to the float32 GEMM bound (k <= 24 terms); the norm
    // squared to a few times that, relatively.
    EXPECT_NEAR(got, want, 1e-5 * want);
    // The same on every TP rank.
    double lo = got, hi = got;
    mesh->tp_group()->allreduce(Tensor::of(&lo, 1), ReduceOp::kMin);
    mesh->tp_group()->allreduce(Tensor::of(&hi, 1), ReduceOp::kMax);
    EXPECT_EQ(lo, hi);
  }
}

}  // namespace
}  // namespace tutti
