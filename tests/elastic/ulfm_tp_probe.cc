// A TP x DP job losing one rank, recovered in-process (ULFM;
// recover(RecoveryOptions), ElasticOptions::tp_size), for
// tests/elastic/ulfm_mesh_test.py under Open MPI 5's `mpiexec --with-ft ulfm`.
// Exits 77 where recovery is not available.
//
//   ulfm_tp_probe DIR KILL_RANKS KILL_STEP STEPS   (np 4, TP 2 x DP 2)
//
// Model: a ColumnParallelLinear(4 -> 4, no bias, output kept sharded) into a
// RowParallelLinear(4 -> 2, no bias, input parallel), float32, full weights
// Wc[i][j] = 4i + j + 1 and Wr[i][j] = 4i + j + 1 at the start, and `acc`
// (float64, replicated).  Step s at DP size D: replica d computes
// y = x Wc^T Wr^T for x = (d + 1) * ones(4) through the two layers (a TP
// all-reduce), checks y against the host closed form, acc += the sum of y
// over the DP replicas, then every weight element += s * D.  Every value is
// an integer below 2^24, so float32 is exact and every check is equality.
// elastic_run commits each step to the memory tier; KILL_RANKS ("1", or
// "1,2": ranks numbered at start) SIGKILL themselves after step KILL_STEP's
// forward.  One rank: its TP partner leaves the job (exit 0), the other TP
// group goes on at DP 1 from the commit of step KILL_STEP - 1.  A rank of
// each TP group: no complete replica survives, recovery is refused
// (kRanksLost) and the error propagates from elastic_run (the restart path).
//
// Before training: recover(RecoveryOptions{3}) at 4 ranks raises
// kInvalidArgument and leaves the world as it was.
//
// Writes DIR/result.rank<R> (R: the rank at start) on the ranks that finish,
// DIR/exit.rank<R> with the exit status of every rank that exits normally
// (glibc on_exit), and on the final rank 0 DIR/state.json: acc, the full
// weights, the DP size every step ran at.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tutti/tutti.h"
#include "ulfm_probe_util.h"

using namespace tutti;

namespace {

constexpr int kTp = 2;
constexpr int64_t kIn = 4, kHidden = 4, kOut = 2;

Tensor matrix(float* data, int64_t rows, int64_t cols) {
  return Tensor(data, DType::kFloat32, Shape{rows, cols});
}

std::string g_dir;
int g_start_rank = -1;

void record_exit(int status, void*) {
  std::ofstream(g_dir + "/exit.rank" + std::to_string(g_start_rank)) << status << "\n";
}

using ulfm_probe::cat;
using ulfm_probe::Fail;

// The full weights in closed form after the steps that ran at `sizes`
// (sizes[s]: the DP size of step s; 0: not run).
struct Reference {
  std::vector<double> wc, wr;  // [kHidden x kIn], [kOut x kHidden]
  explicit Reference(const std::vector<int>& sizes, int64_t through) {
    double add = 0;
    for (int64_t s = 1; s <= through; ++s) add += static_cast<double>(s * sizes[s]);
    for (int64_t i = 0; i < kHidden * kIn; ++i) wc.push_back(static_cast<double>(i + 1) + add);
    for (int64_t i = 0; i < kOut * kHidden; ++i) wr.push_back(static_cast<double>(i + 1) + add);
  }
  std::vector<double> y(double x) const {
    std::vector<double> h(kHidden, 0.0), out(kOut, 0.0);
    for (int64_t i = 0; i < kHidden; ++i)
      for (int64_t j = 0; j < kIn; ++j) h[i] += wc[i * kIn + j] * x;
    for (int64_t k = 0; k < kOut; ++k)
      for (int64_t i = 0; i < kHidden; ++i) out[k] += wr[k * kHidden + i] * h[i];
    return out;
  }
};

struct Model : Stateful {
  ProcessMeshPtr mesh;
  std::unique_ptr<ColumnParallelLinear> col;
  std::unique_ptr<RowParallelLinear> row;
  std::vector<double> acc = std::vector<double>(1, 0.0);

  // Over the current world (at the start, and in the reset callback after a
  // recovery: the layers then get their shards from the commit).
  void build() {
    mesh = std::make_shared<ProcessMesh>(world(), kTp);
    ColumnParallelLinearOptions co;
    co.bias = false;
    co.gather_output = false;
    col.reset(new ColumnParallelLinear(mesh, kIn, kHidden, co));
    RowParallelLinearOptions ro;
    ro.bias = false;
    ro.input_is_parallel = true;
    row.reset(new RowParallelLinear(mesh, kHidden, kOut, ro));
  }
  void load_initial() {
    const Reference r({0}, 0);
    std::vector<float> wc(r.wc.begin(), r.wc.end()), wr(r.wr.begin(), r.wr.end());
    col->load_from_full(matrix(wc.data(), kHidden, kIn));
    row->load_from_full(matrix(wr.data(), kOut, kHidden));
  }
  StateDict state_dict() override {
    StateDict out = col->state_dict();
    for (auto& nt : row->state_dict()) out.push_back(nt);
    out.push_back({"acc", Tensor::of(acc), ShardInfo()});
    return out;
  }
  static void add(const Tensor& t, float v) {
    float* p = static_cast<float*>(t.data());
    for (int64_t i = 0; i < t.numel(); ++i) p[i] += v;
  }
  // This rank's shard of the full weights, placed in zeroed full matrices.
  void scatter_into(std::vector<double>& wc, std::vector<double>& wr) const {
    const int64_t hr = col->out_features_per_rank(), ic = row->in_features_per_rank();
    const float* c = static_cast<const float*>(col->weight().data());
    for (int64_t i = 0; i < hr; ++i)
      for (int64_t j = 0; j < kIn; ++j) wc[(mesh->tp_rank() * hr + i) * kIn + j] = c[i * kIn + j];
    const float* w = static_cast<const float*>(row->weight().data());
    for (int64_t k = 0; k < kOut; ++k)
      for (int64_t i = 0; i < ic; ++i) wr[k * kHidden + mesh->tp_rank() * ic + i] = w[k * ic + i];
  }
};

int run(const std::string& dir, const std::vector<int>& kill_ranks, int64_t kill_step,
        int64_t steps, std::ofstream& res) {
  const int start_rank = rank();
  Model model;
  model.build();
  model.load_initial();
  ElasticOptions eo;
  eo.tp_size = kTp;
  ElasticState state(world(), {{"model", &model}}, eo);
  int resets = 0;
  state.on_reset([&] {
    ++resets;
    model.build();
  });
  std::vector<int> sizes(static_cast<size_t>(steps + 1), 0);  // DP size of each step
  int64_t calls = 0;
  elastic_run(state, [&](ElasticState& s) {
    ++calls;
    if (calls > 1)
      res << "resumed step=" << s.step() << " size=" << size() << " rank=" << rank()
          << " tp_rank=" << model.mesh->tp_rank() << " dp_size=" << model.mesh->dp_size()
          << std::endl;
    for (int64_t step = s.step() + 1; step <= steps; ++step) {
      const ProcessMesh& mesh = *model.mesh;
      const int dp = mesh.dp_size();
      sizes[static_cast<size_t>(step)] = dp;
      const Reference ref(sizes, step - 1);
      // Forward: column then row parallel (one TP all-reduce).
      const double x = mesh.dp_rank() + 1;
      std::vector<float> in(kIn, static_cast<float>(x));
      std::vector<float> h(static_cast<size_t>(model.col->out_features_per_rank()));
      std::vector<float> y(kOut);
      model.col->forward(matrix(in.data(), 1, kIn),
                         matrix(h.data(), 1, static_cast<int64_t>(h.size())));
      model.row->forward(matrix(h.data(), 1, static_cast<int64_t>(h.size())),
                         matrix(y.data(), 1, kOut));
      const std::vector<double> want = ref.y(x);
      for (int64_t k = 0; k < kOut; ++k)
        EXPECT(y[k] == want[k], "step ", step, ": y[", k, "] = ", y[k], " closed form ",
               want[k], " (DP ", dp, ", replica ", mesh.dp_rank(), ")");
      const bool dies =
          std::find(kill_ranks.begin(), kill_ranks.end(), start_rank) != kill_ranks.end();
      if (dies && step == kill_step) {
        ulfm_probe::die(dir, start_rank);
      }
      double u = y[0] + y[1];
      mesh.dp_group()->allreduce(Tensor::of(&u, 1), ReduceOp::kSum, {"dp sum"});
      model.acc[0] += u;
      double check = model.acc[0];
      world()->allreduce(Tensor::of(&check, 1), ReduceOp::kSum, {"acc check"});
      EXPECT(check == model.acc[0] * size(), "acc differs between ranks at step ", step);
      Model::add(model.col->weight(), static_cast<float>(step * dp));
      Model::add(model.row->weight(), static_cast<float>(step * dp));
      s.commit(step, "{\"step\": " + std::to_string(step) + "}");
    }
  });
  // The full weights: replica 0's shards, summed over the world.
  std::vector<double> wc(kHidden * kIn, 0.0), wr(kOut * kHidden, 0.0);
  if (model.mesh->dp_rank() == 0) model.scatter_into(wc, wr);
  world()->allreduce(Tensor::of(wc), ReduceOp::kSum, {"gather wc"});
  world()->allreduce(Tensor::of(wr), ReduceOp::kSum, {"gather wr"});
  res << "calls=" << calls << " resets=" << resets << " final_size=" << size()
      << " final_rank=" << rank() << " tp_rank=" << model.mesh->tp_rank() << "\n";
  if (rank() == 0) {
    std::ofstream out(dir + "/state.json");
    auto list = [&](const std::vector<double>& v) {
      std::string t;
      for (double d : v) t += cat(t.empty() ? "" : ", ", static_cast<int64_t>(d));
      return "[" + t + "]";
    };
    std::vector<double> sz(sizes.begin() + 1, sizes.end());
    out << "{\"acc\": " << static_cast<int64_t>(model.acc[0]) << ", \"wc\": " << list(wc)
        << ", \"wr\": " << list(wr) << ", \"dp_sizes\": " << list(sz) << "}\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: ulfm_tp_probe DIR KILL_RANKS KILL_STEP STEPS\n");
    return 2;
  }
  g_dir = argv[1];
  init();
  if (!recovery_available()) {
    if (rank() == 0) std::printf("ulfm_probe: in-process recovery is not available here\n");
    shutdown();
    return 77;
  }
  g_start_rank = rank();
  on_exit(record_exit, nullptr);
  std::ofstream res(g_dir + "/result.rank" + std::to_string(g_start_rank));
  int rc = 0;
  try {
    EXPECT(size() == 2 * kTp, "run at ", 2 * kTp, " ranks, not ", size());
    // A tp_size that does not divide the world is refused before anything
    // changes (no shrink, the world intact).
    bool refused = false;
    try {
      RecoveryOptions bad;
      bad.tp_size = 3;
      recover(bad);
    } catch (const Error& e) {
      refused = e.code() == ErrorCode::kInvalidArgument;
    }
    double one = 1;
    world()->allreduce(Tensor::of(&one, 1), ReduceOp::kSum, {"after refusal"});
    EXPECT(refused && one == size(), "recover(tp_size 3) at ", size(), " ranks: refused ",
           refused, ", world sums ", one);
    std::vector<int> kills;  // "1" or "1,2"
    std::istringstream spec(argv[2]);
    for (std::string item; std::getline(spec, item, ',');) kills.push_back(std::stoi(item));
    rc = run(g_dir, kills, std::atoll(argv[3]), std::atoll(argv[4]), res);
    res << "OK\n";
  } catch (const Fail& f) {
    res << "FAIL " << f.what << "\n";
    std::fprintf(stderr, "start rank %d: %s\n", g_start_rank, f.what.c_str());
    rc = 1;
  } catch (const std::exception& e) {
    res << "FAIL " << e.what() << "\n";
    std::fprintf(stderr, "start rank %d: %s\n", g_start_rank, e.what());
    rc = 1;
  }
  res.close();
  shutdown();
  return rc;
}
