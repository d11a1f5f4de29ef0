#include "checkpoint/commit.h"

#include <chrono>
#include <cstring>
#include <ctime>
#include <type_traits>

#include <unistd.h>

#include "checkpoint/agreement.h"
#include "checkpoint/catalog.h"
#include "checkpoint/fault_inject.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/retention.h"
#include "checkpoint/shard_writer.h"
#include "core/check.h"
#include "core/timeline.h"
#include "tutti/log.h"

namespace tutti {
namespace ckpt {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Rank 0: the first of step-N, step-N.1, ... that is free or incomplete
// (an incomplete one is a leftover of an interrupted save: removed).
int choose_suffix(const std::string& root, int64_t step, unsigned dir_mode) {
  make_dirs(root, dir_mode);
  for (int suffix = 0;; ++suffix) {
    const std::string path = join_path(root, checkpoint_name(step, suffix));
    if (!path_exists(path)) return suffix;
    if (!path_exists(join_path(path, kManifestName))) {
      TUTTI_LOG(kInfo) << "removing incomplete leftover " << path
                       << " of an interrupted save";
      remove_tree(path);
      return suffix;
    }
  }
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// One rank's answer in the agreement (step 2), exchanged as raw int64 words
// through Agreement::allgather: every field is 8 bytes, no padding.
struct ShardReport {
  int64_t ok = 0;  // 1: this rank's shard is durable
  uint64_t bytes = 0;
  uint64_t header_xxh64 = 0;
  uint64_t tensors = 0;
  uint64_t data_bytes = 0;
  int64_t step = 0;  // the step this rank saved (every rank must agree)
};
constexpr size_t kReportWords = sizeof(ShardReport) / sizeof(int64_t);
static_assert(sizeof(ShardReport) == 6 * sizeof(int64_t),
              "ShardReport is exchanged as raw int64 words");
static_assert(std::is_trivially_copyable<ShardReport>::value,
              "ShardReport is exchanged as raw bytes");

std::vector<ShardReport> allgather_reports(Agreement& agree, const ShardReport& mine,
                                           const char* phase) {
  std::vector<int64_t> words(kReportWords);
  std::memcpy(words.data(), &mine, sizeof mine);
  const std::vector<int64_t> all = agree.allgather(words, phase);
  std::vector<ShardReport> out(static_cast<size_t>(agree.size()));
  TUTTI_CHECK(all.size() == out.size() * kReportWords, "allgather of ", out.size(),
              " shard reports returned ", all.size(), " words, expected ",
              out.size() * kReportWords);
  // (void*: trivially copyable, but its member initialisers make GCC warn.)
  std::memcpy(static_cast<void*>(out.data()), all.data(), all.size() * sizeof(int64_t));
  return out;
}

// Step 0: rank 0 picks and creates the directory, every rank learns its
// name.  A complete checkpoint ordered after this one is a history this job
// neither loaded nor wrote (another job, or a volume mounted after the
// load): refuse rather than publish beside it, and never rename or remove it.
std::string prepare(Agreement& agree, const CommitConfig& cfg, int64_t step,
                    const std::string& what) {
  std::string prepare_error;
  int64_t suffix = -1;
  if (agree.rank() == 0) {
    try {
      suffix = choose_suffix(cfg.root, step, cfg.dir_mode);
      const std::string newer =
          newer_complete(cfg.root, {checkpoint_name(step, static_cast<int>(suffix)), step,
                                    static_cast<int>(suffix), false});
      if (!newer.empty()) {
        suffix = -2;
        prepare_error = detail::cat(
            "'", cfg.root, "' holds ", newer,
            ", newer than this save, which this job did not load or write (another "
            "job uses the directory, or its volume was mounted after the job "
            "started); it is left untouched: load it, or use another directory");
      } else {
        make_dir(join_path(cfg.root, checkpoint_name(step, static_cast<int>(suffix))),
                 cfg.dir_mode);
      }
    } catch (const Error& e) {
      prepare_error = e.message();
      suffix = -1;
    }
  }
  suffix = agree.broadcast(suffix, 0, "choosing the directory");
  if (suffix < 0) {
    prepare_error = agree.broadcast(prepare_error, 0, "choosing the directory");
    if (suffix == -2) TUTTI_THROW(kInvalidArgument, what, " not saved: ", prepare_error);
    TUTTI_THROW(kIo, what, " not saved: rank 0 could not prepare the directory in '",
                cfg.root, "'", prepare_error.empty() ? "" : ": ", prepare_error);
  }
  return checkpoint_name(step, static_cast<int>(suffix));
}

// Steps 1 and 2: this rank writes its shard, then every rank learns every
// rank's report; nothing is published unless every shard is durable.
// Returns the reports in rank order.
std::vector<ShardReport> write_and_agree(Agreement& agree, const CommitConfig& cfg,
                                         const std::string& dir, int64_t step,
                                         const Snapshot& snap, const std::string& what,
                                         CommitTimes* times) {
  const int rank = agree.rank();
  ShardWriteResult res;
  std::string write_error;
  const auto tw = Clock::now();
  try {
    res = write_shard(dir, snap, rank, agree.size(), step, cfg.direct_io, cfg.file_mode);
  } catch (const Error& e) {
    write_error = e.message();
    if (write_error.find(shard_file_name(rank)) == std::string::npos)
      write_error += " (writing " + join_path(dir, shard_file_name(rank)) + ")";
  }
  if (times) {
    times->write_s = since(tw);
    times->direct_io = res.direct;
  }

  ShardReport mine;
  mine.ok = write_error.empty() ? 1 : 0;
  mine.bytes = res.bytes;
  mine.header_xxh64 = res.header_xxh64;
  mine.tensors = res.tensors;
  mine.data_bytes = res.data_bytes;
  mine.step = step;
  const std::vector<ShardReport> all =
      allgather_reports(agree, mine, "agreeing that every shard is durable");
  std::vector<int> failed, other_step;
  for (int r = 0; r < agree.size(); ++r) {
    const ShardReport& rep = all[static_cast<size_t>(r)];
    if (rep.ok != 1) failed.push_back(r);
    if (rep.step != step) other_step.push_back(r);
  }
  if (!other_step.empty())
    TUTTI_THROW(kInvalidArgument, what, " (", dir, ") was not published: rank",
                other_step.size() > 1 ? "s " : " ", rank_list(other_step),
                " saved another step (every rank must save the same step)");
  if (!failed.empty()) {
    // Every rank names every failing rank's file and error, not only the
    // rank that found it.
    const std::vector<std::string> texts =
        agree.allgather_text(write_error, "reporting the failed shards");
    std::string why;
    for (int r : failed)
      why += (why.empty() ? "" : "; ") +
             (texts[static_cast<size_t>(r)].empty()
                  ? "rank " + std::to_string(r) + ": " + shard_file_name(r)
                  : texts[static_cast<size_t>(r)]);
    TUTTI_THROW(kIo, what, " (", dir, ") was not published: rank",
                failed.size() > 1 ? "s " : " ", rank_list(failed), " could not write ",
                failed.size() > 1 ? "their shards" : "its shard", ": ", why);
  }
  return all;
}

// The manifest this save publishes.
struct Publication {
  const std::string& name;
  const std::string& dir;
  int64_t step;
  const std::string& parent;
  const nlohmann::json& metadata;
  const std::vector<std::string>& components;
};

// Steps 3 and 4: rank 0 writes the manifest, then `latest`; every rank
// learns whether the manifest is durable and raises if it is not.
void publish(Agreement& agree, const CommitConfig& cfg, const Publication& pub,
             const std::vector<ShardReport>& reports, const std::string& what) {
  int64_t committed = 1;
  std::string commit_error;
  if (agree.rank() == 0) {
    try {
      Manifest m;
      m.name = pub.name;
      m.step = pub.step;
      m.parent = pub.parent;
      m.world_size = agree.size();
      m.mesh = cfg.mesh;
      m.created = utc_now();
      m.components = pub.components;
      m.metadata = pub.metadata;
      for (int r = 0; r < agree.size(); ++r) {
        const ShardReport& rep = reports[static_cast<size_t>(r)];
        m.shards.push_back({r, shard_file_name(r), rep.bytes, rep.header_xxh64, rep.tensors,
                            rep.data_bytes});
      }
      try {
        write_file_atomic(pub.dir, kManifestName, manifest_to_json(m), cfg.file_mode,
                          "mid_manifest", "manifest_fsync");
      } catch (...) {
        // Not durable: make sure no reader ever sees it.
        ::unlink(join_path(pub.dir, kManifestName).c_str());
        throw;
      }
    } catch (const Error& e) {
      committed = 0;
      commit_error = e.message();
    }
    if (committed) {
      fault::fault_point("between_manifest_and_latest");
      try {
        write_file_atomic(cfg.root, kLatestName, pub.name + "\n", cfg.file_mode);
      } catch (const Error& e) {
        // The manifest is durable, so the checkpoint is committed; loaders
        // do not depend on the pointer.
        TUTTI_LOG(kWarn) << what << ": committed as " << pub.name << ", but updating '"
                         << kLatestName << "' failed: " << e.message();
      }
    }
  }
  committed = agree.broadcast(committed, 0, "publishing the manifest");
  if (!committed)
    TUTTI_THROW(kIo, what, " (", pub.dir, ") was not published: rank 0 could not write ",
                "its manifest", commit_error.empty() ? "" : ": ", commit_error);
}

// Step 5: retention, strictly after the commit (rank 0 only).
void retain(const Agreement& agree, const CommitConfig& cfg, const std::string& name) {
  if (agree.rank() != 0) return;
  fault::fault_point("after_latest");
  apply_retention(cfg.root, name, cfg.keep_last);
}

}  // namespace

std::string persist_and_commit(ProcessGroup& comm, const CommitConfig& cfg,
                               int64_t step, const std::string& parent,
                               const Snapshot& snap,
                               const nlohmann::json& metadata,
                               const std::vector<std::string>& components,
                               CommitTimes* times) {
  const auto t0 = Clock::now();
  const std::string what = detail::cat("checkpoint step ", step);
  Agreement agree(comm, cfg.timeout_s, what);

  const std::string name = prepare(agree, cfg, step, what);
  const std::string dir = join_path(cfg.root, name);
  const std::vector<ShardReport> reports =
      write_and_agree(agree, cfg, dir, step, snap, what, times);
  fault::fault_point("after_agree");

  TUTTI_TIMELINE(instant(timeline::kCheckpointWriter, "checkpoint", "shards durable", &timeline::Args().i("step", step)));
  publish(agree, cfg, {name, dir, step, parent, metadata, components}, reports, what);
  TUTTI_TIMELINE(instant(timeline::kCheckpointWriter, "checkpoint", "commit", &timeline::Args().i("step", step).s("name", name)));
  if (times) times->commit_s = since(t0);

  retain(agree, cfg, name);
  return name;
}

}  // namespace ckpt
}  // namespace tutti
