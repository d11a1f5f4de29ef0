// Checkpoints that survive a spot instance being taken away.
//
//   tutti::CheckpointManager ckpt(tutti::world(), {"/ckpt"});
//   tutti::Components parts = {{"model", &model}, {"optimizer", &opt},
//                              {"scaler", &scaler}};
//   std::string meta;
//   int64_t start = ckpt.load_latest(parts, &meta).value_or(0);  // collective
//   for (int64_t step = start + 1; step <= steps; ++step) {
//     train_step();
//     if (step % 100 == 0) ckpt.save(step, parts, rng_and_data_position_json);
//   }
//   ckpt.wait();
//
// A checkpoint is a directory <dir>/step-<N>/ with safetensors shards
// (readable by any safetensors library) and a manifest.json that names
// every shard with its size and checksum, where each tensor's pieces lie,
// the step, world size and mesh, and the caller's non-tensor state.  In the
// default layout (CheckpointLayout::kOnce) replicated state is written once
// across the job, spread over the ranks, and sharded state by its owners; a
// rank that owns nothing writes no shard.  The commit protocol
// (docs/checkpoint.md):
//   1. every rank writes its shard to a temporary name, fsyncs and renames it;
//   2. the ranks agree that every shard is durable (a failure on any rank
//      raises on every rank; a rank that never answers raises kTimeout on
//      the others after CheckpointOptions::timeout_s);
//   3. rank 0 writes manifest.json (temp, fsync, rename, directory fsync):
//      from this instant the checkpoint exists;
//   4. rank 0 replaces <dir>/latest the same way;
//   5. only then are checkpoints beyond keep_last removed.
// Each manifest names its parent (the checkpoint the job loaded or last
// saved); retention counts and removes only the current timeline's
// checkpoints, and never touches a history this job did not load or write.
// A process killed at any instant leaves either the previous or the new
// checkpoint loadable, never a mix: loading picks the newest directory whose
// manifest (itself checksummed) and shards verify and falls back, with a
// logged reason, to older ones.  A read error (EIO, ESTALE, EMFILE) is not
// corruption: it is retried, then raised on every rank, never a fallback.
//
// The directory must be visible to every rank (a shared or a single-node
// file system), and one job at a time may use it: rank 0 holds an flock on
// <dir>/tutti.lock (owner host, pid and job id inside) while a manager
// exists; a second job's manager raises kInvalidArgument naming the owner.
// The kernel releases the lock when the owner dies.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tutti/export.h"
#include "tutti/process_group.h"
#include "tutti/state.h"

namespace tutti {

// Named components: tensor "<component>/<tensor name>" in the checkpoint.
using Components = std::vector<std::pair<std::string, Stateful*>>;

// Who writes what (docs/checkpoint.md, "Layouts").
enum class CheckpointLayout {
  kFromSetting,  // TUTTI_CKPT_LAYOUT: once or per-rank
  kOnce,         // replicated tensors written once across the job, cut into
                 // chunks spread over the ranks; a dimension-split piece held
                 // by several ranks (TP inside DP) by one of them; flat and
                 // per-rank pieces by their owner (manifest version 3)
  kPerRank,      // every rank writes every tensor it holds (manifest version
                 // 2: what tutti wrote before, readable by older tutti)
};

// What a load that finds no complete checkpoint does (see load_latest).
enum class FreshStart {
  kFromSetting,  // TUTTI_CKPT_FRESH_START: auto, allow or refuse
  kAuto,    // start fresh unless a history is expected: the directory has a
            // `latest` pointer or abandoned checkpoints, or tutti-run
            // restarted the job (TUTTI_RESTART_COUNT > 0) and no earlier
            // job used this directory (no tutti.lock before this one)
  kAllow,   // always start fresh (logged at WARN when a history was expected)
  kRefuse,  // never: the job must resume
};

struct CheckpointOptions {
  // Checkpoint directory, created if missing.  Empty: TUTTI_CKPT_DIR.
  std::string dir;
  // Complete checkpoints to keep; <= 0: TUTTI_CKPT_KEEP.  Never fewer
  // than 1: the newest complete checkpoint is never removed.
  int keep_last = 0;
  // true: save() copies the state into pooled host memory (pinned for CUDA
  // tensors) and returns; a writer thread persists and commits it.  false:
  // save() returns once the checkpoint is committed.
  bool async = true;
  // Bound, in seconds, on how long a rank waits for the others while
  // agreeing on a save or a load; <= 0: TUTTI_CKPT_TIMEOUT.
  double timeout_s = 0;
  // Recorded in the manifest as "mesh" (a JSON object, e.g.
  // {"dp": 4, "tp": 2}).  Empty: {"world_size": <group size>}.
  std::string mesh_json;
  // Write the shards' data with O_DIRECT (4 KiB-aligned, from the snapshot
  // buffer): no second copy in the page cache and no dirty-page throttling,
  // which keeps multi-gigabyte saves fast when a notice leaves seconds.
  // File systems without direct I/O fall back to buffered writes.
  bool direct_io = true;
  // CUDA tensors only: the stream (a cudaStream_t) that produces the state.
  // The snapshot copies wait for it and the stream waits for the copies,
  // without blocking the host.  nullptr: the legacy default stream.
  void* cuda_stream = nullptr;
  // An empty directory where a history is expected (a volume mounted after
  // the job started, a wrong path) must not silently restart training from
  // step 0.
  FreshStart fresh_start = FreshStart::kFromSetting;
  // Permissions of the files and directories tutti creates (less the
  // umask); 0: TUTTI_CKPT_FILE_MODE (0600) and TUTTI_CKPT_DIR_MODE (0700).
  // An existing directory keeps its mode.  Temp files are opened with
  // O_EXCL | O_NOFOLLOW: nothing planted at their names is followed.
  unsigned file_mode = 0;
  unsigned dir_mode = 0;
  // Who writes what; kFromSetting: TUTTI_CKPT_LAYOUT (default once).  Every
  // rank must pass the same value.  Either layout loads into any group size.
  CheckpointLayout layout = CheckpointLayout::kFromSetting;
};

struct LoadOptions {
  // Load exactly this step (no fallback to others); -1: the newest one that
  // verifies.
  int64_t step = -1;
  // Tensor names, or prefixes ending in '/', that may be absent from the
  // checkpoint or stored with another global shape (per-rank state without
  // a ShardInfo::on_resize hook after the world size changed).  Such
  // tensors keep their current contents, with a logged warning.  A per-rank
  // tensor with a hook (error-feedback residuals) goes to its hook instead.
  std::vector<std::string> optional;
  // true: the job resumes from the loaded checkpoint.  Complete checkpoints
  // newer than it (they failed verification, or `step` asked for an older
  // one) form an abandoned timeline: they are renamed abandoned-<name>
  // before load returns, kept for inspection, and never loaded, counted by
  // keep_last or removed by tutti.  false: a read-only load that changes
  // nothing in the directory (evaluation, inspection).
  bool resume = true;
};

struct LoadResult {
  int64_t step = 0;
  std::string name;           // "step-00000020"
  std::string metadata_json;  // what save() was given
  int saved_world_size = 0;   // the group size that wrote it
  std::vector<std::string> skipped;  // optional tensors left unchanged
  // This rank's reads during the whole load (every checkpoint it tried):
  // files opened (shards, and the manifest on rank 0) and bytes read.
  uint64_t files_opened = 0;
  uint64_t bytes_read = 0;
};

struct CheckpointInfo {
  std::string name;  // "step-00000020" or "step-00000020.1"
  std::string path;
  int64_t step = 0;
  bool complete = false;  // has a manifest (it may still fail verification)
};

// Timings of the last save, for benchmarks and logs.
struct SaveStats {
  int64_t step = -1;
  uint64_t bytes = 0;       // this rank's tensor bytes (its whole state)
  uint64_t written_bytes = 0;  // tensor bytes this rank wrote (kOnce: its
                               // share of the job's state; 0: no shard)
  double blocking_s = 0;    // time save() held the caller
  double snapshot_s = 0;    // copying the state into host buffers
  double write_s = 0;       // hashing, writing and fsyncing this rank's shard
  double commit_s = 0;      // from the start of persisting to the commit
  bool direct_io = false;   // the shard's data went out with O_DIRECT
};

class TUTTI_API CheckpointManager {
 public:
  // Collective over `group` (it creates a private communicator, so the
  // writer thread's collectives never interleave with the caller's).
  // Creates the directory and takes its lock (rank 0).  Throws
  // kInvalidArgument on every rank when no directory is configured or
  // another job holds the lock (the message names that job, host and pid).
  CheckpointManager(ProcessGroupPtr group, CheckpointOptions options = {});
  // Waits for an in-flight save; its error, if any, is logged (call wait()
  // first to handle it).  Destroy the manager before tutti::shutdown().
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Collective.  Saves the state as checkpoint `step`.  metadata_json is a
  // JSON object of non-tensor state (RNG states, data-loader position, user
  // metadata), stored in the manifest and returned by load.  Waits for the
  // previous save first and rethrows its error.  With async, returns once
  // the state is copied: the tensors may change afterwards.
  //
  // The state: per-rank tensors with their ShardInfo (replicated, split
  // along a dimension, flat ZeRO-style, or each rank's own: per_rank);
  // names must be unique, and every rank must save the same step.  Errors
  // name the rank, step and tensor.
  void save(int64_t step, const Components& components,
            const std::string& metadata_json = "{}");
  void save(int64_t step, const StateDict& state,
            const std::string& metadata_json = "{}");

  // Blocks until the in-flight save (if any) is committed on every rank;
  // rethrows its error (Error(kIo), kTimeout, ...) once.
  void wait();
  // True while an async save is being written.
  bool in_flight() const;

  // Collective.  Loads the newest checkpoint that verifies into the
  // components' tensors (then calls their on_state_loaded()), resharding
  // when the group size or a tensor's split changed (per-rank tensors saved
  // by another group size go to their ShardInfo::on_resize hook, before
  // on_state_loaded()).  Returns its step, or
  // nullopt when the directory holds no complete checkpoint (the tensors
  // are untouched).  A checkpoint that fails verification is skipped with a
  // logged reason; if none verifies, Error(kCorrupt).  No complete
  // checkpoint where a history is expected (CheckpointOptions::fresh_start)
  // is Error(kNotFound) on every rank, naming the reason.  A checkpoint that
  // does not fit the state (missing tensor, other dtype or global shape) is
  // Error(kMismatch) on every rank.
  std::optional<int64_t> load_latest(const Components& components,
                                     std::string* metadata_json = nullptr,
                                     const LoadOptions& options = {});
  std::optional<int64_t> load_latest(const StateDict& state,
                                     std::string* metadata_json = nullptr,
                                     const LoadOptions& options = {});
  // The same, with everything load_latest reports.
  std::optional<LoadResult> load(const Components& components,
                                 const LoadOptions& options = {});
  std::optional<LoadResult> load(const StateDict& state,
                                 const LoadOptions& options = {});

  // Local (no collective): the newest complete checkpoint's step as seen on
  // this process's file system, without verifying it.
  std::optional<int64_t> latest_step() const;
  // Local: every checkpoint directory, oldest first.
  std::vector<CheckpointInfo> list() const;

  const std::string& dir() const;
  SaveStats last_save_stats() const;

  class Impl;

 private:
  Impl* impl_;
};

// Local helpers for tools and tests (no collectives).
TUTTI_API std::vector<CheckpointInfo> list_checkpoints(const std::string& dir);
// Verifies one checkpoint directory completely: manifest, every shard's
// size, header and per-tensor checksums.  Returns "" when it is valid, else
// the first problem found.
TUTTI_API std::string verify_checkpoint(const std::string& path);

// The memory tier (docs/checkpoint.md, "Memory tier"): this job's directory
// in node-local shared memory (TUTTI_MEM_DIR, /dev/shm), where commits
// outlive the process, so that a rank restarted on the same host reloads
// them from RAM.  A CheckpointManager on `dir` writes and loads them.
struct MemoryTier {
  std::string dir;            // <TUTTI_MEM_DIR>/tutti-<uid>/<job>
  std::string job;            // TUTTI_JOB_ID (tutti-run sets it), else SLURM_JOB_ID
  uint64_t budget_bytes = 0;  // TUTTI_MEM_BUDGET_MB, else half the free space
};
// Local: opens (creates, or finds again after a restart) this job's
// directory on this node and holds it until the process ends; first
// removes this user's directories that no live process holds (killed jobs'
// leftovers).  kInvalidArgument when no job id survives a restart (neither
// TUTTI_JOB_ID nor SLURM_JOB_ID is set) or the per-user directory is not a
// private directory of this user.
TUTTI_API MemoryTier open_memory_tier();
// Local: bytes the job's directory holds on this node now.
TUTTI_API uint64_t memory_tier_used();
// Local: whether the budget holds one more commit beside what the job holds
// now: the larger of the newest complete commit in `commits_dir` and
// `state_bytes` (the tensors about to be saved; a first commit has no
// predecessor).  *why says why not.  false before open_memory_tier().
TUTTI_API bool memory_tier_has_room(const std::string& commits_dir, uint64_t state_bytes,
                                    std::string* why);
// Local: removes the job's directory on this node (the job ended).
TUTTI_API void remove_memory_tier();

}  // namespace tutti
