// Data-parallel training with everything tutti does for spot instances:
// bucketed all-reduce overlapped with backward, gradient compression,
// dynamic loss scaling of float16 gradients, asynchronous checkpoints,
// preemption notices with a coordinated save-and-exit, and exact resume.
//
//   tutti-run -np 4 build/examples/dp_train/dp_train --ckpt-dir /tmp/ckpt
//
// Killed or preempted, the same command (tutti-run does it) resumes from the
// newest committed checkpoint and ends with the parameters an uninterrupted
// run ends with, bit for bit.  Rank 0 prints one line per --log-every steps
// and, with --log FILE, appends one JSON object per step and per event for
// scripts/demo_report.py.
//
// Elastic (tutti-run --min-np/--max-np restarts it at another world size):
// the global batch stays the same (per-rank batch = global batch / world
// size), and the data position is the global index of the next sample, so
// a resize neither repeats nor skips a sample (--samples-log FILE records
// what every rank consumed).  The position and the counters that must
// survive restarts (progress.h) travel in the checkpoint's metadata.
#include <tutti/checkpoint.h>
#include <tutti/preemption.h>
#include <tutti/tutti.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "model.h"
#include "progress.h"

namespace {

struct Args {
  int64_t steps = 300;
  int64_t global_batch = 0;  // 0: --batch x world, else the checkpoint's, else 32 x world
  int batch = 0;             // per rank (fixes the per-rank batch instead)
  std::vector<int> widths = {64, 256, 256, 10};
  float lr = 0.05f, momentum = 0.9f;
  std::string compression;  // default: TUTTI_COMPRESSION
  std::string ckpt_dir;     // empty: no checkpoints
  int64_t ckpt_every = 25;
  int keep = 3;
  std::string log;          // JSONL, rank 0
  std::string final_out;    // JSON with the final parameter hash, rank 0
  int log_every = 10;
  int step_sleep_ms = 0;    // slows the demo down so a notice lands mid-run
  double learn_ratio = 0.5; // fail unless the last losses average below this x the first
  double bucket_mb = 0.25;
  int64_t stop_at = 0;       // > 0: commit a checkpoint at this step and exit 0
  std::string samples_log;   // every rank appends the samples it consumed
  std::string params_out;    // rank 0: the float32 master weights, raw
};

std::vector<int> parse_widths(const std::string& s) {
  std::vector<int> w;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) w.push_back(std::atoi(part.c_str()));
  return w;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "dp_train: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--steps") a.steps = std::atoll(next().c_str());
    else if (k == "--batch") a.batch = std::atoi(next().c_str());
    else if (k == "--global-batch") a.global_batch = std::atoll(next().c_str());
    else if (k == "--stop-at") a.stop_at = std::atoll(next().c_str());
    else if (k == "--samples-log") a.samples_log = next();
    else if (k == "--params-out") a.params_out = next();
    else if (k == "--widths") a.widths = parse_widths(next());
    else if (k == "--lr") a.lr = static_cast<float>(std::atof(next().c_str()));
    else if (k == "--compression") a.compression = next();
    else if (k == "--ckpt-dir") a.ckpt_dir = next();
    else if (k == "--ckpt-every") a.ckpt_every = std::atoll(next().c_str());
    else if (k == "--keep") a.keep = std::atoi(next().c_str());
    else if (k == "--log") a.log = next();
    else if (k == "--final") a.final_out = next();
    else if (k == "--log-every") a.log_every = std::atoi(next().c_str());
    else if (k == "--step-sleep-ms") a.step_sleep_ms = std::atoi(next().c_str());
    else if (k == "--learn-ratio") a.learn_ratio = std::atof(next().c_str());
    else if (k == "--bucket-mb") a.bucket_mb = std::atof(next().c_str());
    else {
      std::fprintf(stderr, "dp_train: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The model's master weights and optimizer state, for the checkpoint.
class TrainState : public tutti::Stateful {
 public:
  explicit TrainState(demo::Mlp& m) : m_(m) {}
  tutti::StateDict state_dict() override {
    tutti::StateDict out;
    for (int p = 0; p < m_.num_params(); ++p) {
      out.push_back({"model/" + m_.name(p),
                     tutti::Tensor(m_.master(p).data(), tutti::DType::kFloat32, m_.shape(p))});
      out.push_back({"optimizer/momentum/" + m_.name(p),
                     tutti::Tensor(m_.momentum(p).data(), tutti::DType::kFloat32, m_.shape(p))});
    }
    return out;
  }
  void on_state_loaded() override { m_.refresh_model(); }

 private:
  demo::Mlp& m_;
};

class JsonLog {
 public:
  JsonLog(const std::string& path, bool enabled) {
    if (enabled && !path.empty()) out_.open(path, std::ios::app);
  }
  void write(const std::string& json) {
    if (!out_.is_open()) return;
    out_ << json << "\n";
    out_.flush();
  }

 private:
  std::ofstream out_;
};

// The global batch: --global-batch; else --batch (per rank) x world; else
// the checkpoint's (a resized job keeps it); else 32 x world.
int64_t resolve_global_batch(const Args& a, int size, const demo::Progress* saved) {
  if (a.global_batch > 0) return a.global_batch;
  if (a.batch > 0) return static_cast<int64_t>(a.batch) * size;
  if (saved && saved->global_batch > 0) return saved->global_batch;
  return 32 * static_cast<int64_t>(size);
}

// Why the job stopped at a notice: tutti-run writes resize-requested before
// it asks a job to save and exit so that it can grow (docs/elastic.md).
std::string notice_reason() {
  const char* dir = std::getenv("TUTTI_ELASTIC_DIR");
  if (!dir || !*dir) return "notice";
  std::ifstream f(std::string(dir) + "/resize-requested");
  return f.good() ? "resize" : "notice";
}

void write_params(demo::Mlp& model, const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  for (int p = 0; p < model.num_params(); ++p)
    f.write(reinterpret_cast<const char*>(model.master(p).data()),
            static_cast<std::streamsize>(model.master(p).size() * sizeof(float)));
  if (!f)
    throw tutti::Error(tutti::ErrorCode::kIo, "--params-out '" + path + "': write failed");
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const char* restart_env = std::getenv("TUTTI_RESTART_COUNT");
  const int restart = restart_env ? std::atoi(restart_env) : 0;
  try {
    // First: a notice (or tutti-run's grow request, SIGUSR1) that arrives
    // during start-up must be caught, not end the rank.
    tutti::PreemptionMonitor monitor;
    tutti::init();
    auto world = tutti::world();
    const int rank = world->rank(), size = world->size();
    JsonLog log(a.log, rank == 0);
    auto event = [&](const std::string& kind, const std::string& fields) {
      log.write("{\"t\": " + std::to_string(now()) + ", \"run\": " + std::to_string(restart) +
                ", \"event\": \"" + kind + "\"" + (fields.empty() ? "" : ", " + fields) + "}");
    };
    demo::Task task(a.widths.front(), a.widths.back(), /*seed=*/1);
    demo::Mlp model(a.widths, /*seed=*/7);

    // ---- data parallel: float16 gradients, bucketed, compressed
    tutti::ReducerOptions ro = tutti::ReducerOptions::from_env();
    ro.bucket_cap_mb = a.bucket_mb;
    ro.first_bucket_cap_mb = 0;
    if (!a.compression.empty())
      ro.compressor = a.compression == "none" ? nullptr : tutti::make_compressor(a.compression);
    tutti::Reducer reducer(world, ro);
    std::vector<tutti::Tensor> model_grads, master_grads;
    std::vector<std::string> names;
    for (int p = 0; p < model.num_params(); ++p) {
      tutti::Tensor param(model.model(p).data(), tutti::DType::kFloat16, model.shape(p));
      tutti::Tensor grad(model.grad(p).data(), tutti::DType::kFloat16, model.shape(p));
      reducer.add_parameter(model.name(p), param, grad);
      model_grads.push_back(grad);
      master_grads.push_back(tutti::Tensor(model.master_grad(p).data(), tutti::DType::kFloat32, model.shape(p)));
      names.push_back(model.name(p));
    }
    reducer.build();

    // ---- mixed precision: dynamic loss scale (PyTorch GradScaler defaults,
    // growth every 50 steps so the demo shows it move)
    tutti::amp::LossScalerOptions so;
    so.growth_interval = 50;
    tutti::amp::DynamicLossScaler scaler(so);
    tutti::amp::StepCheckOptions check;
    check.names = names;
    check.groups = {world.get()};  // agree on overflow (cheap; belt and braces)

    // ---- checkpoints: the tensors, and the data position and counters in
    // the metadata
    TrainState train_state(model);
    tutti::Components parts = {{"train", &train_state}, {"scaler", &scaler}, {"reducer", &reducer}};
    if (ro.compressor) parts.push_back({"compressor", ro.compressor.get()});
    std::unique_ptr<tutti::CheckpointManager> ckpt;
    int64_t start = 0;
    demo::Progress prog;
    bool saved_progress = false;
    if (!a.ckpt_dir.empty()) {
      tutti::CheckpointOptions co;
      co.dir = a.ckpt_dir;
      co.keep_last = a.keep;
      ckpt = std::make_unique<tutti::CheckpointManager>(world, co);
      std::string meta;
      if (auto step = ckpt->load_latest(parts, &meta)) {
        start = *step;
        saved_progress = prog.from_json(meta);
      }
    }
    const int64_t global = resolve_global_batch(a, size, saved_progress ? &prog : nullptr);
    if (global <= 0 || global % size != 0) {
      if (rank == 0)
        std::fprintf(stderr,
                     "dp_train: the global batch %lld is not divisible by the world size %d "
                     "(per-rank batch = global batch / world size); pick a global batch that "
                     "every world size the job may run at divides (--global-batch)\n",
                     static_cast<long long>(global), size);
      ckpt.reset();
      tutti::shutdown();
      return 2;
    }
    const int per_rank = static_cast<int>(global / size);
    if (start > 0) {
      if (!saved_progress) prog.position = start * global;  // a checkpoint without metadata
      ++prog.runs;
      if (prog.world > 0 && prog.world != size) ++prog.resizes;
      if (rank == 0) {
        std::printf("[resume] restart %d: resumed from the checkpoint of step %lld at %d ranks "
                    "(saved at %d): sample %lld, global batch %lld (%d per rank)\n",
                    restart, static_cast<long long>(start), size, prog.world,
                    static_cast<long long>(prog.position), static_cast<long long>(global),
                    per_rank);
        if (saved_progress && prog.global_batch != global)
          std::printf("[resume] the global batch changes from %lld to %lld\n",
                      static_cast<long long>(prog.global_batch), static_cast<long long>(global));
      }
      event("resume", "\"step\": " + std::to_string(start) + ", \"world\": " + std::to_string(size) +
                          ", \"saved_world\": " + std::to_string(prog.world) +
                          ", \"position\": " + std::to_string(prog.position));
    }
    prog.global_batch = global;
    prog.world = size;
    if (start == 0) reducer.broadcast_parameters(0);  // every replica starts equal
    if (rank == 0) {
      std::string srcs;
      for (const auto& s : monitor.sources()) srcs += (srcs.empty() ? "" : ",") + s;
      std::printf("[tutti] %d ranks, global batch %lld (%d per rank), compression %s, "
                  "preemption sources %s%s\n",
                  size, static_cast<long long>(global), per_rank,
                  ro.compressor ? ro.compressor->name().c_str() : "none", srcs.c_str(),
                  ckpt ? (", checkpoints in " + a.ckpt_dir).c_str() : "");
      std::fflush(stdout);
    }
    demo::SamplesLog samples(a.samples_log);
    // A start's identity in the samples log (two restarts from one
    // checkpoint have the same counters): rank 0's clock in microseconds.
    int64_t start_id = static_cast<int64_t>(now() * 1e6);
    world->broadcast(tutti::Tensor::of(&start_id, 1), 0);

    const int64_t end = a.stop_at > 0 ? std::min(a.stop_at, a.steps) : a.steps;
    // Saves checkpoint `done` with the progress as of the end of that step.
    auto save = [&](int64_t done, const char* reason, bool blocking) {
      const double t0 = now();
      prog.saved_at = t0;
      ckpt->save(done, parts, prog.to_json());
      if (blocking) ckpt->wait();
      const tutti::SaveStats st = ckpt->last_save_stats();
      const double held = now() - t0;
      prog.ckpt_s += held;
      event("checkpoint", "\"step\": " + std::to_string(done) + ", \"reason\": \"" + reason +
                              "\", \"blocking_s\": " + std::to_string(blocking ? held : st.blocking_s) +
                              ", \"bytes\": " + std::to_string(st.bytes));
      return st;
    };

    std::vector<float> x;
    std::vector<int> y;
    double t_last = now();
    if (start > 0 && prog.saved_at > 0) prog.lost_s += std::max(0.0, t_last - prog.saved_at);
    double first_loss = -1, tail_sum = 0;  // the learning check (runs from step 0)
    int64_t tail_n = 0;
    int64_t steps_since_print = 0;
    uint64_t my_bytes_before = 0;  // this rank's sent bytes, this run
    for (int64_t step = start; step < end; ++step) {
      const double t_step = now();
      const int64_t first = prog.position + static_cast<int64_t>(rank) * per_rank;
      task.batch(first, per_rank, &x, &y);
      // The reducer averages loss-scaled gradients: error-feedback
      // compressors keep their residuals in these units.
      reducer.set_gradient_scale(scaler.scale());
      float loss;
      {
        // The compute track of TUTTI_TIMELINE (the reducer's buckets
        // launch inside this span; docs/timeline.md).
        tutti::timeline::Range compute("forward_backward");
        loss = model.forward_backward(x.data(), y.data(), per_rank, scaler.scale(),
                                      [&](int p) { reducer.grad_ready(p); });
      }
      reducer.synchronize();
      // Unscale into the float32 master gradients and check, in one pass.
      const tutti::amp::NonFiniteReport report =
          tutti::amp::model_grads_to_master(model_grads, master_grads, scaler.inv_scale());
      const bool skip = scaler.agree(report, check);
      if (!skip) model.sgd_step(a.lr, a.momentum);
      const float used_scale = scaler.scale();
      scaler.update();
      const int64_t done = step + 1;
      samples.record(start_id, done, rank, size, first, per_rank);
      const tutti::CompressStats cs =
          ro.compressor ? ro.compressor->stats() : tutti::CompressStats{};
      const uint64_t my_bytes = ro.compressor ? cs.wire_bytes
                                              : static_cast<uint64_t>(reducer.stats().bytes_reduced);
      // Mean loss and the bytes every rank sent this step, in one reduction.
      double sums[2] = {loss, static_cast<double>(my_bytes - my_bytes_before)};
      my_bytes_before = my_bytes;
      world->allreduce(tutti::Tensor::of(sums, 2), tutti::ReduceOp::kSum, {"loss+bytes"});
      loss = static_cast<float>(sums[0] / size);
      prog.bytes_sent += static_cast<uint64_t>(sums[1]);
      prog.position += global;
      if (step == 0) first_loss = loss;
      if (step >= a.steps - 10) {
        tail_sum += loss;
        ++tail_n;
      }
      if (a.step_sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.step_sleep_ms));
      prog.train_s += now() - t_step;
      log.write("{\"t\": " + std::to_string(now()) + ", \"run\": " + std::to_string(restart) +
                ", \"step\": " + std::to_string(done) + ", \"loss\": " + std::to_string(loss) +
                ", \"scale\": " + std::to_string(used_scale) + ", \"skipped\": " +
                (skip ? "true" : "false") + ", \"wire_bytes\": " + std::to_string(cs.wire_bytes) +
                ", \"raw_bytes\": " + std::to_string(cs.uncompressed_bytes) + ", \"samples\": " +
                std::to_string(global) + ", \"world\": " + std::to_string(size) +
                ", \"position\": " + std::to_string(prog.position) + ", \"bytes_sent\": " +
                std::to_string(prog.bytes_sent) + "}");
      ++steps_since_print;
      if (rank == 0 && (done % a.log_every == 0 || done == a.steps)) {
        const double t = now();
        const double sps = steps_since_print * global / std::max(t - t_last, 1e-9);
        t_last = t;
        steps_since_print = 0;
        std::printf("step %5lld/%lld | loss %.4f | scale %-7g | skipped %lld | sent %.2f MB",
                    static_cast<long long>(done), static_cast<long long>(a.steps), loss,
                    used_scale, static_cast<long long>(scaler.skipped_steps()),
                    cs.wire_bytes / 1e6);
        if (cs.wire_bytes) std::printf(" (x%.1f smaller)", double(cs.uncompressed_bytes) / cs.wire_bytes);
        std::printf(" | %.0f samples/s\n", sps);
        std::fflush(stdout);
      }
      // A preemption notice seen by any rank stops every rank at this step.
      if (monitor.should_stop(*world)) {
        const auto notice = monitor.notice();
        const std::string reason = notice_reason();
        if (rank == 0)
          std::printf("[preempt] %s (%s) at step %lld: saving and exiting with %d\n", reason.c_str(),
                      notice ? notice->source.c_str() : "another rank", static_cast<long long>(done),
                      tutti::kPreemptedExitCode);
        event("notice", "\"step\": " + std::to_string(done) + ", \"source\": \"" +
                            (notice ? notice->source : std::string("peer")) + "\", \"reason\": \"" +
                            reason + "\"");
        if (ckpt) {
          save(done, "preemption", /*blocking=*/true);
          if (rank == 0) std::printf("[preempt] checkpoint of step %lld committed\n", static_cast<long long>(done));
        }
        std::fflush(stdout);
        event("exit", "\"step\": " + std::to_string(done) + ", \"code\": " + std::to_string(tutti::kPreemptedExitCode));
        tutti::exit_preempted();
      }
      if (ckpt && done == end && end < a.steps) {
        save(done, "stop", /*blocking=*/true);
        if (rank == 0)
          std::printf("[stop] checkpoint of step %lld committed (--stop-at)\n", static_cast<long long>(done));
      } else if (ckpt && done % a.ckpt_every == 0 && done < a.steps) {
        const tutti::SaveStats st = save(done, "periodic", /*blocking=*/false);  // training goes on
        if (rank == 0)
          std::printf("[ckpt] step %lld saving in the background (blocked %.2f ms)\n",
                      static_cast<long long>(done), st.blocking_s * 1e3);
      }
    }
    if (ckpt) ckpt->wait();
    char hash[32];
    std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(model.hash()));
    // Data-parallel replicas must agree bit for bit.
    uint64_t h = model.hash(), hmin = h, hmax = h;
    world->allreduce(tutti::Tensor(&hmin, tutti::DType::kInt64, tutti::Shape{1}), tutti::ReduceOp::kMin);
    world->allreduce(tutti::Tensor(&hmax, tutti::DType::kInt64, tutti::Shape{1}), tutti::ReduceOp::kMax);
    if (rank == 0) {
      std::printf("[done] %lld steps, parameter hash %s, replicas %s\n", static_cast<long long>(end),
                  hash, hmin == hmax ? "identical" : "DIFFER");
      std::printf("[done] counters: %lld samples, %lld runs (%lld resizes), %.2f MB sent, "
                  "training %.2f s, checkpoints %.2f s, lost to restarts %.2f s\n",
                  static_cast<long long>(prog.position), static_cast<long long>(prog.runs),
                  static_cast<long long>(prog.resizes), prog.bytes_sent / 1e6, prog.train_s,
                  prog.ckpt_s, prog.lost_s);
      if (!a.final_out.empty()) {
        std::ofstream f(a.final_out);
        f << "{\"steps\": " << end << ", \"hash\": \"" << hash << "\", \"skipped\": "
          << scaler.skipped_steps() << ", \"world\": " << size << ", \"progress\": "
          << prog.to_json() << "}\n";
      }
      if (!a.params_out.empty()) write_params(model, a.params_out);
    }
    event("done", "\"step\": " + std::to_string(end) + ", \"hash\": \"" + hash + "\"");
    // A run that started from scratch must have learned something.
    bool learned = true;
    if (first_loss > 0 && tail_n > 0 && a.learn_ratio > 0) {
      const double tail = tail_sum / static_cast<double>(tail_n);
      learned = tail < a.learn_ratio * first_loss;
      if (!learned && rank == 0)
        std::fprintf(stderr, "dp_train: did not learn: loss %.4f at step 1, %.4f over the last %lld "
                     "steps (expected below %.2f x the first)\n", first_loss, tail,
                     static_cast<long long>(tail_n), a.learn_ratio);
    }
    ckpt.reset();  // a CheckpointManager is destroyed before shutdown()
    tutti::shutdown();
    return hmin != hmax ? 1 : learned ? 0 : 4;
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "dp_train: %s\n", e.what());
    return 3;
  }
}
