#include "checkpoint/commit.h"

#include <chrono>
#include <ctime>

#include <unistd.h>

#include "checkpoint/agreement.h"
#include "checkpoint/catalog.h"
#include "checkpoint/fault_inject.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/retention.h"
#include "checkpoint/shard_writer.h"
#include "core/check.h"
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
  const int rank = agree.rank(), world = agree.size();

  // 0. The directory.  A complete checkpoint ordered after this one is a
  // history this job neither loaded nor wrote (another job, or a volume
  // mounted after the load): refuse rather than publish beside it, and never
  // rename or remove it.
  std::string prepare_error;
  int64_t suffix = -1;
  if (rank == 0) {
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
  const std::string name = checkpoint_name(step, static_cast<int>(suffix));
  const std::string dir = join_path(cfg.root, name);

  // 1. This rank's shard.
  ShardWriteResult res;
  std::string write_error;
  const auto tw = Clock::now();
  try {
    res = write_shard(dir, snap, rank, world, step, cfg.direct_io, cfg.file_mode);
  } catch (const Error& e) {
    write_error = e.message();
    if (write_error.find(shard_file_name(rank)) == std::string::npos)
      write_error += " (writing " + join_path(dir, shard_file_name(rank)) + ")";
  }
  if (times) {
    times->write_s = since(tw);
    times->direct_io = res.direct;
  }

  // 2. Agreement: nothing is published unless every shard is durable.
  const std::vector<int64_t> mine = {
      write_error.empty() ? 1 : 0, static_cast<int64_t>(res.bytes),
      static_cast<int64_t>(res.header_xxh64), static_cast<int64_t>(res.tensors),
      static_cast<int64_t>(res.data_bytes), step};
  const size_t kFields = mine.size();
  const std::vector<int64_t> all = agree.allgather(mine, "agreeing that every shard is durable");
  std::vector<int> failed, other_step;
  for (int r = 0; r < world; ++r) {
    if (all[static_cast<size_t>(r) * kFields] != 1) failed.push_back(r);
    if (all[static_cast<size_t>(r) * kFields + 5] != step) other_step.push_back(r);
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
  fault::fault_point("after_agree");

  // 3. Rank 0 publishes: manifest, then `latest`.
  int64_t committed = 1;
  std::string commit_error;
  if (rank == 0) {
    try {
      Manifest m;
      m.name = name;
      m.step = step;
      m.parent = parent;
      m.world_size = world;
      m.mesh = cfg.mesh;
      m.created = utc_now();
      m.components = components;
      m.metadata = metadata;
      for (int r = 0; r < world; ++r) {
        const int64_t* f = &all[static_cast<size_t>(r) * kFields];
        m.shards.push_back({r, shard_file_name(r), static_cast<uint64_t>(f[1]),
                            static_cast<uint64_t>(f[2]), static_cast<uint64_t>(f[3]),
                            static_cast<uint64_t>(f[4])});
      }
      try {
        write_file_atomic(dir, kManifestName, manifest_to_json(m), cfg.file_mode, "mid_manifest",
                          "manifest_fsync");
      } catch (...) {
        // Not durable: make sure no reader ever sees it.
        ::unlink(join_path(dir, kManifestName).c_str());
        throw;
      }
    } catch (const Error& e) {
      committed = 0;
      commit_error = e.message();
    }
    if (committed) {
      fault::fault_point("between_manifest_and_latest");
      try {
        write_file_atomic(cfg.root, kLatestName, name + "\n", cfg.file_mode);
      } catch (const Error& e) {
        // The manifest is durable, so the checkpoint is committed; loaders
        // do not depend on the pointer.
        TUTTI_LOG(kWarn) << what << ": committed as " << name
                         << ", but updating '" << kLatestName
                         << "' failed: " << e.message();
      }
    }
  }

  // 4. Every rank learns the outcome.
  committed = agree.broadcast(committed, 0, "publishing the manifest");
  if (!committed)
    TUTTI_THROW(kIo, what, " (", dir, ") was not published: rank 0 could not write ",
                "its manifest", commit_error.empty() ? "" : ": ", commit_error);
  if (times) times->commit_s = since(t0);

  // 5. Retention, strictly after the commit.
  if (rank == 0) {
    fault::fault_point("after_latest");
    apply_retention(cfg.root, name, cfg.keep_last);
  }
  return name;
}

}  // namespace ckpt
}  // namespace tutti
