#include "checkpoint/memory_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>

#include "checkpoint/file_util.h"
#include "core/check.h"
#include "tutti/checkpoint.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {
namespace ckpt {
namespace {

constexpr const char* kOwnerLock = "owner.lock";

std::mutex g_mu;
// Stores open in this process, by directory (one hold per process).
std::map<std::string, std::weak_ptr<MemoryStore>>& registry() {
  static auto* r = new std::map<std::string, std::weak_ptr<MemoryStore>>();
  return *r;
}

std::string root_or_setting(const std::string& root) {
  std::string r = root.empty() ? config::get_string("TUTTI_MEM_DIR") : root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  TUTTI_ARG_CHECK(!r.empty(), "memory tier: TUTTI_MEM_DIR is empty");
  return r;
}

// mkdir 0700 (an existing one is fine), then: a real directory, ours, not
// open to others.  Never follows a symlink planted at `path`.
void own_private_dir(const std::string& path, bool fix_mode) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
    TUTTI_THROW(kIo, "memory tier: creating '", path, "' failed: ", std::strerror(errno));
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0)
    TUTTI_THROW(kIo, "memory tier: stat of '", path, "' failed: ", std::strerror(errno));
  TUTTI_ARG_CHECK(S_ISDIR(st.st_mode), "memory tier: '", path, "' is not a directory (",
                  S_ISLNK(st.st_mode) ? "a symbolic link" : "another kind of file",
                  "); it is not followed: remove it or set TUTTI_MEM_DIR elsewhere");
  TUTTI_ARG_CHECK(st.st_uid == ::getuid(), "memory tier: '", path, "' belongs to user ",
                  st.st_uid, ", not to this user (", ::getuid(), "); it is not used: "
                  "remove it or set TUTTI_MEM_DIR elsewhere");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 0777));
    TUTTI_ARG_CHECK(fix_mode && ::chmod(path.c_str(), 0700) == 0, "memory tier: '", path,
                    "' is open to other users (mode ", mode, "); it must be 0700");
  }
}

// TUTTI_MEM_DIR itself: a directory that other users cannot rename our
// entries in (sticky, like /dev/shm and /tmp, or not writable by others),
// else a planted symlink could stand in for our per-user directory.
void check_root(const std::string& root) {
  struct stat st;
  TUTTI_ARG_CHECK(::stat(root.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "memory tier: "
                  "TUTTI_MEM_DIR '", root, "' is not a directory");
  TUTTI_ARG_CHECK(!(st.st_mode & S_IWOTH) || (st.st_mode & S_ISVTX), "memory tier: "
                  "TUTTI_MEM_DIR '", root, "' is writable by every user without the sticky "
                  "bit, so another user could replace this user's directory in it; use "
                  "/dev/shm or a directory with mode 1777 or 0755");
}

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace

uint64_t directory_bytes(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return 0;
  if (!S_ISDIR(st.st_mode)) return S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
  std::vector<std::string> names;
  try {
    names = list_dir(path);
  } catch (const Error&) {
    return 0;  // removed meanwhile
  }
  uint64_t total = 0;
  for (const std::string& n : names) total += directory_bytes(join_path(path, n));
  return total;
}

std::string memory_job_id() {
  std::string id = config::get_string("TUTTI_JOB_ID");
  if (id.empty()) {
    const char* slurm = std::getenv("SLURM_JOB_ID");
    if (slurm && *slurm) id = slurm;
  }
  return id;
}

std::string memory_job_key(const std::string& job) {
  bool plain = !job.empty() && job.size() <= 64 && job != "." && job != "..";
  for (char c : job)  // ASCII only, whatever the locale (tutti-run computes the same)
    plain = plain && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                      (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-');
  if (plain) return job;
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : job) h = (h ^ c) * 0x100000001b3ull;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "job-%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string memory_user_dir(const std::string& root) {
  return join_path(root_or_setting(root), "tutti-" + std::to_string(::getuid()));
}

std::shared_ptr<MemoryStore> MemoryStore::open(const MemoryStoreConfig& config) {
  const std::string root = root_or_setting(config.root);
  const std::string job = config.job.empty() ? memory_job_id() : config.job;
  TUTTI_ARG_CHECK(!job.empty(), "memory tier: no job id that survives a restart (set "
                  "TUTTI_JOB_ID; tutti-run sets it, Slurm's SLURM_JOB_ID also serves)");
  check_root(root);
  const std::string user = memory_user_dir(root);
  own_private_dir(user, /*fix_mode=*/false);
  const std::string key = memory_job_key(job);
  const std::string dir = join_path(user, key);

  std::lock_guard<std::mutex> guard(g_mu);
  if (auto held = registry()[dir].lock()) return held;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    own_private_dir(dir, /*fix_mode=*/true);
    const std::string lock = join_path(dir, kOwnerLock);
    fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
      TUTTI_THROW(kIo, "memory tier: creating '", lock, "' failed: ", std::strerror(errno));
    // Blocks only while a sweep holds it exclusively (a stale directory
    // being removed): then the file is gone from `lock`, and we start over.
    if (::flock(fd, LOCK_SH) != 0) {
      const int err = errno;
      ::close(fd);
      TUTTI_THROW(kIo, "memory tier: locking '", lock, "' failed: ", std::strerror(err));
    }
    struct stat held, named;
    if (::fstat(fd, &held) != 0 || ::lstat(lock.c_str(), &named) != 0 ||
        held.st_ino != named.st_ino || held.st_dev != named.st_dev) {
      ::close(fd);
      fd = -1;
      TUTTI_CHECK(attempt < 5, "memory tier: '", dir, "' kept being removed while opened");
    }
  }
  std::shared_ptr<MemoryStore> s(new MemoryStore());
  s->dir_ = dir;
  s->job_ = job;
  s->fd_ = fd;
  s->budget_ = config.budget_bytes;
  if (!s->budget_) s->budget_ = static_cast<uint64_t>(config::get_int("TUTTI_MEM_BUDGET_MB")) << 20;
  if (!s->budget_) {
    struct statvfs vfs;
    if (::statvfs(root.c_str(), &vfs) == 0)
      s->budget_ = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize / 2;
  }
  registry()[dir] = s;
  return s;
}

MemoryStore::~MemoryStore() {
  std::lock_guard<std::mutex> guard(g_mu);
  auto it = registry().find(dir_);
  if (it != registry().end() && it->second.expired()) registry().erase(it);
  if (fd_ >= 0) ::close(fd_);  // releases the hold
}

uint64_t MemoryStore::used() const { return directory_bytes(dir_); }

bool MemoryStore::fits(uint64_t more, std::string* why) const {
  const uint64_t now = used();
  if (now + more <= budget_) return true;
  if (why)
    *why = detail::cat("the memory tier of this node holds ", mib(now), " in '", dir_,
                       "' and this commit needs ", mib(more), " more, over its budget of ",
                       mib(budget_), " (TUTTI_MEM_BUDGET_MB)");
  return false;
}

void MemoryStore::remove() { remove_tree(dir_); }

std::vector<std::string> sweep_stale(const std::string& root, const std::string& keep_key,
                                     double young_s) {
  std::vector<std::string> removed;
  std::string user;
  std::vector<std::string> names;
  try {
    user = memory_user_dir(root);
    check_root(root_or_setting(root));
    struct stat st;
    if (::lstat(user.c_str(), &st) != 0) return removed;  // nothing made here yet
    // Never through a symlink or another user's directory: ours, 0700 (in a
    // root where others cannot replace it, nobody else can add entries).
    TUTTI_ARG_CHECK(S_ISDIR(st.st_mode) && st.st_uid == ::getuid() && !(st.st_mode & 077),
                    "'", user, "' is not a private directory of this user (a symbolic link, "
                    "another user's, or open to others): not swept");
    names = list_dir(user);
  } catch (const Error& e) {
    TUTTI_LOG(kWarn) << "memory tier: sweep skipped: " << e.message();
    return removed;
  }
  for (const std::string& name : names) {
    if (name == keep_key) continue;
    const std::string dir = join_path(user, name);
    struct stat st;
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid())
      continue;  // not a job directory of ours: left alone
    const std::string lock = join_path(dir, kOwnerLock);
    const int fd = ::open(lock.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    try {
      if (fd < 0) {
        if (errno != ENOENT || std::difftime(std::time(nullptr), st.st_mtime) < young_s) continue;
        remove_tree(dir);
        removed.push_back(dir);
        continue;
      }
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {  // no live holder
        remove_tree(dir);                         // while holding it: no opener slips in
        removed.push_back(dir);
      }
    } catch (const Error& e) {
      TUTTI_LOG(kWarn) << "memory tier: could not remove the stale '" << dir
                       << "': " << e.message();
    }
    if (fd >= 0) ::close(fd);
  }
  for (const std::string& d : removed)
    TUTTI_LOG(kInfo) << "memory tier: removed '" << d << "', left by a job that no longer runs";
  return removed;
}

}  // namespace ckpt

namespace {
std::mutex g_tier_mu;
std::shared_ptr<ckpt::MemoryStore>& tier() {
  static auto* t = new std::shared_ptr<ckpt::MemoryStore>();
  return *t;
}
}  // namespace

MemoryTier open_memory_tier() {
  std::lock_guard<std::mutex> lock(g_tier_mu);
  if (!tier()) {
    const std::string job = ckpt::memory_job_id();
    ckpt::sweep_stale("", job.empty() ? "" : ckpt::memory_job_key(job));
    tier() = ckpt::MemoryStore::open();
  }
  return MemoryTier{tier()->dir(), tier()->job(), tier()->budget()};
}

uint64_t memory_tier_used() {
  std::lock_guard<std::mutex> lock(g_tier_mu);
  return tier() ? tier()->used() : 0;
}

bool memory_tier_has_room(const std::string& commits_dir, uint64_t state_bytes,
                          std::string* why) {
  uint64_t more = state_bytes;
  if (ckpt::is_directory(commits_dir)) {
    const auto all = list_checkpoints(commits_dir);
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      if (!it->complete) continue;
      more = std::max(more, ckpt::directory_bytes(it->path));
      break;
    }
  }
  std::lock_guard<std::mutex> lock(g_tier_mu);
  if (!tier()) {
    if (why) *why = "the memory tier is not open (open_memory_tier)";
    return false;
  }
  return tier()->fits(more, why);
}

void remove_memory_tier() {
  std::lock_guard<std::mutex> lock(g_tier_mu);
  if (tier()) tier()->remove();
}

namespace ckpt {
bool in_memory_tier(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_tier_mu);
  if (!tier()) return false;
  const std::string& d = tier()->dir();
  return path == d || path.compare(0, d.size() + 1, d + "/") == 0;
}
}  // namespace ckpt

}  // namespace tutti
