// CommitTiers (include/tutti/commit_tiers.h): elastic commits in the memory tier and the
// checkpoint directory, and the load that picks between them.
#include "tutti/commit_tiers.h"

#include <algorithm>
#include <exception>
#include <thread>
#include <utility>

#include "core/check.h"
#include "elastic/agree.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {
namespace elastic {

int64_t agree_max(ProcessGroup& group, int64_t v, const char* name) {
  group.allreduce(Tensor::of(&v, 1), ReduceOp::kMax, {name});
  return v;
}

namespace {

enum class Tier { kNone, kMemory, kDurable };

bool is_load_failure(ErrorCode c) {
  // What a tier's load raises on every rank when it cannot serve this load;
  // anything else (a lost rank, a timeout) is not the tier's problem.
  return c == ErrorCode::kCorrupt || c == ErrorCode::kNotFound || c == ErrorCode::kIo;
}

}  // namespace

struct CommitTiers::Impl {
  ProcessGroupPtr group;
  CommitTierOptions options;
  std::optional<MemoryTier> tier;
  CheckpointOptions memory_options, durable_options;
  std::unique_ptr<CheckpointManager> memory, durable;
  int64_t durable_every = 1;
  int64_t commits = 0;
  bool warned_budget = false;
  Tier last_saved = Tier::kNone;
  // The tier the last newest-commit load chose, and its step: a load of
  // exactly that step (tutti.torch.checkpoint.load asks for the head first)
  // goes to the same tier.
  Tier chosen = Tier::kNone;
  int64_t chosen_step = -1;

  void check_open() const {
    TUTTI_ARG_CHECK(memory || durable, "elastic commits: closed (the job finished)");
  }

  void open_managers() {
    if (tier) memory.reset(new CheckpointManager(group, memory_options));
    if (!durable_options.dir.empty()) durable.reset(new CheckpointManager(group, durable_options));
  }

  // Local: whether the memory tier's budget holds this commit beside the
  // newest (a failure to measure: no room); *why says why not.
  bool local_room(const Components& components, std::string* why) const {
    try {
      uint64_t state_bytes = 0;
      for (auto& c : components)
        for (const NamedTensor& nt : c.second->state_dict()) state_bytes += nt.tensor.nbytes();
      return memory_tier_has_room(memory->dir(), state_bytes, why);
    } catch (const Error& e) {
      *why = detail::cat("cannot measure '", tier->dir, "': ", e.message());
      return false;
    }
  }

  // Said once, on rank 0, when the ranks agreed that a commit does not fit.
  void warn_no_room(const std::string& why) {
    if (!warned_budget && group->rank() == 0)
      TUTTI_LOG(kWarn) << (why.empty() ? "another rank has no room in its memory tier" : why)
                       << (durable ? detail::cat(": commits go to '", durable->dir(),
                                                 "' only until they fit again")
                                   : std::string(": commits are not kept (a restart resumes "
                                                 "from the last commit that fitted)"));
    warned_budget = true;
  }

  std::optional<LoadResult> load_newest(const Components& components, const LoadOptions& o) {
    std::optional<LoadResult> m;
    std::string memory_why;
    if (memory) {
      try {
        m = memory->load(components, o);
        if (!m) memory_why = "holds no complete commit";
      } catch (const Error& e) {
        if (!durable || !is_load_failure(e.code())) throw;
        memory_why = detail::cat("cannot serve the load (", e.message(), ")");
      }
    }
    if (!durable) {
      chosen = m ? Tier::kMemory : Tier::kNone;
      chosen_step = m ? m->step : -1;
      return m;
    }
    const int64_t d = agree_max(*group, durable->latest_step().value_or(-1),
                                "tutti.elastic.durable_latest");
    if (m && m->step >= d) {
      if (group->rank() == 0 && d >= 0)
        TUTTI_LOG(kInfo) << "elastic: the commit of step " << m->step << " came from the memory "
                         << "tier (the newest in '" << durable->dir() << "' is step " << d << ")";
      chosen = Tier::kMemory;
      chosen_step = m->step;
      return m;
    }
    if (memory && d >= 0 && group->rank() == 0)
      TUTTI_LOG(kWarn) << "elastic: loading from '" << durable->dir() << "': the memory tier "
                       << (m ? detail::cat("holds step ", m->step, ", older than its step ", d)
                             : memory_why);
    std::optional<LoadResult> r = durable->load(components, o);
    if (m && (!r || r->step < m->step)) {
      // The directory's newest did not verify and an older one loaded: the
      // memory tier's commit is newer after all.
      LoadOptions again = o;
      again.step = m->step;
      r = memory->load(components, again);
      chosen = Tier::kMemory;
    } else {
      chosen = r ? Tier::kDurable : Tier::kNone;
    }
    chosen_step = r ? r->step : -1;
    return r;
  }

  bool memory_holds(int64_t step) const {
    if (!memory) return false;
    for (const CheckpointInfo& i : memory->list())
      if (i.complete && i.step == step) return true;
    return false;
  }
};

CommitTiers::CommitTiers(ProcessGroupPtr group, CommitTierOptions options)
    : impl_(new Impl) {
  Impl& s = *impl_;
  TUTTI_ARG_CHECK(group != nullptr, "elastic commits: null process group");
  s.group = std::move(group);
  s.options = std::move(options);
  const bool has_dir = !s.options.durable_dir.empty();
  const bool use_memory = !has_dir || (s.options.memory < 0 ? config::get_bool("TUTTI_COMMIT_MEMORY")
                                                            : s.options.memory != 0);
  s.durable_every = s.options.durable_every > 0 ? s.options.durable_every
                                                : config::get_int("TUTTI_COMMIT_DURABLE_EVERY");
  TUTTI_ARG_CHECK(s.durable_every >= 1, "elastic commits: TUTTI_COMMIT_DURABLE_EVERY=",
                  s.durable_every, " (expected at least 1)");
  if (use_memory) {
    // Opened on every rank; a failure on one must not leave the others in
    // the next collective: agree, then raise (or, with a directory, go on
    // without the memory tier) everywhere.
    std::string problem;
    try {
      s.tier = open_memory_tier();
    } catch (const Error& e) {
      problem = e.what();
    }
    if (agree_max(*s.group, problem.empty() ? 0 : 1, "tutti.elastic.memory_tier")) {
      const std::string why =
          problem.empty() ? "it failed on another rank (see its error)" : problem;
      if (!has_dir)
        TUTTI_THROW(kInvalidArgument, "no checkpoint directory for commits, and the memory tier "
                    "cannot keep them: ", why, " (or set TUTTI_CKPT_DIR)");
      // INFO, not WARN: with a directory the memory tier is a speed-up
      // (restarts from RAM), and plain mpirun without a job id is common.
      if (s.group->rank() == 0)
        TUTTI_LOG(kInfo) << "elastic: commits go to '" << s.options.durable_dir
                         << "' only: the memory tier cannot keep them: " << why;
      s.tier.reset();
    }
  }
  if (s.tier) {
    s.memory_options.dir = s.tier->dir + "/commits";
    s.memory_options.keep_last = has_dir ? 1 : std::max(1, s.options.keep_last);
    s.memory_options.async = s.options.async;
    s.memory_options.fresh_start = FreshStart::kAllow;  // an empty memory tier can only start fresh
  }
  if (has_dir) {
    s.durable_options.dir = s.options.durable_dir;
    s.durable_options.keep_last = s.options.keep_last;
    s.durable_options.async = s.options.async;
  }
  s.open_managers();
}

CommitTiers::~CommitTiers() = default;

void CommitTiers::save(int64_t step, const Components& components,
                       const std::string& metadata_json) {
  Impl& s = *impl_;
  s.check_open();
  // The count decides which commits also go to the directory, so every rank
  // must hold the same: agreed, not counted locally.  A lost rank (ULFM) can
  // fail a collective on some survivors and complete it on others; then
  // some had entered the next commit (and counted it) and some had not, and
  // the next due commit went to both tiers on some ranks only (seen on the
  // netns rig: a commit's collectives on different managers, ended by
  // TUTTI_TIMEOUT and a restart).
  // One all-reduce agrees on both that and the budget: {no room on some
  // rank, the count}.
  bool in_memory = false;
  if (s.memory) {
    std::string why;
    int64_t agreed[2] = {s.local_room(components, &why) ? 0 : 1, s.commits + 1};
    s.group->allreduce(Tensor::of(agreed, 2), ReduceOp::kMax, {"tutti.elastic.commit"});
    s.commits = agreed[1];
    in_memory = agreed[0] == 0;
    if (!in_memory) s.warn_no_room(why);
  } else {
    ++s.commits;
  }
  const bool in_dir = s.durable && (!in_memory || s.commits % s.durable_every == 0);
  if (in_memory && in_dir && !s.options.async) {
    // Both, at once: the directory's write on a thread of its own while the
    // memory tier's runs here (each manager has its own communicator), so
    // the commit costs the slower of the two, not their sum.  The state is
    // only read, and the caller waits for both.
    std::exception_ptr dir_error;
    std::thread dir_save([&] {
      try {
        s.durable->save(step, components, metadata_json);
      } catch (...) {
        dir_error = std::current_exception();
      }
    });
    std::exception_ptr memory_error;
    try {
      s.memory->save(step, components, metadata_json);
    } catch (...) {
      memory_error = std::current_exception();
    }
    dir_save.join();
    if (memory_error) std::rethrow_exception(memory_error);
    if (dir_error) std::rethrow_exception(dir_error);
  } else if (in_memory) {
    s.memory->save(step, components, metadata_json);
  } else if (in_dir) {
    s.durable->save(step, components, metadata_json);
  }
  if (in_memory || in_dir) s.last_saved = in_dir ? Tier::kDurable : Tier::kMemory;
}

void CommitTiers::wait() {
  if (impl_->memory) impl_->memory->wait();
  if (impl_->durable) impl_->durable->wait();
}

bool CommitTiers::in_flight() const {
  return (impl_->memory && impl_->memory->in_flight()) ||
         (impl_->durable && impl_->durable->in_flight());
}

std::optional<LoadResult> CommitTiers::load(const Components& components,
                                           const LoadOptions& options) {
  Impl& s = *impl_;
  s.check_open();
  if (options.step < 0) return s.load_newest(components, options);
  // Exactly one step: from the tier the last newest-commit load chose for
  // it, else the memory tier when it holds it (agreed: every rank must ask
  // the same manager), else the directory.
  bool from_memory = s.memory != nullptr;
  if (s.memory && s.durable) {
    if (s.chosen_step == options.step)
      from_memory = s.chosen == Tier::kMemory;
    else
      from_memory = agree_max(*s.group, s.memory_holds(options.step) ? 0 : 1,
                              "tutti.elastic.memory_holds") == 0;
  }
  return (from_memory ? s.memory : s.durable)->load(components, options);
}

std::optional<int64_t> CommitTiers::latest_step() const {
  std::optional<int64_t> m = impl_->memory ? impl_->memory->latest_step() : std::nullopt;
  std::optional<int64_t> d = impl_->durable ? impl_->durable->latest_step() : std::nullopt;
  if (m && d) return std::max(*m, *d);
  return m ? m : d;
}

std::vector<CheckpointInfo> CommitTiers::list() const {
  impl_->check_open();
  return impl_->durable ? impl_->durable->list() : impl_->memory->list();
}

const std::string& CommitTiers::dir() const {
  impl_->check_open();
  return impl_->memory ? impl_->memory->dir() : impl_->durable->dir();
}

SaveStats CommitTiers::last_save_stats() const {
  const Impl& s = *impl_;
  s.check_open();
  if (s.last_saved == Tier::kDurable) return s.durable->last_save_stats();
  return s.memory ? s.memory->last_save_stats() : s.durable->last_save_stats();
}

bool CommitTiers::memory_tier() const { return impl_->tier.has_value(); }

const std::string& CommitTiers::durable_dir() const { return impl_->durable_options.dir; }

void CommitTiers::reopen(ProcessGroupPtr group) {
  Impl& s = *impl_;
  TUTTI_ARG_CHECK(group != nullptr, "elastic commits: null process group");
  s.memory.reset();  // their communicators were released by the recovery
  s.durable.reset();
  s.group = std::move(group);
  s.chosen = Tier::kNone;
  s.chosen_step = -1;
  s.open_managers();
}

void CommitTiers::finish() {
  Impl& s = *impl_;
  if (!s.tier) return;
  s.memory.reset();
  agree_max(*s.group, 0, "tutti.elastic.finish");  // every rank closed its managers
  if (local_rank() == 0) remove_memory_tier();
  s.tier.reset();
}

}  // namespace elastic
}  // namespace tutti
