#include "checkpoint/mapped_file.h"

#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>

#include <cerrno>
#include <cstring>

#include "core/check.h"
#include "tutti/config.h"

namespace tutti {
namespace ckpt {

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& o) noexcept : data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

void MappedFile::reset() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), static_cast<size_t>(size_));
  data_ = nullptr;
  size_ = 0;
}

MappedFile MappedFile::map_if_in_ram(int fd, uint64_t bytes) {
  MappedFile m;
  if (fd < 0 || bytes == 0 || !config::get_bool("TUTTI_CKPT_LOAD_MMAP")) return m;
  struct statfs fs {};
  if (::fstatfs(fd, &fs) != 0 || static_cast<unsigned long>(fs.f_type) != TMPFS_MAGIC)
    return m;
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return m;  // the caller reads with pread instead
  ::madvise(p, static_cast<size_t>(bytes), MADV_SEQUENTIAL);
  m.data_ = static_cast<const unsigned char*>(p);
  m.size_ = bytes;
  return m;
}

MappedFile MappedFile::map_whole(int fd, uint64_t bytes, bool writable,
                                 const std::string& path) {
  MappedFile m;
  if (bytes == 0) return m;
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes),
                   writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    TUTTI_THROW(kIo, "mapping '", path, "' (", bytes, " bytes) failed: ", std::strerror(errno));
  m.data_ = static_cast<const unsigned char*>(p);
  m.size_ = bytes;
  return m;
}

}  // namespace ckpt
}  // namespace tutti
