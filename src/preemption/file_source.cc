// A trigger file as a notice: Kubernetes preStop hooks (and anything else
// that can run `touch`) create or touch TUTTI_PREEMPT_FILE.  A file that
// exists when the monitor starts is a leftover of an earlier run (a
// restart in the same container) and counts only once it changes (touch
// updates its modification time; re-creation changes its inode).
#include <sys/stat.h>

#include "preemption/notice_source.h"
#include "tutti/log.h"

namespace tutti {
namespace preempt {
namespace {

struct Stamp {
  bool exists = false;
  ino_t inode = 0;
  struct timespec mtime {};
  bool operator==(const Stamp& o) const {
    return exists == o.exists && inode == o.inode && mtime.tv_sec == o.mtime.tv_sec &&
           mtime.tv_nsec == o.mtime.tv_nsec;
  }
};

Stamp stamp(const std::string& path) {
  Stamp s;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    s.exists = true;
    s.inode = st.st_ino;
    s.mtime = st.st_mtim;
  }
  return s;
}

class FileSource : public NoticeSource {
 public:
  explicit FileSource(std::string path) : path_(std::move(path)), initial_(stamp(path_)) {
    if (initial_.exists)
      TUTTI_LOG(kWarn) << "preemption trigger file " << path_
                       << " already exists; it counts as a notice only once it is touched "
                          "or re-created";
  }
  const char* name() const override { return "file"; }
  Observation poll() override {
    Observation o;
    const Stamp now = stamp(path_);
    if (now.exists && !(now == initial_)) {
      o.kind = NoticeKind::kStop;
      o.detail = path_;
    }
    return o;
  }

 private:
  std::string path_;
  Stamp initial_;
};

}  // namespace

std::unique_ptr<NoticeSource> make_file_source(const std::string& path) {
  return std::make_unique<FileSource>(path);
}

}  // namespace preempt
}  // namespace tutti
