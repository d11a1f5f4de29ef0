#include "checkpoint/commit.h"

#include <chrono>

#include <unistd.h>

#include "checkpoint/agreement.h"
#include "checkpoint/catalog.h"
#include "checkpoint/fault_inject.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/memory_replica.h"
#include "checkpoint/problem_report.h"
#include "checkpoint/retention.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard_writer.h"
#include "checkpoint/untrusted_json.h"
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

using json = nlohmann::json;

// Kinds of problem a rank reports after the agreement (problem_report.h).
enum Problem : int64_t { kNoProblem = 0, kWriteFailed = 1, kOtherStep = 2 };

// One rank's report to rank 0 (step 3), a JSON record of the tree gather:
// {"bytes", "header_xxh64", "tensors", "data_bytes", "pieces": [[name,
// dtype, local shape, global shape, dim, offset, flat, begin, end, xxh64]]}.
std::string encode_report(const ShardWriteResult& r, bool with_pieces) {
  json pieces = json::array();
  if (with_pieces)
    for (const StoredTensor& t : r.stored) {
      const Placement& p = t.placement;
      pieces.push_back({t.name, dtype_safetensors_name(t.dtype), p.local_shape, p.global_shape,
                        p.dim, p.offset, p.flat, t.begin, t.end, hex64(t.xxh64)});
    }
  return json{{"bytes", r.bytes},
              {"header_xxh64", hex64(r.header_xxh64)},
              {"tensors", r.tensors},
              {"data_bytes", r.data_bytes},
              {"pieces", pieces}}
      .dump();
}

ShardRecord decode_report(int rank, const std::string& text, std::vector<StoredTensor>* pieces) {
  const std::string what = "rank " + std::to_string(rank) + "'s shard report";
  const json j = parse_untrusted_json(text, 4, what);
  ShardRecord rec;
  rec.rank = rank;
  rec.file = shard_file_name(rank);
  rec.bytes = json_uint(j, "bytes", what);
  rec.header_xxh64 = parse_hex64(json_string(j, "header_xxh64", what), what);
  rec.tensors = json_uint(j, "tensors", what);
  rec.data_bytes = json_uint(j, "data_bytes", what);
  for (const json& x : json_field(j, "pieces", what)) {
    StoredTensor t;
    t.name = x.at(0).get<std::string>();
    TUTTI_CHECK(dtype_from_safetensors(x.at(1).get<std::string>(), &t.dtype), what,
                ": unknown dtype ", x.at(1).dump());
    ShardInfo info;
    info.global_shape = x.at(3).get<std::vector<int64_t>>();
    info.dim = x.at(4).get<int>();
    info.offset = x.at(5).get<int64_t>();
    info.flat = x.at(6).get<bool>();
    t.placement = make_placement(x.at(2).get<std::vector<int64_t>>(), info,
                                 ErrorCode::kInternal, what + " tensor '" + t.name + "'");
    t.begin = x.at(7).get<uint64_t>();
    t.end = x.at(8).get<uint64_t>();
    t.xxh64 = parse_hex64(x.at(9).get<std::string>(), what);
    pieces->push_back(std::move(t));
  }
  return rec;
}

std::string shard_of_rank(int rank) { return "rank " + std::to_string(rank) + ": " + shard_file_name(rank); }

// Step 0: rank 0 picks and creates the directory, every rank learns its
// name.  A complete checkpoint ordered after this one is a history this job
// neither loaded nor wrote (another job, or a volume mounted after the
// load): refuse rather than publish beside it, and never rename or remove it.
std::string prepare(Agreement& agree, const CommitConfig& cfg, int64_t step,
                    const std::string& what, int64_t* root_step) {
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
  const std::vector<int64_t> choice = agree.broadcast(std::vector<int64_t>{suffix, step}, 0, "choosing the directory");
  suffix = choice[0];
  *root_step = choice[1];
  if (suffix < 0) {
    prepare_error = agree.broadcast(prepare_error, 0, "choosing the directory");
    if (suffix == -2) TUTTI_THROW(kInvalidArgument, what, " not saved: ", prepare_error);
    TUTTI_THROW(kIo, what, " not saved: rank 0 could not prepare the directory in '",
                cfg.root, "'", prepare_error.empty() ? "" : ": ", prepare_error);
  }
  return checkpoint_name(step, static_cast<int>(suffix));
}

// The manifest this save publishes.
struct Publication {
  const std::string& name;
  const std::string& dir;
  const SaveRequest& save;
};

// Steps 1-3: this rank writes its shard; the ranks agree whether every
// shard is durable; rank 0 collects the reports (or, after a failure,
// every rank raises the same error naming the failing ranks).  Returns the
// reports (rank 0; empty elsewhere).
std::vector<std::pair<int, std::string>> write_and_agree(Agreement& agree, const CommitConfig& cfg,
                                                         const std::string& dir,
                                                         const SaveRequest& save,
                                                         int64_t root_step, const std::string& what,
                                                         CommitTimes* times) {
  const int rank = agree.rank();
  ShardWriteResult res;
  std::string write_error;
  const bool other_step = save.step != root_step;
  const auto tw = Clock::now();
  // The memory tier on several hosts: this host's step directory first.
  // Every rank of a host takes part in its preparation, whatever it saves.
  const bool buddy = cfg.replica && cfg.replica->begin_save();
  const std::string prepare_error = cfg.replica ? cfg.replica->prepare_step_dir(dir) : "";
  if (!save.local_error.empty()) {
    write_error = save.local_error;
  } else if (!prepare_error.empty()) {
    write_error = prepare_error;  // this host's directory could not be made: nothing written
  } else if (!other_step) {
    try {
      res = write_shard(dir, *save.snap, rank, agree.size(), save.step, cfg.direct_io,
                        cfg.file_mode, /*skip_empty=*/save.once);
    } catch (const Error& e) {
      write_error = e.message();
      if (write_error.find(shard_file_name(rank)) == std::string::npos)
        write_error += " (writing " + join_path(dir, shard_file_name(rank)) + ")";
    }
  }
  if (buddy) {  // every rank takes part, whatever it wrote
    const std::string own = write_error.empty() && !other_step && res.written
                                ? shard_file_name(rank) : std::string();
    const std::string err = cfg.replica->copy_to_buddy(dir, own);
    if (!err.empty() && write_error.empty()) write_error = err;
  }
  if (times) {
    times->write_s = since(tw);
    times->direct_io = res.direct;
  }
  const std::vector<int64_t> flags = agree.allreduce_max(
      {write_error.empty() ? 0 : 1, other_step ? 1 : 0}, "agreeing that every shard is durable");
  if (flags[0] || flags[1]) {
    // Every rank names the failing ranks' files and errors (the lowest
    // kMaxReports of them), not only the rank that found one.
    const int64_t kind = other_step ? kOtherStep : write_error.empty() ? kNoProblem : kWriteFailed;
    auto problems = gather_problems(agree, kind,
                                    other_step ? "rank " + std::to_string(rank) + " saved step " +
                                                     std::to_string(save.step)
                                               : write_error,
                                    "reporting the failed shards", &shard_of_rank);
    if (problems.count(kOtherStep)) {
      const ProblemSummary& p = problems[kOtherStep];
      TUTTI_THROW(kInvalidArgument, what, " (", dir, ") was not published: ", p.rank_list(),
                  " saved another step than rank 0's ", root_step,
                  " (every rank must save the same step): ", p.text);
    }
    const ProblemSummary& p = problems[kWriteFailed];
    TUTTI_THROW(kIo, what, " (", dir, ") was not published: ", p.rank_list(),
                " could not write ", p.count > 1 ? "their shards" : "its shard", ": ", p.text);
  }
  std::string mine;
  const bool report = res.written || !save.once;
  if (report) mine = encode_report(res, save.once);
  return agree.gather_records(report ? &mine : nullptr, "collecting the shard reports");
}

// Rank 0: the manifest from the reports.  kInvalidArgument when the once
// layout's pieces do not describe the tensors consistently or leave some
// of their elements unwritten (nothing is published then).
Manifest build_manifest(const Agreement& agree, const CommitConfig& cfg, const Publication& pub,
                        const std::vector<std::pair<int, std::string>>& reports) {
  Manifest m;
  m.name = pub.name;
  m.step = pub.save.step;
  m.parent = pub.save.parent;
  m.world_size = agree.size();
  m.mesh = cfg.mesh;
  m.created = utc_now();
  m.components = pub.save.components;
  m.metadata = pub.save.metadata;
  m.indexed = pub.save.once;
  for (const TensorDecl& d : pub.save.declared)
    declare_tensor(&m.tensors, d.name, d.dtype, d.shape, 0);
  for (const auto& r : reports) {
    std::vector<StoredTensor> pieces;
    m.shards.push_back(decode_report(r.first, r.second, &pieces));
    for (const StoredTensor& t : pieces) add_piece(&m.tensors, r.first, t);
  }
  TUTTI_CHECK(m.indexed || m.shards.size() == static_cast<size_t>(agree.size()),
              "per-rank layout: ", m.shards.size(), " shard reports from ", agree.size(), " ranks");
  if (m.indexed) finish_index(&m.tensors);
  return m;
}

// Steps 4 and 5: rank 0 writes the manifest, then `latest`; every rank
// learns whether the manifest is durable and raises if it is not.
void publish(Agreement& agree, const CommitConfig& cfg, const Publication& pub,
             const std::vector<std::pair<int, std::string>>& reports, const std::string& what) {
  int64_t code = 0;  // the ErrorCode rank 0 raised, 0: committed
  std::string commit_error, manifest_text;
  if (agree.rank() == 0) {
    Manifest m;
    try {
      m = build_manifest(agree, cfg, pub, reports);
      manifest_text = manifest_to_json(m);
      try {
        write_file_atomic(pub.dir, kManifestName, manifest_text, cfg.file_mode,
                          "mid_manifest", "manifest_fsync");
      } catch (...) {
        // Not durable: make sure no reader ever sees it.
        ::unlink(join_path(pub.dir, kManifestName).c_str());
        throw;
      }
    } catch (const Error& e) {
      code = static_cast<int64_t>(e.code());
      commit_error = e.message();
    }
    if (code == 0) {
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
  code = agree.broadcast(code, 0, "publishing the manifest");
  if (code != 0) {
    commit_error = agree.broadcast(commit_error, 0, "publishing the manifest");
    const auto ec = static_cast<ErrorCode>(code);
    detail::throw_error(ec, __FILE__, __LINE__,
                        detail::cat(what, " (", pub.dir, ") was not published: rank 0 could not ",
                                    ec == ErrorCode::kIo ? "write its manifest" : "index the shards",
                                    commit_error.empty() ? "" : ": ", commit_error));
  }
  if (cfg.replica)
    cfg.replica->publish_everywhere(agree, cfg.root, pub.name, manifest_text, what);
}

// Step 5: retention, strictly after the commit (rank 0 only).
void retain(const Agreement& agree, const CommitConfig& cfg, const std::string& name) {
  if (cfg.replica) cfg.replica->retain(cfg.root, name, cfg.keep_last);
  if (agree.rank() != 0) return;
  fault::fault_point("after_latest");
  apply_retention(cfg.root, name, cfg.keep_last);
}

}  // namespace

std::string persist_and_commit(ProcessGroup& comm, const CommitConfig& cfg,
                               const SaveRequest& save, CommitTimes* times) {
  const auto t0 = Clock::now();
  const std::string what = detail::cat("checkpoint step ", save.step);
  Agreement agree(comm, cfg.timeout_s, what);

  int64_t root_step = save.step;
  const std::string name = prepare(agree, cfg, save.step, what, &root_step);
  const std::string dir = join_path(cfg.root, name);
  const auto reports = write_and_agree(agree, cfg, dir, save, root_step, what, times);
  fault::fault_point("after_agree");

  TUTTI_TIMELINE(instant(timeline::kCheckpointWriter, "checkpoint", "shards durable", &timeline::Args().i("step", save.step)));
  publish(agree, cfg, {name, dir, save}, reports, what);
  TUTTI_TIMELINE(instant(timeline::kCheckpointWriter, "checkpoint", "commit", &timeline::Args().i("step", save.step).s("name", name)));
  if (times) times->commit_s = since(t0);

  retain(agree, cfg, name);
  return name;
}

}  // namespace ckpt
}  // namespace tutti
