// The commit protocol of one save (see include/tutti/checkpoint.h and
// docs/checkpoint.md), run collectively on the manager's communicator:
//   0. rank 0 picks the directory name (step-N, or step-N.k when step N is
//      already committed), removes an incomplete leftover of that name,
//      refuses when a newer complete checkpoint exists (a history this job
//      did not load: it is never renamed or removed), creates the
//      directory, and broadcasts the choice and its step;
//   1. every rank that saves rank 0's step writes its shard durably
//      (shard_writer.h; in the once layout a rank with nothing to write
//      writes no file);
//   2. one all-reduce (MAX) of {failed, another step}: every rank learns at
//      once whether the save can be published, and a rank that died or
//      hangs is named by the others' timeout;
//   3. each rank's report (size, header checksum, and in the once layout
//      its pieces) goes up a binomial tree to rank 0 (O(log W) messages per
//      rank); after a failure the failing ranks' reasons go instead, capped
//      (problem_report.h);
//   4. rank 0 builds the manifest -- version 3 with the tensor index, whose
//      pieces must cover every tensor, or version 2 for the per-rank
//      layout -- writes manifest.json (temp + fsync + rename + directory
//      fsync; it names `parent`, the checkpoint this state continues) and
//      then `latest`;
//   5. rank 0 broadcasts the outcome (its error code and text): every
//      rank's save returns (or raises) only now;
//   6. rank 0 applies retention to this timeline (retention.h).
// A commit therefore takes three broadcasts, one all-reduce and one tree
// gather, whatever W.  commit.cc runs these as prepare (0), write-and-agree
// (1-3), publish (4, 5) and retain (6); the fault points of fault_inject.h
// sit between them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/file_util.h"
#include "checkpoint/manifest_index.h"
#include "checkpoint/snapshot.h"
#include "tutti/process_group.h"

namespace tutti {
namespace ckpt {

class MemoryReplica;

struct CommitConfig {
  std::string root;
  int keep_last = 1;
  double timeout_s = 0;
  nlohmann::json mesh;
  bool direct_io = true;
  unsigned file_mode = kFileMode;
  unsigned dir_mode = kDirMode;
  // The memory tier on several hosts (memory_replica.h): each host's
  // directory, buddy copies, the manifest on every host.  nullptr: the
  // directory is one (shared, or the only host's).
  MemoryReplica* replica = nullptr;
};

struct CommitTimes {
  double write_s = 0;
  double commit_s = 0;
  bool direct_io = false;
};

// One save as the commit sees it.
struct SaveRequest {
  int64_t step = 0;
  std::string parent;  // the checkpoint the job loaded or last saved ("" after a fresh start)
  const Snapshot* snap = nullptr;
  nlohmann::json metadata;
  std::vector<std::string> components;
  bool once = true;  // the once layout (manifest version 3) or per-rank (2)
  // Rank 0, once layout: every tensor of its state (name, dtype, global
  // shape), so that the index holds tensors no rank wrote a byte of
  // (empty ones) and checks the others' pieces against them.
  std::vector<TensorDecl> declared;
  // This rank could not take its snapshot after the layout was agreed (an
  // allocation or copy failure): it writes nothing and fails the save on
  // every rank with this reason.
  std::string local_error;
};

// Returns the committed checkpoint's directory name.
std::string persist_and_commit(ProcessGroup& comm, const CommitConfig& cfg,
                               const SaveRequest& save, CommitTimes* times);

}  // namespace ckpt
}  // namespace tutti
