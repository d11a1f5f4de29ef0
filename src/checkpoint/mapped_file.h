// A read-only mapping of a shard that lies in RAM (tmpfs: /dev/shm, the
// memory tier's medium), so that a load hashes and copies the bytes where
// they are instead of read()ing them into a buffer first.  Only tmpfs: on a
// disk file system an I/O error while touching a mapping is SIGBUS, not the
// EIO a load retries; tmpfs has no I/O.  A file truncated while mapped
// would also be SIGBUS: tutti never truncates a committed shard (shards are
// written under a temporary name and renamed), and a load holds the lock of
// its directory's job.  TUTTI_CKPT_LOAD_MMAP=0 turns mapping off.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tutti {
namespace ckpt {

class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Maps the `bytes` bytes of the open file `fd` when it lies on tmpfs and
  // mapping is enabled; otherwise (or if mmap fails) an empty mapping, and
  // the caller reads with pread.
  static MappedFile map_if_in_ram(int fd, uint64_t bytes);
  // Maps the `bytes` bytes of the open file `fd` (read-only, or read-write
  // for a writable descriptor: the pages are the file's), wherever it lies;
  // kIo naming `path` when mmap fails.
  static MappedFile map_whole(int fd, uint64_t bytes, bool writable, const std::string& path);

  const unsigned char* data() const { return data_; }
  // The bytes of a writable mapping (map_whole(..., true, ...)).
  unsigned char* writable_data() const { return const_cast<unsigned char*>(data_); }
  uint64_t size() const { return size_; }
  bool mapped() const { return data_ != nullptr; }

 private:
  void reset();
  const unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace ckpt
}  // namespace tutti
