// Horovod elastic's loop for C++ training code (docs/elastic.md, "C++"):
// commits that a restarted job resumes from, with no checkpoint directory
// needed on one host (the memory tier), and a stop at a commit when a
// preemption notice or tutti-run's resize request arrives.
//
//   tutti::ElasticState state(tutti::world(), {{"model", &model}, {"opt", &opt}});
//   state.on_reset([&] { lr = base_lr * tutti::size(); });
//   return tutti::elastic_run(state, [&](tutti::ElasticState& s) {
//     for (int64_t step = s.step() + 1; step <= steps; ++step) {
//       train_step();
//       if (step % 10 == 0) s.commit(step, position_json);
//     }
//   });
//
// Run it under tutti-run: a killed rank ends the job and tutti-run starts it
// again, which resumes from the last commit; a notice (SIGUSR1 from
// tutti-run, a cloud's metadata, the trigger file) stops every rank at the
// same commit with exit code 75, and tutti-run starts it again (at a new
// size in elastic mode).  With ULFM (Open MPI 5 under `mpiexec --with-ft
// ulfm`) a killed rank on a live host costs no restart: elastic_run
// recovers in the process (tutti::recover(), recovery.h), loads the newest
// commit at the smaller size, runs the reset callbacks and calls the
// function again.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "tutti/checkpoint.h"
#include "tutti/export.h"
#include "tutti/preemption.h"
#include "tutti/process_group.h"

namespace tutti {

struct ElasticOptions {
  // Commits go to the memory tier (node-local shared memory, copied to a
  // buddy on the next host; open_memory_tier()) and, as the safety net, to
  // this directory, else TUTTI_CKPT_DIR, when one is set (docs/elastic.md,
  // "Commits: the memory tier and the directory").  A load takes the newest
  // commit complete in either.
  std::string ckpt_dir;
  // Commits kept in the directory (<= 0: TUTTI_CKPT_KEEP); the memory tier
  // keeps 1 beside a directory, else keep_last (at least 1).
  int keep_last = 0;
  // With a directory: every how many commits also go to it while the memory
  // tier keeps them (<= 0: TUTTI_COMMIT_DURABLE_EVERY, default 1: every one).
  int durable_every = 0;
  // With a directory: whether commits go to the memory tier too (-1:
  // TUTTI_COMMIT_MEMORY, default 1).  Without one it is always used.
  int memory_tier = -1;
  // The program's own PreemptionMonitor (one per process owns the signals);
  // null: ElasticState makes one with the TUTTI_PREEMPT_* settings.
  PreemptionMonitor* monitor = nullptr;
  // A TP x DP job (tutti::ProcessMesh with this tp_size over the world): a
  // recovery drops a TP group that lost a member as a whole DP replica; its
  // survivors end their process with exit code 0 (logged), the others go
  // on (recover(RecoveryOptions), recovery.h; docs/elastic.md, "Tensor
  // parallel jobs").  Rebuild the mesh and its layers in a reset callback.
  // 1: no tensor parallelism.
  int tp_size = 1;
};

class TUTTI_API ElasticState {
 public:
  // Collective over `group`.  kInvalidArgument when no directory is set and
  // the memory tier cannot serve the job (no job id, no room); with a
  // directory that only costs the memory tier (said once at INFO).
  ElasticState(ProcessGroupPtr group, Components components, ElasticOptions options = {});
  ~ElasticState();
  ElasticState(const ElasticState&) = delete;
  ElasticState& operator=(const ElasticState&) = delete;

  // Collective: commits the components as checkpoint `step` with
  // `metadata_json` (a JSON object: the data position, an epoch), written
  // before it returns, then agrees on a stop notice.  Inside elastic_run a
  // stop ends the process with exit code 75 after this commit.  A commit
  // over the memory tier's budget (TUTTI_MEM_BUDGET_MB) goes to the
  // directory only, or without one is not kept, on every rank, said once.
  void commit(int64_t step, const std::string& metadata_json = "{}");
  // Collective: the components go back to the last commit (loaded again;
  // from RAM in the memory tier).  kInvalidArgument when nothing was
  // committed or loaded yet.
  void restore();
  // The last commit's step and metadata (0 and "{}" before the first).
  int64_t step() const;
  const std::string& metadata() const;
  // Where commits go: the memory tier's directory while it serves the job,
  // else the checkpoint directory.
  const std::string& dir() const;
  bool memory_tier() const;
  // Called by elastic_run after a restart (TUTTI_RESTART_COUNT > 0) or when
  // the commit was saved by another number of ranks, in registration order.
  void on_reset(std::function<void()> callback);

  class Impl;

 private:
  friend TUTTI_API int elastic_run(ElasticState&, const std::function<void(ElasticState&)>&);
  std::unique_ptr<Impl> impl_;
};

// Runs `train` once in this process: first loads the newest commit
// (collective; none: a fresh start), calls the reset callbacks when the job
// was restarted or resized, then train(state).  A stop agreed at a commit
// ends the process with exit code 75 (exit_preempted(), after the commit
// landed).  Returns 0 when `train` returns; the memory tier's commits are
// then removed (the job is done).  Errors from `train` propagate, except a
// lost rank (kRanksLost) where recovery_available(): the survivors
// recover(), the reset callbacks run (over the new world, before the load:
// they rebuild groups and re-lay out sharded state for the new size), the
// newest commit is loaded at the new size, and `train` is called again (at
// most once per loss; refused, with the error propagating as before, when
// the state's group is not the world, nothing was committed, or fewer than
// TUTTI_ULFM_MIN_SIZE ranks survive).  With ElasticOptions::tp_size > 1 the
// survivors of a TP group that lost a member do not return: they shut tutti
// down and exit the process with code 0.
TUTTI_API int elastic_run(ElasticState& state, const std::function<void(ElasticState&)>& train);

}  // namespace tutti
