// Exclusive use of a checkpoint directory by one job.
//
// <root>/tutti.lock holds an flock(LOCK_EX) for as long as the job's rank 0
// has a CheckpointManager on the directory, and a JSON record of its owner
// {"host", "pid", "job", "since"}.  The kernel drops an flock when its
// process dies (SIGKILL included), so a dead owner never blocks the next job
// and no stale-lock heuristics are needed on a local file system; on NFS the
// lock is a lease the server expires after the dead client's grace period.
// The file stays after the job ends: its presence also says that a job used
// this directory before (CheckpointOptions::fresh_start).
//
// Managers of one process share the lock (a process-wide registry keyed by
// the lock file's device and inode and the pid): one process is one job.
#pragma once

#include <memory>
#include <string>

namespace tutti {
namespace ckpt {

constexpr const char* kLockName = "tutti.lock";

class DirLock {
 public:
  // Creates `root` if missing and takes its lock for this process, or
  // returns the one this process already holds.  Error(kInvalidArgument)
  // naming the owner (job, host, pid, since) when another process holds it;
  // kIo when the file cannot be created.  A file system without flock
  // (ENOLCK, EOPNOTSUPP) logs a warning and runs unlocked.
  static std::shared_ptr<DirLock> acquire(const std::string& root, const std::string& job,
                                          unsigned file_mode = 0600,
                                          unsigned dir_mode = 0700);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  // The lock file existed before this process took it (a job used the
  // directory before).
  bool existed_before() const { return existed_before_; }

 private:
  DirLock() = default;
  int fd_ = -1;
  bool existed_before_ = false;
  std::string key_;
};

// The job name recorded in the lock: TUTTI_JOB_ID, else SLURM_JOB_ID, else
// "<host>:<pid>" of this process.
std::string default_job_id();

}  // namespace ckpt
}  // namespace tutti
