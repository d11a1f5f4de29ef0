// One metadata poller per node.  Azure IMDS allows about 5 requests/s per
// VM (AWS and GCP throttle too), and every rank polling every source
// multiplies the rate by the ranks per node.  The ranks of a node (any
// process of this user on this machine polling the same endpoint) elect a
// poller with an flock on <dir>/tutti-preempt-<uid>-<source>-<url hash>.lock:
// its holder polls the endpoint and publishes each observation in the
// matching .state file (written to a temp name and renamed, so readers never
// see half of it); the others read that file instead of the network.  When
// the poller dies its flock goes with it and the next rank to poll takes
// over.  A state file written before this rank's source was made (a
// leftover of an earlier job: tutti-run restarts within seconds, well
// inside any freshness bound) or older than the freshness bound (a poller
// that stopped) is no notice.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>

#include "preemption/notice_source.h"
#include "tutti/log.h"

namespace tutti {
namespace preempt {
namespace {

class NodeSharedSource : public NoticeSource {
 public:
  NodeSharedSource(std::unique_ptr<NoticeSource> inner, const std::string& dir,
                   const std::string& url, int poll_ms)
      : inner_(std::move(inner)), fresh_s_(std::max(10.0, 5.0 * poll_ms / 1000.0)) {
    ::clock_gettime(CLOCK_REALTIME, &born_);
    char key[160];
    std::snprintf(key, sizeof(key), "tutti-preempt-%u-%s-%016zx", static_cast<unsigned>(::getuid()),
                  inner_->name(), std::hash<std::string>()(url));
    base_ = dir + "/" + key;
    lock_fd_ = ::open((base_ + ".lock").c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (lock_fd_ < 0)
      TUTTI_LOG(kWarn) << "preemption source " << inner_->name() << ": cannot share the poller "
                       << "through " << base_ << ".lock (" << std::strerror(errno)
                       << "); this rank polls the endpoint itself";
  }
  ~NodeSharedSource() override {
    if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the poller's flock
  }
  const char* name() const override { return inner_->name(); }

  Observation poll() override {
    if (lock_fd_ < 0) return inner_->poll();
    if (!leader_ && ::flock(lock_fd_, LOCK_EX | LOCK_NB) == 0) leader_ = true;
    if (leader_) {
      Observation o = inner_->poll();
      publish(o);
      return o;
    }
    return read_published();
  }

 private:
  void publish(const Observation& o) {
    const std::string tmp = base_ + ".state.tmp." + std::to_string(::getpid());
    ::unlink(tmp.c_str());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return;
    const std::string text = std::to_string(static_cast<int>(o.kind)) + "\n" + o.detail;
    const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    if (!ok || ::rename(tmp.c_str(), (base_ + ".state").c_str()) != 0) ::unlink(tmp.c_str());
  }

  Observation read_published() {
    Observation o;
    const std::string path = base_ + ".state";
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return o;
    struct stat st;
    char buf[4096];
    ssize_t n = -1;
    if (::fstat(fd, &st) == 0 && !written_before_born(st.st_mtim) &&
        std::difftime(std::time(nullptr), st.st_mtime) <= fresh_s_)
      n = ::read(fd, buf, sizeof(buf));
    ::close(fd);
    if (n <= 0) return o;
    const std::string text(buf, static_cast<size_t>(n));
    const size_t nl = text.find('\n');
    const int kind = std::atoi(text.substr(0, nl).c_str());
    if (kind <= 0 || kind > static_cast<int>(NoticeKind::kStop)) return o;
    o.kind = static_cast<NoticeKind>(kind);
    o.detail = (nl == std::string::npos ? "" : text.substr(nl + 1)) +
               " (polled by another rank on this node)";
    return o;
  }

  // A file time at or after born_ was written by a poller of this job (a
  // coarse file clock may only make a fresh file look older: that delays
  // it by one poll, never the other way round).
  bool written_before_born(const timespec& t) const {
    return t.tv_sec < born_.tv_sec || (t.tv_sec == born_.tv_sec && t.tv_nsec < born_.tv_nsec);
  }

  std::unique_ptr<NoticeSource> inner_;
  double fresh_s_;
  timespec born_{};
  std::string base_;
  int lock_fd_ = -1;
  bool leader_ = false;
};

}  // namespace

std::unique_ptr<NoticeSource> make_node_shared(std::unique_ptr<NoticeSource> inner,
                                               const std::string& dir, const std::string& url,
                                               int poll_ms) {
  if (dir.empty() || dir == "none") return inner;
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    TUTTI_LOG(kWarn) << "preemption: TUTTI_PREEMPT_SHARE_DIR '" << dir
                     << "' is not a directory; every rank polls its endpoints itself";
    return inner;
  }
  return std::make_unique<NodeSharedSource>(std::move(inner), dir, url, poll_ms);
}

}  // namespace preempt
}  // namespace tutti
