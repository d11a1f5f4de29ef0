// The memory tier across hosts (issue 28; docs/checkpoint.md, "Memory
// tier"; design /work/ft_design.md 2.2-2.3).  A commit into the memory
// tier is an ordinary checkpoint (commit.h) in each host's own directory
// <tier>/commits; on several hosts the manager adds, through this class:
//
//  * before the shards are written: each host's leader (its lowest rank)
//    creates the step directory in its store (rank 0's host: rank 0 did);
//  * after its own shard: each rank sends the file it wrote to its buddy
//    (memory_layout.h: the same local index on the next host), which writes
//    it as <step>/buddy/<file> (tmp + rename, 0600), in chunks of 64 MiB on
//    the manager's private communicator, every TUTTI_MEM_BUDDY_EVERY
//    commits.  A buddy copy failure counts as the rank's write failure in
//    the commit's agreement: the step is not published anywhere;
//  * after rank 0 published the manifest: rank 0 broadcasts its bytes and
//    every other host's leader writes manifest.json and `latest`; if one
//    cannot, every leader removes its manifest again and the save raises
//    on every rank (never a step complete on some hosts only by a failure);
//  * retention on every host's leader.
//
// Buddy copies live in buddy/ (not beside the host's own shards) so that a
// restore can tell own files from copies and say which it used; names
// cannot collide either way (rank-<r> files are written by rank r only).
//
// Restore (restore()): the ranks agree on the newest step whose manifest's
// files all survive on some host (own or buddy copy), fetch what their
// host lacks from the lowest rank holding it (whole files), and the
// ordinary loader then reads the local directory.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/agreement.h"
#include "checkpoint/memory_layout.h"
#include "tutti/process_group.h"

namespace tutti {
namespace ckpt {

// Bytes per point-to-point message of a file copy.
constexpr uint64_t kMemoryChunkBytes = 64ull << 20;
constexpr const char* kBuddyDir = "buddy";

class MemoryReplica {
 public:
  // Collective over `comm` (the manager's private communicator): the host
  // layout.  Returns nullptr on one host (nothing to replicate; said once
  // at INFO on rank 0).
  static std::unique_ptr<MemoryReplica> make(ProcessGroup& comm, double timeout_s,
                                             unsigned file_mode, unsigned dir_mode);

  const NodeLayout& layout() const { return layout_; }
  bool leader() const { return layout_.leader(my_node_) == comm_.rank(); }
  // Whether rank 0 is on this rank's host.
  bool with_rank0() const { return my_node_ == layout_.node_of[0]; }

  // ---- commit (every rank, in the order commit.cc calls them) ----
  // Starts one save: whether this save makes buddy copies (the same on
  // every rank: a count of saves and TUTTI_MEM_BUDDY_EVERY).
  bool begin_save();
  // Collective over the host: its leader creates `dir` and dir/buddy/ (a
  // leftover of that name from an earlier timeline is removed first; on
  // rank 0's host rank 0 created `dir`).  "" or why it failed.
  std::string prepare_step_dir(const std::string& dir);
  // Collective (point-to-point over the communicator): this rank's file
  // `own` in `dir` ("" : it wrote none, or failed) goes to its buddy; the
  // files of the ranks whose buddy this rank is land in dir/buddy/.
  // "" or why this rank failed (its read or its copies' writes).  A broken
  // communicator raises.
  std::string copy_to_buddy(const std::string& dir, const std::string& own);
  // After rank 0 published: every host's leader writes `manifest_text`
  // (rank 0's; broadcast here) and `latest`.  Raises on every rank when a
  // leader could not, after every leader removed the manifest again.
  void publish_everywhere(Agreement& agree, const std::string& root, const std::string& name,
                          const std::string& manifest_text, const std::string& what);
  // Retention on the leaders of the hosts without rank 0 (rank 0 runs it).
  void retain(const std::string& root, const std::string& name, int keep_last);

  // ---- restore (every rank) ----
  // The newest complete step (`step` >= 0: only that step) whose files all
  // survive on some host: fetched where missing, so that root/<name> on
  // every host holds the manifest and every file.  nullopt when none
  // (why logged on rank 0).  Raises kIo when a copy failed.
  std::optional<std::string> restore(const std::string& root, int64_t step);
  // After the job resumed from `name` ("": started fresh): every host's
  // leader removes the complete steps ordered after it and abandoned ones
  // (the loader renames rank 0's to abandoned-*), so that no later restore
  // returns to a timeline the job left.  RAM is not kept for inspection.
  void drop_newer(const std::string& root, const std::string& name);

 private:
  MemoryReplica(ProcessGroup& comm, double timeout_s, unsigned file_mode, unsigned dir_mode)
      : comm_(comm), timeout_s_(timeout_s), file_mode_(file_mode), dir_mode_(dir_mode) {}
  OpOptions p2p_options(const std::string& what) const;

  ProcessGroup& comm_;
  std::shared_ptr<ProcessGroup> node_;
  double timeout_s_;
  unsigned file_mode_, dir_mode_;
  NodeLayout layout_;
  int my_node_ = 0;
  int64_t every_ = 1;
  int64_t saves_ = 0;
};

// Sends the file at `path` to `peer` as an int64 size and chunks of
// kMemoryChunkBytes from a read-only mapping (a size of -1 when it cannot
// be opened: `*error` says why).  Blocking.
void send_file(ProcessGroup& comm, const std::string& path, int peer, int tag,
               const OpOptions& o, std::string* error);
// Receives one send_file into dir/name: straight into a shared mapping of
// dir/.name.tmp (`mode`), then renamed.  A sender's -1 or a local failure
// leaves no file and sets `*error` (the messages are still drained).
void recv_file(ProcessGroup& comm, int peer, int tag, const OpOptions& o,
               const std::string& dir, const std::string& name, unsigned mode,
               std::string* error);

}  // namespace ckpt
}  // namespace tutti
