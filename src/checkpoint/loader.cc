#include "checkpoint/loader.h"

#include <nlohmann/json.hpp>

#include "checkpoint/agreement.h"
#include "checkpoint/catalog.h"
#include "checkpoint/file_util.h"
#include "checkpoint/load_plan.h"
#include "checkpoint/retention.h"
#include "checkpoint/shard_reader.h"
#include "checkpoint/untrusted_json.h"
#include "core/check.h"
#include "tutti/log.h"

namespace tutti {
namespace ckpt {
namespace {

using json = nlohmann::json;

enum Status : int64_t { kOk = 0, kRejected = 1, kDoesNotFit = 2 };

// Rank 0's view of the directory: complete checkpoints, newest first.
std::string list_candidates(const std::string& root, int64_t step) {
  json out = {{"names", json::array()}, {"error", ""}};
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
  } catch (const Error& e) {
    out["error"] = e.message();
  }
  return out.dump();
}

std::string ranks_with(const std::vector<int64_t>& st, int64_t value) {
  std::string s;
  for (size_t r = 0; r < st.size(); ++r)
    if (st[r] == value) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
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

}  // namespace

std::optional<LoadResult> load_checkpoint(ProcessGroup& comm, const std::string& root,
                                          double timeout_s, const StateDict& dst,
                                          const LoadOptions& options,
                                          HostBufferPool& pool) {
  Agreement agree(comm, timeout_s, "checkpoint load from '" + root + "'");
  const int rank = agree.rank(), world = agree.size();
  std::string listing =
      agree.broadcast(rank == 0 ? list_candidates(root, options.step) : std::string(),
                      0, "listing checkpoints");
  const json list = parse_untrusted_json(listing, 3, "checkpoint listing");
  if (!list["error"].get<std::string>().empty())
    TUTTI_THROW(kIo, "rank 0 could not list checkpoints in '", root,
                "': ", list["error"].get<std::string>());
  if (list["names"].empty()) {
    if (options.step >= 0)
      TUTTI_THROW(kNotFound, "no complete checkpoint of step ", options.step,
                  " in '", root, "'");
    TUTTI_LOG(kInfo) << "no complete checkpoint in '" << root << "': starting fresh";
    return std::nullopt;
  }

  std::vector<std::string> reasons;
  bool touched = false;
  for (const auto& jn : list["names"]) {
    const std::string name = jn.get<std::string>();
    const std::string dir = join_path(root, name);
    int64_t status = kOk;
    std::string reason;
    OpenedCheckpoint ckpt;
    LoadPlan plan;
    try {
      ckpt = open_checkpoint(dir);
      plan = plan_load(ckpt, dst, options, rank);
      std::set<int> verify = plan.shards_read;
      for (int s = rank; s < static_cast<int>(ckpt.shards.size()); s += world)
        verify.insert(s);
      for (int s : verify) verify_shard_data(ckpt.shards[static_cast<size_t>(s)], pool);
    } catch (const Error& e) {
      status = (e.code() == ErrorCode::kMismatch ||
                e.code() == ErrorCode::kInvalidArgument)
                   ? kDoesNotFit
                   : kRejected;
      reason = e.message();
    }
    std::vector<int64_t> st = agree.allgather({status}, "verifying a checkpoint");
    const std::string misfits = ranks_with(st, kDoesNotFit);
    if (!misfits.empty()) {
      if (status == kDoesNotFit)
        TUTTI_THROW(kMismatch, "checkpoint ", dir, " does not fit the state: ", reason);
      TUTTI_THROW(kMismatch, "checkpoint ", dir,
                  " does not fit the state on rank(s) ", misfits,
                  " (see the error there)");
    }
    if (ranks_with(st, kRejected).empty()) {
      // Verified everywhere: now write into the destination tensors.
      touched = true;
      try {
        execute_plan(ckpt, plan, dst, pool);
      } catch (const Error& e) {
        status = kRejected;
        reason = e.message();
      }
      st = agree.allgather({status}, "reading a checkpoint");
    }
    const std::string rejecting = ranks_with(st, kRejected);
    if (rejecting.empty()) {
      if (options.resume) abandon_after(agree, root, name);
      LoadResult r;
      r.step = ckpt.manifest.step;
      r.name = name;
      r.metadata_json = ckpt.manifest.metadata.dump();
      r.saved_world_size = ckpt.manifest.world_size;
      r.skipped = plan.skipped;
      if (plan.unused > 0)
        TUTTI_LOG(kInfo) << "checkpoint " << name << ": " << plan.unused
                         << " stored tensors were not asked for";
      TUTTI_LOG(kInfo) << "loaded checkpoint " << name << " (step " << r.step
                       << ", written by " << r.saved_world_size << " ranks)";
      return r;
    }
    const std::string why =
        reason.empty() ? "rejected by rank(s) " + rejecting + " (see their log)" : reason;
    TUTTI_LOG(kWarn) << "checkpoint " << name << " cannot be used, trying an older one: "
                     << why;
    reasons.push_back(name + ": " + why);
  }
  std::string all;
  for (const auto& r : reasons) all += "; " + r;
  TUTTI_THROW(kCorrupt, "no checkpoint in '", root, "' could be loaded",
              touched ? " (the state may be partly overwritten)" : "", all);
}

std::string verify_checkpoint_dir(const std::string& path, HostBufferPool& pool) {
  try {
    OpenedCheckpoint c = open_checkpoint(path);
    for (const auto& s : c.shards) verify_shard_data(s, pool);
    return "";
  } catch (const Error& e) {
    return e.message();
  }
}

}  // namespace ckpt
}  // namespace tutti
