// The memory tier's store: one job's directory in node-local shared memory
// (issue 28; docs/checkpoint.md, "Memory tier").
//
// A commit written there outlives the process that wrote it, so a rank
// restarted on the same host reloads it from RAM instead of from the
// durable checkpoint.  The store only owns the directory; what is written
// in it is an ordinary checkpoint (CheckpointManager on store->dir()).
//
//   <root>/tutti-<uid>/<job>/          root: TUTTI_MEM_DIR (/dev/shm)
//                        owner.lock    every process of the job on this
//                                      node holds flock(LOCK_SH) on it
//
// Isolation: the per-user directory is 0700 and must be a real directory
// owned by this user (/dev/shm is world-writable: a symlink or another
// user's directory planted there is refused, never worked through); the job's
// directory is named after the job (TUTTI_JOB_ID, which tutti-run keeps
// across its restarts, else SLURM_JOB_ID), so two jobs on one node never
// read each other's commits.  Files are 0600 (CheckpointOptions' modes).
//
// Cleanup: a job directory whose owner.lock nobody holds belongs to no
// live process (the kernel drops an flock when its holder dies, SIGKILL
// included).  sweep_stale() removes such directories of this user except
// the current job's, whose restart is what the tier is for; tutti-run
// sweeps before each start and removes its job's directory when the run
// ends, and a job that finishes removes its own (MemoryStore::remove()).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tutti {
namespace ckpt {

struct MemoryStoreConfig {
  std::string root;           // "": TUTTI_MEM_DIR
  std::string job;            // "": memory_job_id() (must be non-empty then)
  uint64_t budget_bytes = 0;  // 0: TUTTI_MEM_BUDGET_MB, and if that is 0 half
                              // the file system's free space when opened
};

// The job id the tier keys on: TUTTI_JOB_ID, else SLURM_JOB_ID, else "" (no
// id that survives a restart: the tier is not used).
std::string memory_job_id();

// `job` as a directory name: itself when it is 1-64 characters of
// [A-Za-z0-9._-] and not "." or "..", else "job-" and a hash of it.
std::string memory_job_key(const std::string& job);

class MemoryStore {
 public:
  // Creates (or re-opens after a restart) this job's directory on this node
  // and holds it for the life of the returned object (shared by every
  // store of the process on the same directory).  kInvalidArgument when the
  // per-user directory is not a directory owned by this user with mode
  // 0700 (a planted symlink, another user's directory) or no job id is
  // known; kIo when it cannot be created.
  static std::shared_ptr<MemoryStore> open(const MemoryStoreConfig& config = {});
  ~MemoryStore();
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  const std::string& dir() const { return dir_; }
  const std::string& job() const { return job_; }
  uint64_t budget() const { return budget_; }
  // Bytes in files under dir() now.
  uint64_t used() const;
  // Whether `more` bytes fit the budget; *why says why not.
  bool fits(uint64_t more, std::string* why) const;
  // Removes the job's directory (the job ended cleanly).  The store stays
  // usable only for dir() queries.
  void remove();

 private:
  MemoryStore() = default;
  std::string dir_, job_;
  uint64_t budget_ = 0;
  int fd_ = -1;
};

// Bytes in regular files under `path` (0 for a missing one; entries removed
// meanwhile are skipped).
uint64_t directory_bytes(const std::string& path);

// Whether `path` is the memory tier this process opened (open_memory_tier)
// or lies below it: a CheckpointManager there keeps each host's commits in
// that host's store (memory_replica.h).
bool in_memory_tier(const std::string& path);

// This user's per-user directory under `root` ("" : TUTTI_MEM_DIR).
std::string memory_user_dir(const std::string& root = "");

// Removes this user's job directories under `root` that no live process
// holds, except `keep_key` (a memory_job_key; "" keeps none).  Returns the
// removed directories.  A directory without owner.lock counts as stale once
// older than `young_s` seconds (a process may be creating it).  Errors on
// single entries are logged and skipped: a sweep never fails a job.
std::vector<std::string> sweep_stale(const std::string& root, const std::string& keep_key,
                                     double young_s = 60);

}  // namespace ckpt
}  // namespace tutti
