// ElasticState and elastic_run (include/tutti/elastic.h): commits to the
// memory tier and the checkpoint directory (tutti/commit_tiers.h), a stop
// agreed at each commit, reset callbacks after a restart or a resize.
#include "tutti/elastic.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <utility>
#include <vector>

#include "comm/rank_list.h"
#include "comm/registry.h"
#include "core/check.h"
#include "core/clock.h"
#include "tutti/commit_tiers.h"
#include "tutti/config.h"
#include "tutti/log.h"
#include "tutti/recovery.h"

namespace tutti {

namespace {

struct StopAtCommit {};  // thrown by commit() inside elastic_run

}  // namespace

class ElasticState::Impl {
 public:
  Impl(ProcessGroupPtr g, Components c, ElasticOptions o)
      : group(std::move(g)), components(std::move(c)), options(std::move(o)) {
    TUTTI_ARG_CHECK(group != nullptr, "ElasticState: null process group");
    elastic::CommitTierOptions to;
    to.durable_dir =
        options.ckpt_dir.empty() ? config::get_string("TUTTI_CKPT_DIR") : options.ckpt_dir;
    to.keep_last = options.keep_last;
    to.async = false;  // a commit has landed when commit() returns
    to.durable_every = options.durable_every;
    to.memory = options.memory_tier;
    try {
      commits.reset(new elastic::CommitTiers(group, to));
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidArgument) throw;
      TUTTI_THROW(kInvalidArgument, "ElasticState: ", e.message());
    }
    group_is_world = group.get() == world().get();
    if (!options.monitor) {
      own_monitor.reset(new PreemptionMonitor());
      options.monitor = own_monitor.get();
    }
  }

  // In-process recovery (elastic_run, ULFM): why this loop cannot go on
  // after `lost` ("" when it can: the world lost them and a commit exists).
  std::string cannot_recover() const {
    if (!group_is_world)
      return "the ElasticState was built on a group other than tutti::world(), which "
             "recovery cannot rebuild";
    if (!have_commit) return "nothing was committed yet";
    return "";
  }
  // After tutti::recover(): the commit managers over the new world, the
  // reset callbacks (first: they re-lay out sharded state for the new size),
  // then the newest commit loaded at the new size.
  void rebuild_after_recovery() {
    group = world();
    commits->reopen(group);
    for (auto& cb : resets) cb();
    const std::optional<LoadResult> r = commits->load(components);
    if (!r)
      TUTTI_THROW(kNotFound, "elastic: after recovering from lost ranks, no commit was found "
                  "in '", commits->dir(), "' (the last one was step ", step, ")");
    step = r->step;
    metadata = r->metadata_json;
    have_commit = true;
  }

  ProcessGroupPtr group;
  bool group_is_world = false;
  Components components;
  ElasticOptions options;
  std::unique_ptr<elastic::CommitTiers> commits;
  std::unique_ptr<PreemptionMonitor> own_monitor;
  std::vector<std::function<void()>> resets;
  int64_t step = 0;
  std::string metadata = "{}";
  bool have_commit = false;
  bool running = false;  // inside elastic_run
};

ElasticState::ElasticState(ProcessGroupPtr group, Components components, ElasticOptions options)
    : impl_(new Impl(std::move(group), std::move(components), std::move(options))) {}

ElasticState::~ElasticState() = default;

void ElasticState::commit(int64_t step, const std::string& metadata_json) {
  Impl& s = *impl_;
  s.commits->save(step, s.components, metadata_json);
  s.commits->wait();
  s.step = step;
  s.metadata = metadata_json;
  s.have_commit = true;
  if (s.options.monitor->should_stop(*s.group) && s.running) {
    if (s.group->rank() == 0)
      TUTTI_LOG(kWarn) << "elastic: a stop notice was agreed at the commit of step " << step
                       << ": exiting with " << kPreemptedExitCode
                       << " so that tutti-run starts the job again";
    throw StopAtCommit{};
  }
}

void ElasticState::restore() {
  Impl& s = *impl_;
  TUTTI_ARG_CHECK(s.have_commit, "ElasticState::restore: nothing committed or loaded yet");
  LoadOptions lo;
  lo.step = s.step;
  s.commits->load(s.components, lo);
}

int64_t ElasticState::step() const { return impl_->step; }
const std::string& ElasticState::metadata() const { return impl_->metadata; }
const std::string& ElasticState::dir() const { return impl_->commits->dir(); }
bool ElasticState::memory_tier() const { return impl_->commits->memory_tier(); }
void ElasticState::on_reset(std::function<void()> callback) {
  impl_->resets.push_back(std::move(callback));
}

namespace {

// This rank's tensor-parallel group lost a member (ElasticOptions::tp_size):
// the rest of the job goes on without the group, this process ends cleanly
// (exit code 0, not a failure for the launcher or tutti-run).
[[noreturn]] void leave_with_tp_group(ElasticState::Impl& s, const RecoveryResult& r) {
  TUTTI_LOG(kWarn) << "elastic: this rank's tensor-parallel group (TP " << s.options.tp_size
                   << ") lost world rank(s) " << comm::join_ranks(r.lost, ",") << ": it leaves the job as a whole DP "
                   << "replica, the other " << r.new_size << " ranks go on from the commit of "
                   << "step " << s.step << "; exiting with code 0";
  s.running = false;
  s.commits.reset();  // their communicators were released by the recovery
  try {
    shutdown();
  } catch (const std::exception& e) {
    TUTTI_LOG(kError) << "shutdown before leaving the job failed: " << e.what();
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::exit(0);
}

// A lost rank inside elastic_run: tutti::recover(), the newest commit at the
// new size, the reset callbacks; or, where that cannot be, the error as
// without ULFM (under tutti-run: exit 76, and a restart).
void recover_or_raise(ElasticState::Impl& s, const Error& lost,
                      std::optional<RecoveryScope>& scope) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string why = s.cannot_recover();
  RecoveryResult r;
  if (why.empty()) {
    try {
      RecoveryOptions ro;
      ro.tp_size = s.options.tp_size;
      r = recover(ro);
      const int64_t min_size = config::get_int("TUTTI_ULFM_MIN_SIZE");
      if (r.new_size < min_size)
        why = detail::cat(r.new_size, " ranks survive, fewer than TUTTI_ULFM_MIN_SIZE=",
                          min_size);
      else if (r.leaving)
        leave_with_tp_group(s, r);
      else
        s.rebuild_after_recovery();
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kRanksLost) throw;
      why = detail::cat("recovery failed: ", e.message());
    }
  }
  if (!why.empty()) {
    TUTTI_LOG(kError) << "elastic: no in-process recovery (" << why << ")";
    scope.reset();
    comm::communicator_broke(lost);  // TUTTI_EXIT_ON_COMM_FAILURE: exit 76
    throw lost;
  }
  if (s.group->rank() == 0) {
    TUTTI_LOG(kWarn) << "elastic: recovered in-process: lost world rank(s) "
                     << comm::join_ranks(r.lost, ",") << ", "
                     << r.old_size << " -> " << r.new_size << " ranks, resumed from the commit "
                     << "of step " << s.step << " in "
                     << seconds_since(t0)
                     << " s";
  }
}

}  // namespace

int elastic_run(ElasticState& state, const std::function<void(ElasticState&)>& train) {
  ElasticState::Impl& s = *state.impl_;
  TUTTI_ARG_CHECK(s.options.tp_size >= 1 && s.group->size() % s.options.tp_size == 0,
                  "elastic_run: ElasticOptions::tp_size ", s.options.tp_size,
                  " must be positive and divide the group's ", s.group->size(), " ranks");
  const std::optional<LoadResult> r = s.commits->load(s.components);
  if (r) {
    s.step = r->step;
    s.metadata = r->metadata_json;
    s.have_commit = true;
    if (s.group->rank() == 0)
      TUTTI_LOG(kInfo) << "elastic: resumed from the commit of step " << r->step << " ("
                       << r->saved_world_size << " ranks, now " << s.group->size() << ")";
  }
  if (config::get_int("TUTTI_RESTART_COUNT") > 0 || (r && r->saved_world_size != s.group->size()))
    for (auto& cb : s.resets) cb();
  s.running = true;
  // With ULFM a lost rank is raised here (not an exit under tutti-run), and
  // the survivors go on in this process (docs/elastic.md).
  std::optional<RecoveryScope> scope;
  if (recovery_available()) scope.emplace();
  for (;;) {
    try {
      train(state);
      break;
    } catch (const StopAtCommit&) {
      s.running = false;
      s.commits.reset();  // closes the managers (the commit landed in commit())
      exit_preempted();
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kRanksLost || !scope) throw;
      recover_or_raise(s, e, scope);
    }
  }
  s.running = false;
  s.commits->finish();  // the memory tier's commits are not needed any more
  return 0;
}

}  // namespace tutti
