// In-process recovery (ULFM; include/tutti/recovery.h) while real work is in
// flight, for tests/elastic/ulfm_ops_test.py under Open MPI 5's `mpiexec
// --with-ft ulfm`.  Exits 77 where recovery is not available.  Survivors
// write DIR/result.rank<R> (R: the rank at start), ending in "OK".  Every
// survivor holds a RecoveryScope, checks that the loss surfaces as
// kRanksLost (never kAborted or another code), recover()s, rebuilds over the
// new world and checks closed-form values.
//
//   ulfm_ops_probe reducer DIR KILLS flat|hier   a Reducer (12 float32
//       parameters of 1024 elements, a bucket each; flat: 4 launch chains,
//       the all-reduces on the chains' progress threads; hier: the
//       hierarchical all-reduce on the reducer's worker thread, nodes of 2).
//       KILLS "RANK:STEP,...": that rank dies at that step after marking
//       half of its gradients ready (buckets launched, in flight).  The
//       survivors' step fails, they recover, build a new Reducer over the
//       new world, redo the step; every synchronize() gives the average
//       over the current members.  Rank s's gradient i, element j is
//       12 (s + 1)(i + 1) + j.
//   ulfm_ops_probe zero DIR KILLS   ZeRO-2 (ShardedOptimizer, SGD lr 0.25)
//       over such a Reducer; the killed rank dies at STEP after the
//       reduce-scatters, before step()'s all-gathers.  The survivors
//       recover, build a new Reducer and ShardedOptimizer from the
//       parameters of the last completed step (broadcast from rank 0), redo
//       the step; the parameters follow the closed form.
//   ulfm_ops_probe ckpt DIR CKPT_DIR   a CheckpointManager (async) saves
//       steps 1 and 2; in step 3's save rank 2 is SIGKILLed half-way
//       through writing its shard (TUTTI_FAULT_INJECT on that rank only,
//       the writer thread).  The survivors' next collectives or the save's
//       wait() raise kRanksLost; they recover, load step 2 at 3 ranks (step
//       3 is incomplete and never loaded), save step 3 again, load it.
//       With after_agree as 4th argument rank 2 dies once every shard was
//       agreed: rank 0 publishes step 3, the survivors load it, save step 4.
//   ulfm_ops_probe shrink DIR in-shrink|before-agree   rank 2 dies at
//       iteration 10 of a loop of all-reduces; rank 3 dies during the
//       recovery: while the others wait in the shrink (in-shrink), or
//       right after a shrink succeeded, before the agreement confirming it
//       (before-agree, ulfm.h's test hook).  The others' recover() ends
//       with both lost, at 2 ranks; then rank 1 dies too, a second
//       recover() leaves rank 0 alone.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi/ulfm.h"
#include "tutti/tutti.h"
#include "ulfm_probe_util.h"

using namespace tutti;
using namespace ulfm_probe;

namespace {

constexpr int kParams = 12;
constexpr int64_t kNumel = 1024;  // 4 KiB of float32: one bucket each
constexpr int kSteps = 6;
constexpr double kBoundS = 5.0;  // detection bound checked here and in the driver

// The closed forms below are exact in float32; the tolerance only allows for
// an average formed as a multiplication by 1 / W.
bool near(double got, double want) {
  return std::fabs(got - want) <= 1e-5 * std::max(1.0, std::fabs(want));
}

// The original ranks of the world's members, in order, kept across recoveries.
struct Members {
  std::vector<int> start;
  Members() {
    for (int r = 0; r < size(); ++r) start.push_back(r);
  }
  int world_rank_of(int start_rank) const {
    for (size_t i = 0; i < start.size(); ++i)
      if (start[i] == start_rank) return static_cast<int>(i);
    return -1;
  }
  // sum over members of (s + 1)
  int64_t weight() const {
    int64_t w = 0;
    for (int s : start) w += s + 1;
    return w;
  }
};

// kRanksLost for the death of `dead` (start ranks; the first one's death
// raised it): the message names its world rank; recover() loses exactly
// them; the survivors keep their order.  Returns the line for the result
// file.
std::string expect_loss_and_recover(const Error& e, const std::string& dir, Members& m,
                                    const std::vector<int>& dead, const std::string& where) {
  EXPECT(e.code() == ErrorCode::kRanksLost, where, ": expected kRanksLost, got code ",
         static_cast<int>(e.code()), ": ", e.what());
  const int me = m.start[static_cast<size_t>(rank())];
  const double detected = wall_now() - killed_at(dir, dead[0]);
  std::vector<int> want_lost;
  for (int d : dead) want_lost.push_back(m.world_rank_of(d));
  std::sort(want_lost.begin(), want_lost.end());
  const std::string named = "world rank " + std::to_string(m.world_rank_of(dead[0]));
  const std::string text = e.what();
  EXPECT(text.find(named) != std::string::npos || text.find("a peer died") != std::string::npos,
         where, ": message '", text, "' does not name '", named, "'");
  const int old_size = size();
  RecoveryResult r = recover();
  EXPECT(r.lost == want_lost, where, ": recover() lost ", r.lost.size(), " rank(s), the first ",
         r.lost.empty() ? -1 : r.lost[0], "; expected ", want_lost.size());
  EXPECT(r.old_size == old_size && r.new_size == old_size - static_cast<int>(dead.size()) &&
             size() == r.new_size,
         where, ": sizes ", r.old_size, " -> ", r.new_size);
  std::vector<int> kept;
  for (int s : m.start)
    if (std::find(dead.begin(), dead.end(), s) == dead.end()) kept.push_back(s);
  m.start = kept;
  EXPECT(m.start[static_cast<size_t>(rank())] == me, where, ": start rank ", me, " is rank ",
         rank(), " now, out of order");
  std::string lost = std::to_string(dead[0]);
  for (size_t i = 1; i < dead.size(); ++i) lost += "+" + std::to_string(dead[i]);
  return cat("recovered lost=", lost, " where=", where, " detect_s=", detected,
             " recover_s=", r.seconds, " attempts=", r.attempts, " size=", r.new_size);
}

// --- reducer / zero ---------------------------------------------------------

struct Model {
  std::vector<std::vector<float>> param, grad;
  Model() : param(kParams, std::vector<float>(kNumel)), grad(kParams, std::vector<float>(kNumel)) {
    for (int i = 0; i < kParams; ++i)
      for (int64_t j = 0; j < kNumel; ++j) param[i][j] = static_cast<float>(j % 64);
  }
  void fill_grads(int start_rank) {
    for (int i = 0; i < kParams; ++i)
      for (int64_t j = 0; j < kNumel; ++j)
        grad[i][j] = static_cast<float>(12 * (start_rank + 1) * (i + 1) + (j % 64));
  }
  // The average of fill_grads over the members: 12 W (i + 1) / n + j.
  static double average(const Members& m, int i, int64_t j) {
    return 12.0 * static_cast<double>(m.weight()) * (i + 1) / static_cast<double>(m.start.size()) +
           static_cast<double>(j % 64);
  }
};

ReducerOptions reducer_options(const std::string& variant) {
  ReducerOptions o;  // not from_env: the test fixes every option
  o.bucket_cap_mb = static_cast<double>(kNumel * 4) / (1024.0 * 1024.0);
  o.first_bucket_cap_mb = 0;
  o.learn_bucket_order = false;
  o.launch_channels = 4;
  o.hierarchical = variant == "hier";
  o.hierarchical_node_size = 2;
  o.name = "ulfm-dp";
  return o;
}

std::unique_ptr<Reducer> make_reducer(Model& model, const std::string& variant) {
  auto r = std::make_unique<Reducer>(world(), reducer_options(variant));
  for (int i = 0; i < kParams; ++i)
    r->add_parameter("p" + std::to_string(i), Tensor::of(model.param[i]),
                     Tensor::of(model.grad[i]));
  r->build();
  r->broadcast_parameters(0);
  return r;
}

// One backward pass: gradients ready last parameter first (bucket 0 first);
// a rank planned to die at `step` does so after half of them.
void backward(Reducer& reducer, Model& model, int start_rank, const std::string& dir,
              bool dies_mid_backward) {
  model.fill_grads(start_rank);
  for (int i = kParams - 1; i >= 0; --i) {
    if (dies_mid_backward && i == kParams / 2 - 1) die(dir, start_rank);
    reducer.grad_ready(i);
  }
}

bool planned(const std::vector<Kill>& kills, int start_rank, int64_t step) {
  for (const Kill& k : kills)
    if (k.rank == start_rank && k.at == step) return true;
  return false;
}

std::vector<int> dying_at(const std::vector<Kill>& kills, int64_t step) {
  std::vector<int> out;
  for (const Kill& k : kills)
    if (k.at == step) out.push_back(k.rank);
  return out;
}

int run_reducer(const std::string& dir, const std::vector<Kill>& kills, const std::string& variant,
                std::ofstream& res) {
  const int me = rank();
  Members m;
  Model model;
  auto reducer = make_reducer(model, variant);
  int recoveries = 0;
  for (int64_t step = 1; step <= kSteps;) {
    try {
      backward(*reducer, model, me, dir, planned(kills, me, step));
      EXPECT(reducer->synchronize(), "step ", step, " did not reduce");
    } catch (const Error& e) {
      const std::vector<int> dead = dying_at(kills, step);
      EXPECT(!dead.empty(), "step ", step, ": unexpected ", e.what());
      res << expect_loss_and_recover(e, dir, m, dead, cat("step ", step)) << std::endl;
      ++recoveries;
      reducer.reset();  // its groups were released by recover(): build anew
      reducer = make_reducer(model, variant);
      continue;  // the step again, at the new size
    }
    for (int i = 0; i < kParams; ++i)
      for (int64_t j = 0; j < kNumel; ++j)
        EXPECT(near(model.grad[i][j], Model::average(m, i, j)), "step ", step, " size ", size(),
               ": gradient ", i, "[", j, "] = ", model.grad[i][j], ", closed form ",
               Model::average(m, i, j));
    ++step;
  }
  const ReducerStats st = reducer->stats();
  res << "steps_on_last_reducer=" << st.steps << " recoveries=" << recoveries
      << " final_size=" << size() << std::endl;
  return 0;
}

int run_zero(const std::string& dir, const std::vector<Kill>& kills, std::ofstream& res) {
  const int me = rank();
  Members m;
  Model model;
  optim::Hyper sgd;
  sgd.kind = optim::Kind::kSgd;
  sgd.lr = 0.25f;
  std::unique_ptr<Reducer> reducer = make_reducer(model, "flat");
  auto opt = std::make_unique<ShardedOptimizer>(*reducer, sgd, ShardedOptimizerOptions{});
  // The closed form: p0 - lr * (sum of the completed steps' averages).
  std::vector<std::vector<double>> want(kParams, std::vector<double>(kNumel));
  for (int i = 0; i < kParams; ++i)
    for (int64_t j = 0; j < kNumel; ++j) want[i][j] = static_cast<double>(j % 64);
  int recoveries = 0;
  for (int64_t step = 1; step <= kSteps;) {
    try {
      backward(*reducer, model, me, dir, false);
      EXPECT(reducer->synchronize(), "step ", step, " did not reduce");
      if (planned(kills, me, step)) die(dir, me);  // reduce-scattered, not gathered
      opt->step();
    } catch (const Error& e) {
      const std::vector<int> dead = dying_at(kills, step);
      EXPECT(!dead.empty(), "step ", step, ": unexpected ", e.what());
      res << expect_loss_and_recover(e, dir, m, dead, cat("step ", step)) << std::endl;
      ++recoveries;
      opt.reset();  // before its reducer
      reducer.reset();
      // The parameters of the last completed step, as rank 0 holds them
      // (no all-gather of the failed step completed anywhere).
      reducer = make_reducer(model, "flat");
      opt = std::make_unique<ShardedOptimizer>(*reducer, sgd, ShardedOptimizerOptions{});
      for (int i = 0; i < kParams; ++i)
        for (int64_t j = 0; j < kNumel; ++j)
          EXPECT(near(model.param[i][j], want[i][j]), "after recovery at step ", step,
                 ": parameter ", i, "[", j, "] = ", model.param[i][j], ", closed form ",
                 want[i][j]);
      continue;
    }
    for (int i = 0; i < kParams; ++i)
      for (int64_t j = 0; j < kNumel; ++j) {
        want[i][j] -= 0.25 * Model::average(m, i, j);
        EXPECT(near(model.param[i][j], want[i][j]), "step ", step, " size ", size(),
               ": parameter ", i, "[", j, "] = ", model.param[i][j], ", closed form ",
               want[i][j]);
      }
    ++step;
  }
  res << "zero_steps=" << opt->steps() << " recoveries=" << recoveries
      << " final_size=" << size() << std::endl;
  return 0;
}

// --- ckpt -------------------------------------------------------------------

struct CkptModel : SlicedState {
  CkptModel() : SlicedState(0.0) {}
  void set(int64_t step) {
    for (size_t k = 0; k < w.size(); ++k)
      w[k] = static_cast<double>(step * 10 + static_cast<int64_t>(k));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<double>(step * 100 + offset + static_cast<int64_t>(i));
  }
  void expect(int64_t step, const std::string& where) const {
    for (size_t k = 0; k < w.size(); ++k)
      EXPECT(w[k] == static_cast<double>(step * 10 + static_cast<int64_t>(k)), where, ": w[", k,
             "] = ", w[k], " not step ", step, "'s");
    for (size_t i = 0; i < v.size(); ++i)
      EXPECT(v[i] == static_cast<double>(step * 100 + offset + static_cast<int64_t>(i)), where,
             ": v[", offset + static_cast<int64_t>(i), "] = ", v[i], " not step ", step, "'s");
  }
};

// `point`: where rank 2 dies in step 3's save (a TUTTI_FAULT_INJECT point):
// mid_shard_write (nothing is published) or after_agree (every shard was
// durable and reported: rank 0 publishes step 3 without it).
int run_ckpt(const std::string& dir, const std::string& ckpt_dir, const std::string& point,
             std::ofstream& res) {
  const bool published = point == "after_agree";
  const int me = rank();
  constexpr int kVictim = 2;
  Members m;
  CkptModel model;
  model.shard();
  CheckpointOptions opts;
  opts.dir = ckpt_dir;
  opts.async = true;
  opts.keep_last = 5;
  auto ckpt = std::make_unique<CheckpointManager>(world(), opts);
  const Components parts = {{"model", &model}};
  for (int64_t step = 1; step <= 2; ++step) {
    model.set(step);
    ckpt->save(step, parts);
    ckpt->wait();
  }
  // Step 3: the victim's writer thread dies half-way through its shard.
  model.set(3);
  if (me == kVictim) {
    setenv("TUTTI_FAULT_INJECT", (point + ":action=kill").c_str(), 1);
    config::reload();
    std::ofstream(dir + "/killed.rank" + std::to_string(me)) << std::fixed << wall_now() << "\n";
  }
  const double t0 = wall_now();
  ckpt->save(3, parts);
  // The next collectives on the world, as a training loop would issue them
  // while the save is written; they end once the victim is dead.
  std::string failed_in;
  Error first(ErrorCode::kInternal, "none");
  for (int it = 0; it < 100000 && failed_in.empty(); ++it) {
    double x = 1;
    try {
      world()->allreduce(Tensor::of(&x, 1), ReduceOp::kSum, {"after save"});
      EXPECT(x == 4, "all-reduce ", it, " during the save: ", x);
    } catch (const Error& e) {
      failed_in = "allreduce";
      first = e;
    }
  }
  try {
    ckpt->wait();
    EXPECT(published, "the save of step 3 completed although rank ", kVictim, " died writing it");
  } catch (const Error& e) {
    EXPECT(e.code() == ErrorCode::kRanksLost, "the save's wait(): expected kRanksLost, got code ",
           static_cast<int>(e.code()), ": ", e.what());
    if (failed_in.empty()) {
      failed_in = "wait";
      first = e;
    }
  }
  EXPECT(!failed_in.empty(), "rank ", kVictim, "'s death was not seen");
  const double detect = wall_now() - t0;
  EXPECT(detect < kBoundS, "the loss surfaced ", detect, " s after the save began");
  ckpt.reset();  // its communicator was revoked; rank 0's directory lock goes with it
  res << expect_loss_and_recover(first, dir, m, {kVictim}, failed_in) << std::endl;
  // A half-written step 3 is never taken as complete; a published one is.
  const int64_t newest = published ? 3 : 2;
  ckpt = std::make_unique<CheckpointManager>(world(), opts);
  model.shard();
  model.set(0);
  const std::optional<int64_t> loaded = ckpt->load_latest(parts);
  EXPECT(loaded && *loaded == newest, "after recovery the newest complete step is ",
         loaded ? *loaded : -1, ", expected ", newest);
  model.expect(newest, "the newest complete step loaded at 3 ranks");
  for (const CheckpointInfo& c : ckpt->list())
    EXPECT(c.step != 3 || c.complete == published, "step 3 is listed ",
           c.complete ? "complete" : "incomplete", ": ", c.path);
  // The next save after recovery succeeds (step 3 again where it was lost).
  const int64_t next = newest + 1;
  model.set(next);
  ckpt->save(next, parts);
  ckpt->wait();
  model.set(0);
  const std::optional<int64_t> again = ckpt->load_latest(parts);
  EXPECT(again && *again == next, "the save after recovery loads as ", again ? *again : -1);
  model.expect(next, "the save after recovery, loaded at 3 ranks");
  if (rank() == 0)
    for (const CheckpointInfo& c : ckpt->list())
      if (c.step == next) {
        const std::string problem = verify_checkpoint(c.path);
        EXPECT(problem.empty(), "step ", next, " after recovery does not verify: ", problem);
      }
  res << "loaded_after_recovery=" << newest << " saved=" << next << " final_size=" << size()
      << std::endl;
  return 0;
}

// --- shrink -----------------------------------------------------------------

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// All-reduces on the world for iterations [from, to); the start rank
// `victim` dies at `die_at`.  Returns true with the error when one fails.
bool loop_until_loss(const Members& m, int from, int to, int victim, int die_at,
                     const std::string& dir, Error* out) {
  const int me = m.start[static_cast<size_t>(rank())];
  for (int it = from; it < to; ++it) {
    if (me == victim && it == die_at) die(dir, me);
    double v = static_cast<double>(me + 1);
    try {
      world()->allreduce(Tensor::of(&v, 1), ReduceOp::kSum, {"loop"});
    } catch (const Error& e) {
      *out = e;
      return true;
    }
    EXPECT(v == static_cast<double>(m.weight()), "iteration ", it, ": ", v, " expected ",
           m.weight());
  }
  return false;
}

int run_shrink(const std::string& dir, const std::string& when, std::ofstream& res) {
  const int me = rank();
  Members m;
  Error e(ErrorCode::kInternal, "none");
  EXPECT(loop_until_loss(m, 0, 100, 2, 10, dir, &e), "rank 2's death was not seen");
  // The second victim, start rank 3, dies while the others recover.
  if (me == 3 && when == "in-shrink") {
    // Once ranks 0 and 1 are about to enter recover() (and so its shrink,
    // which waits for this rank), then a little later.
    for (int i = 0; i < 5000; ++i) {
      if (exists(dir + "/recovering.rank0") && exists(dir + "/recovering.rank1")) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    die(dir, me);
  }
  if (me == 3) mpi::ulfm::set_shrink_test_hook([&](int attempt) {
    if (attempt == 1) die(dir, me);
  });
  std::ofstream(dir + "/recovering.rank" + std::to_string(me)) << "\n";
  const std::string line = expect_loss_and_recover(e, dir, m, {2, 3}, "recover");
  res << line << std::endl;
  if (when == "before-agree")
    EXPECT(line.find("attempts=1 ") == std::string::npos,
           "rank 3 died between the shrink and its agreement, yet one shrink sufficed: ", line);
  // Two ranks left; rank 1 dies: a second recovery, to one.
  EXPECT(loop_until_loss(m, 100, 200, 1, 120, dir, &e), "rank 1's death was not seen");
  res << expect_loss_and_recover(e, dir, m, {1}, "second") << std::endl;
  EXPECT(!loop_until_loss(m, 200, 210, -1, -1, dir, &e), "a world of one failed: ", e.what());
  res << "final_size=" << size() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: ulfm_ops_probe reducer|zero|ckpt|shrink DIR ARG [VARIANT]\n");
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2], arg = argv[3];
  return probe_main("ulfm_ops_probe", dir, [&](std::ofstream& res) {
    RecoveryScope scope;
    if (mode == "reducer")
      return run_reducer(dir, parse_kills(arg.c_str()), argc > 4 ? argv[4] : "flat", res);
    if (mode == "zero") return run_zero(dir, parse_kills(arg.c_str()), res);
    if (mode == "ckpt")
      return run_ckpt(dir, arg, argc > 4 ? argv[4] : "mid_shard_write", res);
    if (mode == "shrink") return run_shrink(dir, arg, res);
    throw Fail{"unknown mode " + mode};
  });
}
