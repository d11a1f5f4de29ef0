// POSIX file operations for the checkpoint protocol, each failing with
// Error(kIo) that names the path, the operation and errno's text.
//
// Durability rules the protocol relies on (POSIX + Linux ext4/xfs):
//  * data reaches the disk only after fsync() of the file succeeded;
//  * a rename() is atomic for readers and durable after fsync() of the
//    directory holding the new name;
//  * a failed fsync() means the data may be lost: the caller must not
//    publish it (no retry: the kernel may have dropped the dirty pages).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tutti {
namespace ckpt {

// Default permissions of what tutti creates (CheckpointOptions::file_mode,
// dir_mode; TUTTI_CKPT_FILE_MODE, TUTTI_CKPT_DIR_MODE).
constexpr unsigned kFileMode = 0600;
constexpr unsigned kDirMode = 0700;

// An owned file descriptor.
class File {
 public:
  File() = default;
  ~File();
  File(File&& o) noexcept;
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Creates `path` for writing with O_EXCL | O_NOFOLLOW and `mode` (less
  // the umask): a file or a symlink planted at the name is unlinked (never
  // followed) and the creation retried once, so tutti never writes through
  // a link into another file.
  static File create(const std::string& path, unsigned mode = kFileMode);
  static File open_read(const std::string& path);
  // Opens an existing file for O_DIRECT writes; false (and no file) where the
  // file system does not support direct I/O (tmpfs, some FUSE and network
  // file systems).
  static bool open_direct(const std::string& path, File* out);

  // Writes all bytes (retrying short writes and EINTR).
  void write_all(const void* data, size_t n);
  // The same at `offset`; returns 0 or the errno of the failure (no throw),
  // so that a direct-I/O caller can fall back on EINVAL.
  int pwrite_all(const void* data, size_t n, uint64_t offset);
  // Reads exactly n bytes at `offset`; kCorrupt if the file ends first.
  void pread_all(void* data, size_t n, uint64_t offset) const;
  void sync();  // fsync; kIo on failure
  uint64_t size() const;
  // close(); an error here (NFS reports deferred write errors on close) is
  // kIo too.  The destructor closes silently.
  void close();
  const std::string& path() const { return path_; }
  bool is_open() const { return fd_ >= 0; }
  int fd() const { return fd_; }

 private:
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// "2026-01-31T12:00:00Z"
std::string utc_now();

// `requested` when non-zero, else the octal setting `setting` ("0600");
// kInvalidArgument when not in 0..0777.
unsigned permission_mode(unsigned requested, const char* setting);

std::string join_path(const std::string& dir, const std::string& name);
bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
// mkdir; an existing directory is fine (its mode is left as it is).  Any
// failure is Error(kIo); something else at `path` (a regular file, a
// symlink to one) is named as such rather than as "File exists".
void make_dir(const std::string& path, unsigned mode = kDirMode);
// Creates the directory and missing parents (a parent that is a file is
// reported by make_dir as that parent).
void make_dirs(const std::string& path, unsigned mode = kDirMode);
void fsync_dir(const std::string& dir);
void rename_path(const std::string& from, const std::string& to);
// unlink; a missing file is fine.
void remove_file(const std::string& path);
// Removes a directory and everything below it; a missing one is fine.
void remove_tree(const std::string& path);
// Entry names (no "." and ".."), unsorted.
std::vector<std::string> list_dir(const std::string& dir);
uint64_t file_size(const std::string& path);
// Reads a whole small file; kCorrupt if it is larger than max_bytes.
std::string read_file(const std::string& path, uint64_t max_bytes);

// Publishes `content` as dir/name: writes dir/.name.tmp.<pid>, fsyncs it,
// renames it over dir/name and fsyncs dir.  On any failure the temp file is
// removed and dir/name is left as it was.  The temp file is created with
// File::create (O_EXCL | O_NOFOLLOW, `mode`).  `fault_mid` / `fault_sync` name
// fault-injection points hit after the write and before the fsync
// (nullptr: none).
void write_file_atomic(const std::string& dir, const std::string& name,
                       const std::string& content, unsigned mode,
                       const char* fault_mid = nullptr,
                       const char* fault_sync = nullptr);

}  // namespace ckpt
}  // namespace tutti
