// CheckpointManager: the public face; owns the private communicator, the
// snapshot buffers and the writer thread.
//
// Threading: save() runs on the caller's thread up to the snapshot; the
// persist-and-commit half runs on the writer thread (async) or inline.  At
// most one save is in flight: save(), wait() and load*() first wait for it,
// so the writer's collectives and the loader's never overlap on the
// private communicator, and every rank issues them in the same order.
#include "tutti/checkpoint.h"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "checkpoint/agreement.h"
#include "checkpoint/catalog.h"
#include "checkpoint/commit.h"
#include "checkpoint/digest.h"
#include "checkpoint/dir_lock.h"
#include "checkpoint/election.h"
#include "checkpoint/fault_inject.h"
#include "checkpoint/file_util.h"
#include "checkpoint/loader.h"
#include "checkpoint/manifest.h"
#include "checkpoint/memory_replica.h"
#include "checkpoint/memory_store.h"
#include "checkpoint/shard_geometry.h"
#include "checkpoint/snapshot.h"
#include "core/check.h"
#include "core/timeline.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {

using ckpt::Snapshot;

class CheckpointManager::Impl {
 public:
  Impl(ProcessGroupPtr group, CheckpointOptions options);
  ~Impl();

  // `state` runs inside the agreement, so that any rank's invalid state
  // (or component list) raises on every rank.
  void save(int64_t step, const std::function<StateDict()>& state,
            const std::string& metadata, std::vector<std::string> components);
  void wait();
  bool in_flight() const {
    std::lock_guard<std::mutex> lock(mu_);
    return job_ != nullptr;
  }
  std::optional<LoadResult> load(const StateDict& state, const LoadOptions& options);

  const std::string& dir() const { return cfg_.root; }
  SaveStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  struct Job {
    int64_t step = 0;
    Snapshot snap;
    nlohmann::json metadata;
    std::vector<std::string> components;
    bool once = true;                     // the layout of this save
    std::vector<ckpt::TensorDecl> declared;  // rank 0, once layout
    std::string snapshot_error;  // the copy failed after the layout was agreed
  };
  void writer_loop();
  void persist(Job& job);
  // Agrees on the layout (election.h) and copies what this rank writes.
  // Raises on every rank when any rank's state is invalid.
  void snapshot(Job& job, const std::function<StateDict()>& state);
  void log_layout(const ckpt::Election& e, int64_t step);

  std::string parent_name() const {
    std::lock_guard<std::mutex> lock(mu_);
    return parent_;
  }

  ProcessGroupPtr comm_;
  ckpt::CommitConfig cfg_;
  bool async_;
  HostBufferPool pool_{/*pinned=*/true};
  ckpt::SnapshotCopier copier_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<Job> job_;  // the save in flight
  bool running_ = false;      // the writer thread is persisting job_
  std::exception_ptr error_;  // its failure, rethrown by wait()
  bool stop_ = false;
  SaveStats stats_;
  // The checkpoint the state descends from: the last one loaded or saved
  // ("" before either), the next manifest's parent.
  std::string parent_;
  std::shared_ptr<ckpt::DirLock> lock_;  // rank 0 only
  std::unique_ptr<ckpt::MemoryReplica> replica_;  // the memory tier on several hosts
  ckpt::FreshStartRule fresh_;
  ckpt::ElectionConfig layout_;
  bool warned_fallback_ = false, warned_divergent_ = false;
  std::thread writer_;
};

CheckpointManager::Impl::Impl(ProcessGroupPtr group, CheckpointOptions o)
    : async_(o.async), copier_(o.cuda_stream) {
  TUTTI_ARG_CHECK(group != nullptr, "CheckpointManager: null process group");
  cfg_.root = o.dir.empty() ? config::get_string("TUTTI_CKPT_DIR") : o.dir;
  TUTTI_ARG_CHECK(!cfg_.root.empty(),
                  "CheckpointManager: no checkpoint directory (set "
                  "CheckpointOptions::dir or TUTTI_CKPT_DIR)");
  while (cfg_.root.size() > 1 && cfg_.root.back() == '/') cfg_.root.pop_back();
  cfg_.keep_last = o.keep_last > 0
                       ? o.keep_last
                       : static_cast<int>(config::get_int("TUTTI_CKPT_KEEP"));
  cfg_.keep_last = std::max(1, cfg_.keep_last);
  cfg_.timeout_s = ckpt::agreement_timeout(o.timeout_s);
  cfg_.direct_io = o.direct_io;
  cfg_.file_mode = ckpt::permission_mode(o.file_mode, "TUTTI_CKPT_FILE_MODE");
  cfg_.dir_mode = ckpt::permission_mode(o.dir_mode, "TUTTI_CKPT_DIR_MODE");
  layout_ = ckpt::election_config(o.layout);
  cfg_.mesh = o.mesh_json.empty()
                  ? nlohmann::json{{"world_size", group->size()}}
                  : ckpt::parse_user_metadata(o.mesh_json);
  comm_ = group->split_group(0, group->rank(), group->name() + "/checkpoint");
  // Rank 0 creates the directory and holds its lock for the job; every rank
  // learns the outcome with rank 0's error code, so every rank raises the
  // same kind: kIo when the directory cannot be created or written (a file
  // in the way, no permission), kInvalidArgument when another job owns it.
  std::string lock_error;
  int64_t lock_code = 0;
  if (comm_->rank() == 0) {
    try {
      lock_ = ckpt::DirLock::acquire(cfg_.root, ckpt::default_job_id(), cfg_.file_mode,
                                     cfg_.dir_mode);
    } catch (const Error& e) {
      lock_error = e.message();
      const std::string own = detail::rank_prefix();  // said once, by the throw below
      if (lock_error.compare(0, own.size(), own) == 0) lock_error.erase(0, own.size());
      lock_code = static_cast<int64_t>(e.code());
    }
  }
  ckpt::Agreement agree(*comm_, cfg_.timeout_s, "checkpoint directory lock");
  lock_code = agree.broadcast(lock_code, 0, "locking the directory");
  if (lock_code != 0) {
    lock_error = agree.broadcast(lock_error, 0, "locking the directory");
    const auto code = static_cast<ErrorCode>(lock_code);
    detail::throw_error(
        code, __FILE__, __LINE__,
        detail::cat("CheckpointManager: ", comm_->rank() == 0 ? "" : "rank 0 reports: ",
                    code == ErrorCode::kIo
                        ? "the checkpoint directory '" + cfg_.root +
                              "' cannot be created or written: "
                        : "",
                    lock_error));
  }
  fresh_ = ckpt::make_fresh_start_rule(o.fresh_start, lock_ && lock_->existed_before());
  // In the memory tier each host has its own directory: on several hosts
  // commits are copied across them (memory_replica.h).  Every rank decides
  // alike (the job opened the tier on every rank before making a manager).
  if (ckpt::in_memory_tier(cfg_.root)) {
    replica_ = ckpt::MemoryReplica::make(*comm_, cfg_.timeout_s, cfg_.file_mode, cfg_.dir_mode);
    cfg_.replica = replica_.get();
  }
  if (async_) writer_ = std::thread([this] { writer_loop(); });
}

CheckpointManager::Impl::~Impl() {
  try {
    wait();
  } catch (const std::exception& e) {
    TUTTI_LOG(kError) << "checkpoint save failed (error unobserved before the "
                         "manager was destroyed): " << e.what();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

void CheckpointManager::Impl::writer_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (job_ && !running_); });
    if (stop_) return;  // the destructor waited for the last job first
    running_ = true;
    Job* job = job_.get();
    lock.unlock();
    std::exception_ptr err;
    try {
      persist(*job);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    pool_.release(std::move(job->snap.buffer));
    error_ = err;
    running_ = false;
    job_.reset();
    cv_.notify_all();
  }
}

void CheckpointManager::Impl::persist(Job& job) {
  TUTTI_TIMELINE_SCOPE(tl, async_ ? timeline::kCheckpointWriter : timeline::kCheckpoint, "checkpoint", "persist");
  copier_.wait();  // CUDA copies landed in host memory
  ckpt::CommitTimes t;
  const std::string parent = parent_name();
  ckpt::SaveRequest req;
  req.step = job.step;
  req.parent = parent;
  req.snap = &job.snap;
  req.metadata = job.metadata;
  req.components = job.components;
  req.once = job.once;
  req.declared = job.declared;
  req.local_error = job.snapshot_error;
  const std::string name = ckpt::persist_and_commit(*comm_, cfg_, req, &t);
  std::lock_guard<std::mutex> lock(mu_);
  parent_ = name;
  stats_.write_s = t.write_s;
  stats_.commit_s = t.commit_s;
  stats_.direct_io = t.direct_io;
}

void CheckpointManager::Impl::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return job_ == nullptr; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void CheckpointManager::Impl::snapshot(Job& job, const std::function<StateDict()>& state) {
  // A rank whose state is invalid must not leave the others waiting in the
  // commit until the timeout: the first all-reduce carries its verdict.
  std::exception_ptr invalid;
  StateDict st;
  std::vector<ckpt::Placement> placements;
  std::vector<uint64_t> digests;
  std::unique_ptr<ckpt::Election> election;
  auto make_election = [&] {
    election = std::make_unique<ckpt::Election>(st, placements, layout_, comm_->rank(),
                                                comm_->size());
  };
  try {
    TUTTI_ARG_CHECK(job.step >= 0, "checkpoint step ", job.step, " is negative");
    st = state();
    ckpt::per_rank_as_stored(&st, comm_->rank(), comm_->size());
    placements = ckpt::describe_state(st, job.step);
    make_election();
    if (layout_.once) {
      std::vector<Tensor> replicas;
      for (size_t i : election->digest_sources()) replicas.push_back(st[i].tensor);
      digests = ckpt::replica_digests(replicas, layout_.check, copier_, pool_);
    }
  } catch (const Error&) {
    invalid = std::current_exception();
    st.clear();
    placements.clear();
    make_election();
  }
  ckpt::Agreement agree(*comm_, cfg_.timeout_s, detail::cat("checkpoint step ", job.step));
  const std::vector<int64_t> catalogs =
      agree.allreduce_max(election->catalog_words(invalid != nullptr), "checking every rank's state");
  if (invalid) std::rethrow_exception(invalid);
  if (catalogs[0])
    TUTTI_THROW(kInvalidArgument, "checkpoint step ", job.step,
                " not saved: another rank's state or metadata was invalid (see its error)");
  std::vector<int64_t> slots;
  if (!election->catalogs_agree(catalogs))
    election->set_fallback(
        "the ranks hold different state (tensor names, dtypes, global shapes or splits) or "
        "different layout settings (TUTTI_CKPT_LAYOUT, TUTTI_CKPT_CHUNK_MB, "
        "TUTTI_CKPT_VERIFY_REPLICAS)");
  else if (layout_.once)
    slots = agree.allreduce_max(election->slot_words(digests), "electing the writers");
  const std::vector<ckpt::WriteItem> items = election->decide(slots);
  job.once = layout_.once && election->fallback().empty();
  log_layout(*election, job.step);
  fault::fault_point("after_election");
  uint64_t bytes = 0;
  for (const NamedTensor& nt : st) bytes += nt.tensor.nbytes();
  if (job.once && comm_->rank() == 0)
    for (size_t i = 0; i < st.size(); ++i)
      job.declared.push_back({st[i].name, st[i].tensor.dtype(), placements[i].global_shape});
  // From here on every rank is committed to the save: a failed copy is
  // reported through the commit's agreement, which raises on every rank.
  try {
    job.snap = ckpt::take_snapshot(st, items, pool_, copier_);
  } catch (const Error& e) {
    job.snapshot_error = e.message();
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.bytes = bytes;
  stats_.written_bytes = job.snap.total;
}

void CheckpointManager::Impl::log_layout(const ckpt::Election& e, int64_t step) {
  if (comm_->rank() != 0) return;
  // Said at WARN the first time, at INFO for later saves.
  auto say = [](bool& warned, const std::string& msg) {
    if (warned) TUTTI_LOG(kInfo) << msg;
    else TUTTI_LOG(kWarn) << msg;
    warned = true;
  };
  if (!e.fallback().empty())
    say(warned_fallback_,
        detail::cat("checkpoint step ", step, ": ", e.fallback(),
                    "; this save uses the per-rank layout (every rank writes every tensor it "
                    "holds)"));
  const auto& d = e.divergent();
  if (d.empty()) return;
  std::string names;
  for (size_t i = 0; i < d.size() && i < 4; ++i) names += (i ? ", '" : "'") + d[i] + "'";
  say(warned_divergent_,
      detail::cat("checkpoint step ", step, ": ", d.size(),
                  " tensors declared replicated (or split alike over several ranks) hold "
                  "different values on the ranks that hold them (", names,
                  d.size() > 4 ? ", ..." : "",
                  "); each of those ranks wrote its own copy. Mark per-rank state "
                  "ShardInfo::per_rank"));
}

void CheckpointManager::Impl::save(int64_t step, const std::function<StateDict()>& state,
                                   const std::string& metadata,
                                   std::vector<std::string> components) {
  using Clock = std::chrono::steady_clock;
  wait();
  const auto t0 = Clock::now();
  TUTTI_TIMELINE_SCOPE(tl, timeline::kCheckpoint, "checkpoint", "snapshot");
  auto job = std::make_unique<Job>();
  job->step = step;
  job->components = std::move(components);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = SaveStats();
    stats_.step = step;
  }
  std::exception_ptr bad_metadata;
  try {
    job->metadata = ckpt::parse_user_metadata(metadata);
  } catch (const Error&) {
    bad_metadata = std::current_exception();
  }
  snapshot(*job, bad_metadata ? std::function<StateDict()>([&]() -> StateDict {
    std::rethrow_exception(bad_metadata);
  }) : state);
  const auto t1 = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.snapshot_s = std::chrono::duration<double>(t1 - t0).count();
  }
  if (async_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = std::move(job);
      stats_.blocking_s = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    cv_.notify_all();
    return;
  }
  try {
    persist(*job);
  } catch (...) {
    copier_.wait();
    pool_.release(std::move(job->snap.buffer));
    throw;
  }
  pool_.release(std::move(job->snap.buffer));
  std::lock_guard<std::mutex> lock(mu_);
  stats_.blocking_s = std::chrono::duration<double>(Clock::now() - t0).count();
}

std::optional<LoadResult> CheckpointManager::Impl::load(const StateDict& state,
                                                       const LoadOptions& options) {
  wait();
  LoadOptions o = options;
  if (replica_) {
    // The newest step complete across the hosts, made whole on each.
    const std::optional<std::string> name = replica_->restore(cfg_.root, options.step);
    if (!name) {
      if (options.step >= 0)
        TUTTI_THROW(kNotFound, "memory tier: step ", options.step, " is complete on no host");
      if (options.resume) replica_->drop_newer(cfg_.root, "");  // a fresh timeline
      return std::nullopt;
    }
    int suffix = 0;
    ckpt::parse_checkpoint_name(*name, &o.step, &suffix);
  }
  auto r = ckpt::load_checkpoint(*comm_, cfg_.root, cfg_.timeout_s, state, o, fresh_, pool_);
  if (r && replica_ && options.resume) replica_->drop_newer(cfg_.root, r->name);
  if (r && options.resume) {
    std::lock_guard<std::mutex> lock(mu_);
    parent_ = r->name;
  }
  return r;
}

// ---- public wrappers --------------------------------------------------------

CheckpointManager::CheckpointManager(ProcessGroupPtr group, CheckpointOptions options)
    : impl_(new Impl(std::move(group), std::move(options))) {}

CheckpointManager::~CheckpointManager() { delete impl_; }

namespace {
std::vector<std::string> component_names(const Components& c) {
  std::vector<std::string> n;
  for (const auto& x : c) n.push_back(x.first);
  return n;
}
}  // namespace

void CheckpointManager::save(int64_t step, const Components& components,
                             const std::string& metadata_json) {
  impl_->save(step, [&] { return ckpt::flatten_components(components); }, metadata_json,
              component_names(components));
}

void CheckpointManager::save(int64_t step, const StateDict& state,
                             const std::string& metadata_json) {
  impl_->save(step, [&] { return state; }, metadata_json, {});
}

void CheckpointManager::wait() { impl_->wait(); }
bool CheckpointManager::in_flight() const { return impl_->in_flight(); }

std::optional<LoadResult> CheckpointManager::load(const Components& components,
                                                  const LoadOptions& options) {
  // flatten_components asks each component for fresh views of its state.
  auto r = impl_->load(ckpt::flatten_components(components), options);
  if (r)
    for (const auto& c : components) c.second->on_state_loaded();
  return r;
}

std::optional<LoadResult> CheckpointManager::load(const StateDict& state,
                                                  const LoadOptions& options) {
  return impl_->load(state, options);
}

std::optional<int64_t> CheckpointManager::load_latest(const Components& components,
                                                      std::string* metadata_json,
                                                      const LoadOptions& options) {
  auto r = load(components, options);
  if (!r) return std::nullopt;
  if (metadata_json) *metadata_json = r->metadata_json;
  return r->step;
}

std::optional<int64_t> CheckpointManager::load_latest(const StateDict& state,
                                                      std::string* metadata_json,
                                                      const LoadOptions& options) {
  auto r = load(state, options);
  if (!r) return std::nullopt;
  if (metadata_json) *metadata_json = r->metadata_json;
  return r->step;
}

std::optional<int64_t> CheckpointManager::latest_step() const {
  const auto all = ckpt::scan_catalog(impl_->dir());
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (it->complete) return it->step;
  return std::nullopt;
}

std::vector<CheckpointInfo> CheckpointManager::list() const {
  return list_checkpoints(impl_->dir());
}

const std::string& CheckpointManager::dir() const { return impl_->dir(); }
SaveStats CheckpointManager::last_save_stats() const { return impl_->stats(); }

std::vector<CheckpointInfo> list_checkpoints(const std::string& dir) {
  std::vector<CheckpointInfo> out;
  for (const auto& e : ckpt::scan_catalog(dir))
    out.push_back({e.name, ckpt::join_path(dir, e.name), e.step, e.complete});
  return out;
}

std::string verify_checkpoint(const std::string& path) {
  HostBufferPool pool;
  return ckpt::verify_checkpoint_dir(path, pool);
}

}  // namespace tutti
