#include "checkpoint/loader.h"

#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "checkpoint/agreement.h"
#include "checkpoint/catalog.h"
#include "checkpoint/dir_lock.h"
#include "checkpoint/fault_inject.h"
#include "checkpoint/file_util.h"
#include "checkpoint/load_plan.h"
#include "checkpoint/load_workers.h"
#include "checkpoint/manifest.h"
#include "checkpoint/node_share.h"
#include "checkpoint/problem_report.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/retention.h"
#include "checkpoint/shard_reader.h"
#include "checkpoint/untrusted_json.h"
#include "core/check.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {
namespace ckpt {
namespace {

using json = nlohmann::json;

// kRejected: the checkpoint is corrupt (try an older one); kDoesNotFit:
// the caller's state differs (raise); kTransient: an I/O error (retry, then
// raise).
enum Status : int64_t { kOk = 0, kRejected = 1, kDoesNotFit = 2, kTransient = 3 };
constexpr int kReadAttempts = 3;

int64_t classify(const Error& e) {
  switch (e.code()) {
    case ErrorCode::kMismatch:
    case ErrorCode::kInvalidArgument: return kDoesNotFit;
    case ErrorCode::kIo: return kTransient;
    default: return kRejected;
  }
}

// One all-reduce (MAX) of this rank's status as flags: any[k] says that
// some rank's status is k.
std::vector<int64_t> agree_status(Agreement& agree, int64_t status, const char* phase) {
  std::vector<int64_t> flags(4, 0);
  flags[static_cast<size_t>(status)] = 1;
  flags[0] = 0;
  return agree.allreduce_max(std::move(flags), phase);
}

bool none_failed(const std::vector<int64_t>& any) {
  return !any[kRejected] && !any[kDoesNotFit] && !any[kTransient];
}

// Rank 0's view of the directory: complete checkpoints, newest first, and
// whether an empty result may start fresh.
std::string list_candidates(const std::string& root, int64_t step,
                            const FreshStartRule& fresh) {
  json out = {{"names", json::array()}, {"error", ""}, {"fresh_refusal", ""}};
  try {
    auto all = scan_catalog(root);
    std::string newest;
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      if (!it->complete || (step >= 0 && it->step != step)) continue;
      if (newest.empty()) newest = it->name;
      out["names"].push_back(it->name);
    }
    const std::string latest = read_latest(root);
    if (step < 0 && !newest.empty() && latest != newest)
      TUTTI_LOG(kInfo) << "checkpoint load: '" << kLatestName << "' names "
                       << (latest.empty() ? "nothing" : latest) << " but " << newest
                       << " is the newest complete checkpoint (a save was "
                          "interrupted between its manifest and the pointer)";
    if (step < 0 && out["names"].empty()) out["fresh_refusal"] = fresh_start_refusal(root, fresh);
  } catch (const Error& e) {
    out["error"] = e.message();
  }
  return out.dump();
}

// The job resumes from `name`: rank 0 sets newer complete checkpoints aside
// (retention.h) before any rank returns, so that neither a later fallback
// nor a restart before the next save returns to the abandoned timeline.
void abandon_after(Agreement& agree, const std::string& root, const std::string& name) {
  std::string error;
  if (agree.rank() == 0) {
    try {
      CatalogEntry me;
      me.name = name;
      parse_checkpoint_name(name, &me.step, &me.suffix);
      abandon_newer(root, me);
    } catch (const Error& e) {
      error = e.message();
    }
  }
  error = agree.broadcast(error, 0, "setting an abandoned timeline aside");
  if (!error.empty())
    TUTTI_THROW(kIo, "checkpoint ", name, " was loaded, but rank 0 could not set the newer "
                "checkpoints of the abandoned timeline aside: ", error);
}

// Shard s is verified in full by the loader rank (k mod world) where s is
// the k-th shard file (verify()).  For each shard: that rank's rank in
// `node` if it belongs to this node, else -1.
std::vector<int> verifiers_in_node(const OpenedCheckpoint& ckpt, ProcessGroup& comm,
                                   ProcessGroup& node) {
  std::map<int, int> node_rank_of;  // world rank -> node rank
  for (int i = 0; i < node.size(); ++i) node_rank_of[node.world_rank(i)] = i;
  std::vector<int> out(ckpt.shards.size(), -1);
  int k = 0;
  for (size_t s = 0; s < ckpt.shards.size(); ++s) {
    if (ckpt.record_of[s] < 0) continue;
    auto it = node_rank_of.find(comm.world_rank(k++ % comm.size()));
    if (it != node_rank_of.end()) out[s] = it->second;
  }
  return out;
}

// Verification before the agreement (no destination is touched): every
// piece this rank will read, and the shards assigned to it round-robin, so
// that each shard is verified in full by some rank.
void verify(const OpenedCheckpoint& ckpt, const LoadPlan& plan, int rank, int world,
            int node_rank, ShardFiles& files, HostBufferPool& pool, LoadWorkers& workers) {
  std::set<int> whole;
  if (!ckpt.indexed) {
    // Older manifests: whole shards, those read and those assigned.
    whole = plan.shards_read;
    for (int s = rank; s < static_cast<int>(ckpt.shards.size()); s += world) whole.insert(s);
    for (int s : whole) verify_shard_data(ckpt, s, files, pool, workers);
    return;
  }
  int k = 0;
  for (int s = 0; s < static_cast<int>(ckpt.shards.size()); ++s)
    if (ckpt.record_of[static_cast<size_t>(s)] >= 0 && k++ % world == rank) whole.insert(s);
  for (int s : whole) verify_shard_data(ckpt, s, files, pool, workers);
  std::set<std::pair<int, uint64_t>> done;
  std::map<int, std::vector<const StoredTensor*>> pieces;  // per shard, in plan order
  for (const PlanItem& item : plan.items)
    for (const PieceCopies& src : item.sources) {
      const bool mine = src.reader < 0 ? !src.check_in_place : src.reader == node_rank;
      if (!mine || whole.count(src.shard) || !done.insert({src.shard, src.piece->begin}).second)
        continue;
      pieces[src.shard].push_back(src.piece);
    }
  for (const auto& kv : pieces) verify_pieces(kv.first, kv.second, files, pool, workers);
}

}  // namespace

FreshStartRule make_fresh_start_rule(FreshStart requested, bool dir_used_before) {
  FreshStartRule r;
  r.dir_used_before = dir_used_before;
  r.restart_count = config::get_int("TUTTI_RESTART_COUNT");
  r.policy = requested;
  r.source = "CheckpointOptions::fresh_start";
  if (requested == FreshStart::kFromSetting) {
    const std::string v = config::get_string("TUTTI_CKPT_FRESH_START");
    r.source = "TUTTI_CKPT_FRESH_START=" + v;
    if (v == "auto") r.policy = FreshStart::kAuto;
    else if (v == "allow") r.policy = FreshStart::kAllow;
    else if (v == "refuse") r.policy = FreshStart::kRefuse;
    else TUTTI_THROW(kInvalidArgument, "TUTTI_CKPT_FRESH_START='", v,
                     "' (expected auto, allow or refuse)");
  }
  return r;
}

std::string fresh_start_refusal(const std::string& root, const FreshStartRule& rule) {
  if (rule.policy == FreshStart::kRefuse)
    return rule.source == "CheckpointOptions::fresh_start"
               ? "fresh_start is kRefuse (the job must resume)"
               : rule.source + " (the job must resume)";
  std::vector<std::string> why;
  const std::string latest = read_latest(root);
  if (!latest.empty()) why.push_back("'latest' names " + latest);
  if (is_directory(root))
    for (const auto& n : list_dir(root))
      if (n.compare(0, 10, "abandoned-") == 0 || n.compare(0, 6, "stale-") == 0) {
        why.push_back("it holds " + n);
        break;
      }
  if (rule.restart_count > 0 && !rule.dir_used_before)
    why.push_back(detail::cat("this is restart ", rule.restart_count,
                              " (TUTTI_RESTART_COUNT) but no earlier run used the directory "
                              "(it had no ", kLockName, ")"));
  std::string all;
  for (const auto& w : why) all += (all.empty() ? "" : "; ") + w;
  if (all.empty() || rule.policy == FreshStart::kAuto) return all;
  TUTTI_LOG(kWarn) << "no complete checkpoint in '" << root << "' although " << all
                   << ": starting fresh as " << rule.source << " allows";
  return "";
}

std::optional<LoadResult> load_checkpoint(ProcessGroup& comm, const std::string& root,
                                          double timeout_s, const StateDict& dst,
                                          const LoadOptions& options,
                                          const FreshStartRule& fresh,
                                          HostBufferPool& pool) {
  Agreement agree(comm, timeout_s, "checkpoint load from '" + root + "'");
  const int rank = agree.rank(), world = agree.size();
  ReadStats stats;
  StateDict stored;  // dst with per-rank tensors as rows of [world, ...]
  std::string listing =
      agree.broadcast(rank == 0 ? list_candidates(root, options.step, fresh) : std::string(),
                      0, "listing checkpoints");
  const json list = parse_untrusted_json(listing, 3, "checkpoint listing");
  if (!list["error"].get<std::string>().empty())
    TUTTI_THROW(kIo, "rank 0 could not list checkpoints in '", root,
                "': ", list["error"].get<std::string>());
  if (list["names"].empty()) {
    if (options.step >= 0)
      TUTTI_THROW(kNotFound, "no complete checkpoint of step ", options.step,
                  " in '", root, "'");
    const std::string refusal = list["fresh_refusal"].get<std::string>();
    if (!refusal.empty())
      TUTTI_THROW(kNotFound, "no complete checkpoint in '", root,
                  "', but a history was expected: ", refusal,
                  ". Is the volume mounted, is this the right directory? To start "
                  "from scratch anyway set CheckpointOptions::fresh_start = "
                  "FreshStart::kAllow or TUTTI_CKPT_FRESH_START=allow");
    TUTTI_LOG(kInfo) << "no complete checkpoint in '" << root << "': starting fresh";
    return std::nullopt;
  }

  // Replicated state is read once per node when every rank of the node
  // holds the same replicated tensors (node_share.h).
  std::shared_ptr<ProcessGroup> node;
  std::unique_ptr<Agreement> node_agree;
  if (world > 1) {
    node = comm.node_group();
    if (node->size() > 1) {
      node_agree = std::make_unique<Agreement>(*node, timeout_s, "checkpoint load from '" + root + "'");
      if (!agree_shareable(*node_agree, dst)) node_agree.reset();
    }
  }

  LoadWorkers workers(LoadWorkers::count_for(node ? node->size() : 1));
  std::vector<std::string> reasons;
  bool touched = false;
  for (const auto& jn : list["names"]) {
    const std::string name = jn.get<std::string>();
    const std::string dir = join_path(root, name);
    const std::string mpath = join_path(dir, kManifestName);
    for (int attempt = 1;; ++attempt) {
      int64_t status = kOk;
      std::string reason;
      // Rank 0 reads the manifest once; every rank verifies it.
      std::string text;
      if (rank == 0) {
        try {
          text = read_file(mpath, max_header_bytes());
          ++stats.files_opened;
          stats.bytes_read += text.size();
        } catch (const Error& e) {
          status = classify(e);
          reason = e.message();
        }
      }
      text = agree.broadcast(text, 0, "reading the manifest");
      OpenedCheckpoint ckpt;
      LoadPlan plan;
      std::unique_ptr<ShardFiles> files;
      try {
        fault::fault_point("load_read");
        // Empty elsewhere: rank 0 failed to read it and reports why (an
        // empty file fails rank 0's parse).
        if (!text.empty() || rank == 0) {
          ckpt = open_checkpoint(dir, parse_manifest(text, mpath), &stats);
          stored = dst;  // inside the agreement: an invalid per-rank tensor raises everywhere
          per_rank_as_stored(&stored, rank, world);
          plan = plan_load(ckpt, stored, options, rank);
          if (node_agree)
            assign_node_reads(&plan, ckpt, stored, verifiers_in_node(ckpt, comm, *node),
                              node_agree->size());
          files = std::make_unique<ShardFiles>(ckpt, &stats);
          verify(ckpt, plan, rank, world, node_agree ? node_agree->rank() : 0, *files, pool,
                 workers);
        }
      } catch (const Error& e) {
        if (status == kOk) {
          status = classify(e);
          reason = e.message();
        }
      }
      std::vector<int64_t> any = agree_status(agree, status, "verifying a checkpoint");
      if (none_failed(any)) {
        // Verified everywhere: now write into the destination tensors.
        touched = true;
        try {
          execute_plan(ckpt, plan, stored, *files, pool, workers);
        } catch (const Error& e) {
          status = classify(e);
          reason = e.message();
        }
        if (node_agree) {
          const std::string err = execute_node_reads(plan, stored, *node_agree, *files, pool);
          if (!err.empty() && status == kOk) {
            status = kTransient;
            reason = err;
          }
        }
        try {
          if (status == kOk) apply_resized(plan, dst, ckpt.manifest.world_size, world, rank);
        } catch (const Error& e) {
          status = classify(e);
          reason = e.message();
        }
        any = agree_status(agree, status, "reading a checkpoint");
      }
      if (none_failed(any)) {
        if (options.resume) abandon_after(agree, root, name);
        LoadResult r;
        r.step = ckpt.manifest.step;
        r.name = name;
        r.metadata_json = ckpt.manifest.metadata.dump();
        r.saved_world_size = ckpt.manifest.world_size;
        r.skipped = plan.skipped;
        r.files_opened = stats.files_opened;
        r.bytes_read = stats.bytes_read;
        if (plan.unused > 0)
          TUTTI_LOG(kInfo) << "checkpoint " << name << ": " << plan.unused
                           << " stored tensors were not asked for";
        TUTTI_LOG(kInfo) << "loaded checkpoint " << name << " (step " << r.step
                         << ", written by " << r.saved_world_size << " ranks)";
        return r;
      }
      // Every rank learns the failing ranks' reasons (file, offset, errno),
      // the lowest few of each kind (problem_report.h).
      auto problems = gather_problems(agree, status, reason, "reporting a checkpoint's problems");
      if (any[kDoesNotFit])
        TUTTI_THROW(kMismatch, "checkpoint ", dir, " does not fit the state: ",
                    problems[kDoesNotFit].text);
      if (any[kTransient]) {
        // An I/O error (EIO, ESTALE, EMFILE, ...) says nothing about the
        // checkpoint: retry it, then raise; never fall back to an older one
        // (which would also abandon this one's timeline).
        const std::string why = problems[kTransient].text;
        if (attempt < kReadAttempts) {
          TUTTI_LOG(kWarn) << "checkpoint " << name << ": read error (attempt " << attempt
                           << " of " << kReadAttempts << "), retrying: " << why;
          std::this_thread::sleep_for(std::chrono::milliseconds(200 << (attempt - 1)));
          continue;
        }
        TUTTI_THROW(kIo, "checkpoint ", dir, " could not be read after ", kReadAttempts,
                    " attempts (an I/O error is not corruption: no older checkpoint was "
                    "tried and nothing was set aside): ", why);
      }
      const std::string why = problems[kRejected].text;
      TUTTI_LOG(kWarn) << "checkpoint " << name << " cannot be used, trying an older one: "
                       << why;
      reasons.push_back(name + ": " + why);
      break;
    }
  }
  std::string all;
  for (const auto& r : reasons) all += "; " + r;
  TUTTI_THROW(kCorrupt, "no checkpoint in '", root, "' could be loaded",
              touched ? " (the state may be partly overwritten)" : "", all);
}

std::string verify_checkpoint_dir(const std::string& path, HostBufferPool& pool) {
  try {
    ReadStats stats;
    OpenedCheckpoint c = open_checkpoint(path, &stats);
    ShardFiles files(c, &stats);
    LoadWorkers workers(LoadWorkers::count_for(1));
    for (int s = 0; s < static_cast<int>(c.shards.size()); ++s)
      if (c.record_of[static_cast<size_t>(s)] >= 0)
        verify_shard_data(c, s, files, pool, workers);
    return "";
  } catch (const Error& e) {
    return e.message();
  }
}

}  // namespace ckpt
}  // namespace tutti
