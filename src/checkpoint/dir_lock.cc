#include "checkpoint/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>

#include <nlohmann/json.hpp>

#include "checkpoint/file_util.h"
#include "checkpoint/untrusted_json.h"
#include "core/check.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {
namespace ckpt {
namespace {

std::mutex g_mu;
std::map<std::string, std::weak_ptr<DirLock>>& registry() {
  static auto* r = new std::map<std::string, std::weak_ptr<DirLock>>();
  return *r;
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

// "job 'J' (host H, pid P, since T)" from the owner's record, or what the
// file holds when it is not one.
std::string describe_owner(int fd, const std::string& path) {
  char buf[4096];
  const ssize_t n = ::pread(fd, buf, sizeof(buf), 0);
  if (n <= 0) return "another process (its lock file '" + path + "' names no owner yet)";
  try {
    const auto j = parse_untrusted_json(buf, static_cast<size_t>(n), 3, path);
    return detail::cat("job '", json_string(j, "job", path), "' (host ",
                       json_string(j, "host", path), ", pid ", json_int(j, "pid", path),
                       ", since ", json_string(j, "since", path), ")");
  } catch (const Error&) {
    return "another process (its lock file '" + path + "' is unreadable)";
  }
}

}  // namespace

std::string default_job_id() {
  std::string id = config::get_string("TUTTI_JOB_ID");
  if (id.empty()) {
    const char* slurm = std::getenv("SLURM_JOB_ID");
    if (slurm && *slurm) id = slurm;
  }
  if (id.empty()) id = host_name() + ":" + std::to_string(::getpid());
  return id;
}

std::shared_ptr<DirLock> DirLock::acquire(const std::string& root, const std::string& job,
                                          unsigned file_mode, unsigned dir_mode) {
  make_dirs(root, dir_mode);
  const std::string path = join_path(root, kLockName);
  const bool existed = path_exists(path);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC,
                        static_cast<mode_t>(file_mode));
  if (fd < 0)
    TUTTI_THROW(kIo, "creating the checkpoint directory lock '", path,
                "' failed: ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    TUTTI_THROW(kIo, "stat of '", path, "' failed: ", std::strerror(err));
  }
  // The pid is part of the key: a forked child is another process, and must
  // not inherit its parent's claim.
  const std::string key = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
                          std::to_string(::getpid());
  std::lock_guard<std::mutex> guard(g_mu);
  if (auto held = registry()[key].lock()) {
    ::close(fd);  // closing another descriptor of the file keeps an flock
    return held;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      const std::string owner = describe_owner(fd, path);
      ::close(fd);
      TUTTI_THROW(kInvalidArgument, "checkpoint directory '", root, "' is in use by ",
                  owner, ": one job at a time may use a checkpoint directory (stop "
                  "that job or choose another directory; a dead owner's lock is "
                  "released by the kernel, on NFS once its lease expires)");
    }
    if (err != ENOLCK && err != EOPNOTSUPP && err != ENOSYS) {
      ::close(fd);
      TUTTI_THROW(kIo, "locking '", path, "' failed: ", std::strerror(err));
    }
    TUTTI_LOG(kWarn) << "the file system of '" << root << "' does not support flock ("
                     << std::strerror(err) << "): running without the directory lock, "
                     << "so nothing stops a second job from using it";
  }
  const std::string record =
      nlohmann::json{{"host", host_name()}, {"pid", static_cast<int64_t>(::getpid())},
                     {"job", job}, {"since", utc_now()}}
          .dump(1) + "\n";
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, record.data(), record.size(), 0) != static_cast<ssize_t>(record.size()))
    TUTTI_LOG(kWarn) << "could not record the owner in '" << path
                     << "': " << std::strerror(errno);
  std::shared_ptr<DirLock> lock(new DirLock());
  lock->fd_ = fd;
  lock->key_ = key;
  lock->existed_before_ = existed;
  registry()[key] = lock;
  return lock;
}

DirLock::~DirLock() {
  std::lock_guard<std::mutex> guard(g_mu);
  auto it = registry().find(key_);
  if (it != registry().end() && it->second.expired()) registry().erase(it);
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace ckpt
}  // namespace tutti
