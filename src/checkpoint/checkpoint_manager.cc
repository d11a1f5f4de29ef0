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
#include "checkpoint/dir_lock.h"
#include "checkpoint/file_util.h"
#include "checkpoint/loader.h"
#include "checkpoint/manifest.h"
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
  };
  void writer_loop();
  void persist(Job& job);

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
  ckpt::FreshStartRule fresh_;
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
  const std::string name = ckpt::persist_and_commit(*comm_, cfg_, job.step, parent, job.snap,
                                                    job.metadata, job.components, &t);
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
  // A rank whose state is invalid must not leave the others waiting in the
  // commit until the timeout: agree on the snapshot first (one int64).
  std::exception_ptr invalid;
  try {
    TUTTI_ARG_CHECK(step >= 0, "checkpoint step ", step, " is negative");
    job->metadata = ckpt::parse_user_metadata(metadata);
    StateDict st = state();
    ckpt::per_rank_as_stored(&st, comm_->rank(), comm_->size());
    job->snap = ckpt::take_snapshot(st, step, pool_, copier_);
  } catch (const Error&) {
    invalid = std::current_exception();
  }
  ckpt::Agreement agree(*comm_, cfg_.timeout_s, detail::cat("checkpoint step ", step));
  const int64_t bad = agree.allreduce_max(invalid ? 1 : 0, "checking every rank's state");
  if (bad) {
    copier_.wait();
    pool_.release(std::move(job->snap.buffer));
  }
  if (invalid) std::rethrow_exception(invalid);
  if (bad)
    TUTTI_THROW(kInvalidArgument, "checkpoint step ", step,
                " not saved: another rank's state or metadata was invalid (see its error)");
  const auto t1 = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = SaveStats();
    stats_.step = step;
    stats_.bytes = job->snap.total;
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
  auto r = ckpt::load_checkpoint(*comm_, cfg_.root, cfg_.timeout_s, state, options, fresh_,
                                 pool_);
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
