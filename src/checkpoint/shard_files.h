// The shard files one rank reads during a load: each opened lazily, on its
// first read, and kept open for the rest of the load (at most kMaxOpen at a
// time, least recently used closed first), so a rank opens only the shards
// it reads, each once.  For a checkpoint planned from the manifest's index
// the first open also checks the file against the manifest: its size and
// header checksum, and every piece its header describes against the index
// (name, dtype, shape, placement, offsets, checksum).  A shard on tmpfs is
// mapped after those checks (mapped_file.h) and read from the mapping.
// Counts the files opened and the bytes read (ReadStats).
#pragma once

#include <cstdint>
#include <map>

#include "checkpoint/file_util.h"
#include "checkpoint/load_plan.h"
#include "checkpoint/mapped_file.h"

namespace tutti {
namespace ckpt {

// One open shard's data region, for reads from several threads at once.
// Valid until its ShardFiles opens another shard (which may close this one)
// or ends; reads through it are not counted (ShardFiles::count_read).
struct ShardView {
  const File* file = nullptr;
  const unsigned char* map = nullptr;  // the data region when mapped
  uint64_t data_start = 0;
  uint64_t data_bytes = 0;  // from data_start to the end of the file
  // Copies n bytes at `offset` of the data region (memcpy from the mapping
  // or pread); kCorrupt past the end of the file, kIo for read errors.
  void read(void* dst, uint64_t n, uint64_t offset) const;
  // Those bytes in place when mapped (kCorrupt past the end), else nullptr.
  const unsigned char* at(uint64_t offset, uint64_t n) const;
};

class ShardFiles {
 public:
  static constexpr size_t kMaxOpen = 64;

  ShardFiles(const OpenedCheckpoint& ckpt, ReadStats* stats) : ckpt_(ckpt), stats_(stats) {}
  ShardFiles(const ShardFiles&) = delete;
  ShardFiles& operator=(const ShardFiles&) = delete;

  // Opens (and checks) shard s if it is not open yet.
  void open(int s);
  // Reads n bytes at `offset` of shard s's data region.  kCorrupt if the
  // file ends first, kIo for read errors.
  void read(int s, void* dst, uint64_t n, uint64_t offset);
  const std::string& path(int s) const;
  // Opens shard s if needed; its data region for reads from several threads.
  ShardView view(int s);
  // Counts bytes read through a ShardView (ReadStats::bytes_read).
  void count_read(uint64_t n);

 private:
  struct Slot {
    File file;
    MappedFile map;
    uint64_t data_start = 0;
    uint64_t used = 0;
  };
  Slot& slot(int s);
  uint64_t check_indexed(int s, const File& f);

  const OpenedCheckpoint& ckpt_;
  ReadStats* stats_;
  std::map<int, Slot> open_;
  std::map<int, uint64_t> checked_;  // shard -> data_start, once checked
  uint64_t clock_ = 0;
};

}  // namespace ckpt
}  // namespace tutti
