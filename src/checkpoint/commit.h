// The commit protocol of one save (see include/tutti/checkpoint.h and
// docs/checkpoint.md), run collectively on the manager's communicator:
//   0. rank 0 picks the directory name (step-N, or step-N.k when step N is
//      already committed), removes an incomplete leftover of that name,
//      refuses when a newer complete checkpoint exists (a history this job
//      did not load: it is never renamed or removed), creates the
//      directory, and broadcasts the choice;
//   1. every rank writes its shard durably (shard_writer.h);
//   2. the ranks allgather a fixed-size report (ok, size, header checksum,
//      tensor count, data bytes, step): any failure, or a rank that saved
//      another step, raises on every rank, naming the ranks;
//   3. rank 0 writes manifest.json (temp + fsync + rename + directory
//      fsync; it names `parent`, the checkpoint this state continues) and
//      then `latest`;
//   4. rank 0 broadcasts whether the manifest is durable: every rank's save
//      returns (or raises) only now;
//   5. rank 0 applies retention to this timeline (retention.h).
// commit.cc runs these as prepare (0), write-and-agree (1, 2), publish (3,
// 4) and retain (5); the fault points of fault_inject.h sit between them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/file_util.h"
#include "checkpoint/snapshot.h"
#include "tutti/process_group.h"

namespace tutti {
namespace ckpt {

struct CommitConfig {
  std::string root;
  int keep_last = 1;
  double timeout_s = 0;
  nlohmann::json mesh;
  bool direct_io = true;
  unsigned file_mode = kFileMode;
  unsigned dir_mode = kDirMode;
};

struct CommitTimes {
  double write_s = 0;
  double commit_s = 0;
  bool direct_io = false;
};

// Returns the committed checkpoint's directory name.  `parent`: the
// checkpoint the job loaded or last saved ("" after a fresh start).
std::string persist_and_commit(ProcessGroup& comm, const CommitConfig& cfg,
                               int64_t step, const std::string& parent,
                               const Snapshot& snap,
                               const nlohmann::json& metadata,
                               const std::vector<std::string>& components,
                               CommitTimes* times);

}  // namespace ckpt
}  // namespace tutti
