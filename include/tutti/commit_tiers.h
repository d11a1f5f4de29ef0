// Where elastic commits go (docs/elastic.md, "Commits: the memory tier and
// the directory"): the memory tier (node-local shared memory; on several
// hosts each rank's files are also copied to a buddy on the next host) for
// every commit where it can serve the job, and the checkpoint directory, when
// one is configured, every `durable_every` commits as the safety net.  A load
// takes the newest commit complete in either tier (the memory tier at equal
// steps: it is read from RAM) and says why when it falls back to the
// directory.  ElasticState and tutti.torch.elastic (_C._CommitTiers) commit
// through it, so they share one policy; a training loop of its own can too:
//
//   tutti::elastic::CommitTiers commits(tutti::world(), {"/shared/ckpt"});
//   if (auto r = commits.load(components)) start = r->step + 1;
//   ...
//   commits.save(step, components, "{}");   // collective
//   commits.wait();
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tutti/checkpoint.h"
#include "tutti/export.h"
#include "tutti/process_group.h"

namespace tutti {
namespace elastic {

struct CommitTierOptions {
  // The durable directory; "" : the memory tier only (it must serve the job).
  std::string durable_dir;
  // Commits kept in the directory (<= 0: TUTTI_CKPT_KEEP); the memory tier
  // keeps this many (at least 1) when it is the only tier, else 1.
  int keep_last = 0;
  // Saves return once the state is copied (wait() for them to land).
  bool async = false;
  // Every how many commits also go to the directory while the memory tier
  // keeps them (<= 0: TUTTI_COMMIT_DURABLE_EVERY).  A commit the memory tier
  // does not keep goes to the directory whatever this says.
  int durable_every = 0;
  // Whether commits go to the memory tier where a directory is set too
  // (-1: TUTTI_COMMIT_MEMORY).  Without a directory it is always used.
  int memory = -1;
};

class TUTTI_API CommitTiers {
 public:
  // Collective over `group`.  kInvalidArgument on every rank when there is
  // no directory and the memory tier cannot serve the job; with a directory
  // that only costs the memory tier (said once at INFO).
  CommitTiers(ProcessGroupPtr group, CommitTierOptions options);
  ~CommitTiers();
  CommitTiers(const CommitTiers&) = delete;
  CommitTiers& operator=(const CommitTiers&) = delete;

  // Collective: commit `step`.  To the memory tier when its budget holds it
  // (the verdict agreed by every rank), to the directory when due or when
  // the memory tier does not keep it.
  void save(int64_t step, const Components& components, const std::string& metadata_json);
  void wait();
  bool in_flight() const;
  // Collective: the newest commit complete in either tier (options.step < 0),
  // else exactly options.step from the tier that holds it.
  std::optional<LoadResult> load(const Components& components, const LoadOptions& options = {});
  // Local: the newest complete commit's step in either tier, unverified.
  std::optional<int64_t> latest_step() const;
  // Local: the directory's checkpoints, else the memory tier's.
  std::vector<CheckpointInfo> list() const;
  // Where the newest commits go: the memory tier's directory while it serves
  // the job, else the checkpoint directory.
  const std::string& dir() const;
  SaveStats last_save_stats() const;
  bool memory_tier() const;
  const std::string& durable_dir() const;  // "" without one
  // Collective: the managers again, over `group` (after tutti::recover()).
  void reopen(ProcessGroupPtr group);
  // Collective: the job is done; the memory tier's commits are removed
  // (once per host).  The directory's stay.
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace elastic
}  // namespace tutti
