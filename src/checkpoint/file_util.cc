#include "checkpoint/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "checkpoint/fault_inject.h"
#include "core/check.h"
#include "tutti/config.h"

namespace tutti {
namespace ckpt {
namespace {

[[noreturn]] void io_error(const char* op, const std::string& path, int err) {
  TUTTI_THROW(kIo, op, " '", path, "' failed: ", std::strerror(err));
}

}  // namespace

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

File::File(File&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) {
  o.fd_ = -1;
}

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

File File::create(const std::string& path, unsigned mode) {
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(path.c_str(), flags, static_cast<mode_t>(mode));
  if (fd < 0 && errno == EEXIST) {
    // A leftover of an earlier process with the same name, or something
    // planted there: unlink removes the name (a symlink itself, never its
    // target); O_EXCL then guarantees a file of our own.
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) io_error("removing", path, errno);
    fd = ::open(path.c_str(), flags, static_cast<mode_t>(mode));
  }
  if (fd < 0) io_error("creating", path, errno);
  return File(fd, path);
}

File File::open_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_error("opening", path, errno);
  return File(fd, path);
}

void File::write_all(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Linux writes at most 0x7ffff000 bytes per call; ask for 1 GiB.
    const size_t chunk = n < (size_t{1} << 30) ? n : (size_t{1} << 30);
    const ssize_t w = ::write(fd_, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      io_error("writing", path_, errno);
    }
    if (w == 0) io_error("writing", path_, EIO);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

bool File::open_direct(const std::string& path, File* out) {
#ifdef O_DIRECT
  const int fd = ::open(path.c_str(), O_WRONLY | O_DIRECT | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == EINVAL || errno == EOPNOTSUPP) return false;
    io_error("opening for direct I/O", path, errno);
  }
  *out = File(fd, path);
  return true;
#else
  (void)path;
  (void)out;
  return false;
#endif
}

int File::pwrite_all(const void* data, size_t n, uint64_t offset) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const size_t chunk = n < (size_t{1} << 30) ? n : (size_t{1} << 30);
    const ssize_t w = ::pwrite(fd_, p, chunk, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return 0;
}

void File::pread_all(void* data, size_t n, uint64_t offset) const {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const size_t chunk = n < (size_t{1} << 30) ? n : (size_t{1} << 30);
    const ssize_t r = ::pread(fd_, p, chunk, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      io_error("reading", path_, errno);
    }
    if (r == 0)
      TUTTI_THROW(kCorrupt, "'", path_, "' ends at byte ", offset, " but ", n,
                  " more bytes were expected (truncated file)");
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

void File::sync() {
  if (::fsync(fd_) != 0) io_error("fsync of", path_, errno);
}

uint64_t File::size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) io_error("stat of", path_, errno);
  return static_cast<uint64_t>(st.st_size);
}

void File::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) io_error("closing", path_, errno);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

unsigned permission_mode(unsigned requested, const char* setting) {
  if (requested != 0) {
    TUTTI_ARG_CHECK(requested <= 0777, "checkpoint permission mode ", requested,
                    " (decimal) is not in 0..0777");
    return requested;
  }
  const std::string v = config::get_string(setting);
  char* end = nullptr;
  const unsigned long m = std::strtoul(v.c_str(), &end, 8);
  TUTTI_ARG_CHECK(!v.empty() && *end == '\0' && m > 0 && m <= 0777, setting, "='", v,
                  "' is not an octal mode in 1..0777");
  return static_cast<unsigned>(m);
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void make_dir(const std::string& path, unsigned mode) {
  if (::mkdir(path.c_str(), static_cast<mode_t>(mode)) == 0) return;
  const int err = errno;
  if (err == EEXIST) {
    if (is_directory(path)) return;
    struct stat st;
    const bool link = ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
    const bool target = ::stat(path.c_str(), &st) == 0;
    const char* what = !target                ? "a symbolic link to nothing"
                       : S_ISREG(st.st_mode) ? (link ? "a symbolic link to a regular file"
                                                     : "a regular file")
                                             : "something other than a directory";
    TUTTI_THROW(kIo, "creating directory '", path,
                "' failed: it exists and is not a directory (", what, ")");
  }
  io_error("creating directory", path, err);
}

void make_dirs(const std::string& path, unsigned mode) {
  if (path.empty() || is_directory(path)) return;
  const size_t slash = path.find_last_of('/', path.size() > 1 ? path.size() - 2 : 0);
  if (slash != std::string::npos && slash > 0) make_dirs(path.substr(0, slash), mode);
  make_dir(path, mode);
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_error("opening directory", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) io_error("fsync of directory", dir, err);
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    TUTTI_THROW(kIo, "renaming '", from, "' to '", to, "' failed: ",
                std::strerror(errno));
}

void remove_file(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    io_error("removing", path, errno);
}

void remove_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    io_error("stat of", path, errno);
  }
  if (S_ISDIR(st.st_mode)) {
    for (const auto& name : list_dir(path)) remove_tree(join_path(path, name));
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT)
      io_error("removing directory", path, errno);
  } else {
    remove_file(path);
  }
}

std::vector<std::string> list_dir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) io_error("listing", dir, errno);
  std::vector<std::string> names;
  errno = 0;
  while (struct dirent* e = ::readdir(d)) {
    const char* n = e->d_name;
    if (std::strcmp(n, ".") != 0 && std::strcmp(n, "..") != 0) names.emplace_back(n);
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) io_error("listing", dir, err);
  return names;
}

uint64_t file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) io_error("stat of", path, errno);
  return static_cast<uint64_t>(st.st_size);
}

std::string read_file(const std::string& path, uint64_t max_bytes) {
  File f = File::open_read(path);
  const uint64_t n = f.size();
  if (n > max_bytes)
    TUTTI_THROW(kCorrupt, "'", path, "' has ", n, " bytes; at most ",
                max_bytes, " are accepted");
  std::string s(static_cast<size_t>(n), '\0');
  if (n) f.pread_all(&s[0], s.size(), 0);
  return s;
}

void write_file_atomic(const std::string& dir, const std::string& name,
                       const std::string& content, unsigned mode, const char* fault_mid,
                       const char* fault_sync) {
  const std::string tmp =
      join_path(dir, "." + name + ".tmp." + std::to_string(::getpid()));
  const std::string final_path = join_path(dir, name);
  try {
    File f = File::create(tmp, mode);
    f.write_all(content.data(), content.size());
    if (fault_mid) fault::fault_point(fault_mid);
    if (fault_sync) fault::fault_point(fault_sync);
    f.sync();
    f.close();
    rename_path(tmp, final_path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(dir);
}

}  // namespace ckpt
}  // namespace tutti
