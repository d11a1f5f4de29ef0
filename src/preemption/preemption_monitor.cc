// PreemptionMonitor: the sources, the polling thread, and the collective
// stop decision.
#include "tutti/preemption.h"

#include <csignal>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "core/timeline.h"
#include "preemption/leaving.h"
#include "preemption/notice_source.h"
#include "preemption/signal_source.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {

const char* notice_kind_name(NoticeKind kind) {
  switch (kind) {
    case NoticeKind::kNone: return "none";
    case NoticeKind::kRebalance: return "rebalance";
    case NoticeKind::kStop: return "stop";
  }
  return "unknown";
}

class PreemptionMonitor::Impl {
 public:
  explicit Impl(const PreemptionOptions& o);
  ~Impl();

  NoticeKind local();
  std::optional<PreemptionNotice> notice() {
    local();  // folds in a pending signal
    std::lock_guard<std::mutex> lock(mu_);
    if (best_.kind == NoticeKind::kNone) return std::nullopt;
    return best_;
  }
  // `node_local`: the notice says this node is going away (leaving.h).
  void record(NoticeKind kind, const std::string& source, const std::string& detail,
              bool node_local);

  std::vector<std::string> names;
  bool stop_on_rebalance = false;
  bool rebalance_saved = false;  // decide() answered kSaveNow (every rank alike)
  int32_t agreed_traced = 0;     // the highest agreed kind put on the timeline

 private:
  void poll_loop(preempt::NoticeSource& source);

  bool signals_ = false;
  int poll_ms_ = 1000;
  std::vector<std::unique_ptr<preempt::NoticeSource>> polled_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::atomic<int> kind_{0};
  std::atomic<bool> leaving_recorded_{false};  // once per monitor (leaving.h)
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_thread_ = false;
  PreemptionNotice best_;
  std::vector<std::thread> threads_;  // one per polled source
};

PreemptionMonitor::Impl::Impl(const PreemptionOptions& o) {
  std::string list = o.sources.empty() ? config::get_string("TUTTI_PREEMPT_SOURCES") : o.sources;
  if (list == "all") list = "signals,file,aws,gcp,azure";
  if (list == "none") list.clear();
  poll_ms_ = o.poll_ms > 0 ? o.poll_ms : static_cast<int>(config::get_int("TUTTI_PREEMPT_POLL_MS"));
  TUTTI_ARG_CHECK(poll_ms_ > 0, "TUTTI_PREEMPT_POLL_MS must be positive, got ", poll_ms_);
  const int http_ms = o.http_timeout_ms > 0
                          ? o.http_timeout_ms
                          : static_cast<int>(config::get_int("TUTTI_HTTP_TIMEOUT_MS"));
  auto pick = [](const std::string& given, const char* setting) {
    std::string v = given.empty() ? config::get_string(setting) : given;
    while (!v.empty() && v.back() == '/') v.pop_back();
    return v;
  };
  const std::string share_dir =
      o.share_dir.empty() ? config::get_string("TUTTI_PREEMPT_SHARE_DIR") : o.share_dir;
  auto shared = [&](std::unique_ptr<preempt::NoticeSource> src, const std::string& url) {
    return preempt::make_node_shared(std::move(src), share_dir, url, poll_ms_);
  };
  stop_on_rebalance = o.stop_on_rebalance.has_value()
                          ? *o.stop_on_rebalance
                          : config::get_bool("TUTTI_PREEMPT_STOP_ON_REBALANCE");
  size_t pos = 0;
  while (pos < list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    std::string s = list.substr(pos, comma - pos);
    pos = comma + 1;
    while (!s.empty() && s.front() == ' ') s.erase(s.begin());
    while (!s.empty() && s.back() == ' ') s.pop_back();
    if (s.empty()) continue;
    if (s == "signals") {
      signals_ = preempt::install_signal_handlers();
      if (!signals_)
        TUTTI_THROW(kInvalidArgument,
                    "preemption source 'signals': another PreemptionMonitor owns the "
                    "signal handlers (one monitor per process)");
    } else if (s == "file") {
      polled_.push_back(preempt::make_file_source(
          o.trigger_file.empty() ? config::get_string("TUTTI_PREEMPT_FILE") : o.trigger_file));
    } else if (s == "aws") {
      const std::string url = pick(o.aws_url, "TUTTI_AWS_METADATA_URL");
      polled_.push_back(shared(preempt::make_aws_source(url, http_ms), url));
    } else if (s == "gcp") {
      const std::string url = pick(o.gcp_url, "TUTTI_GCP_METADATA_URL");
      polled_.push_back(shared(preempt::make_gcp_source(url, http_ms), url));
    } else if (s == "azure") {
      const std::string url = pick(o.azure_url, "TUTTI_AZURE_METADATA_URL");
      polled_.push_back(shared(preempt::make_azure_source(url, http_ms), url));
    } else {
      if (signals_) preempt::restore_signal_handlers();
      TUTTI_THROW(kInvalidArgument, "unknown preemption source '", s,
                  "' (TUTTI_PREEMPT_SOURCES / PreemptionOptions::sources: signals, file, aws, "
                  "gcp, azure, all or none)");
    }
    names.push_back(s);
  }
  // One thread per source: an endpoint that hangs until its HTTP timeout
  // never delays the others (three hanging endpoints delayed the trigger
  // file by three timeouts per round when they were polled in series).
  for (auto& s : polled_) {
    preempt::NoticeSource* src = s.get();
    threads_.emplace_back([this, src] { poll_loop(*src); });
  }
  TUTTI_LOG(kInfo) << "preemption monitor: sources " << (list.empty() ? "(none)" : list)
                   << ", polling every " << poll_ms_ << " ms";
}

PreemptionMonitor::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_thread_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  if (signals_) preempt::restore_signal_handlers();
}

void PreemptionMonitor::Impl::poll_loop(preempt::NoticeSource& source) {
  bool failure_logged = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_thread_) {
    lock.unlock();
    preempt::Observation o;
    // The source boundary: nothing a source throws (a malformed answer, a
    // library's type error) may end the process; it is no notice.
    try {
      o = source.poll();
    } catch (const std::exception& e) {
      if (!failure_logged)
        TUTTI_LOG(kWarn) << "preemption source " << source.name()
                         << " failed (treated as no notice; logged once): " << e.what();
      failure_logged = true;
      o = preempt::Observation();
    } catch (...) {
      if (!failure_logged)
        TUTTI_LOG(kWarn) << "preemption source " << source.name()
                         << " failed with a non-standard exception (treated as no notice)";
      failure_logged = true;
      o = preempt::Observation();
    }
    if (o.kind != NoticeKind::kNone)
      record(o.kind, source.name(), o.detail, preempt::notice_is_node_local(source.name(), 0));
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(std::max(poll_ms_, o.retry_after_ms)),
                 [&] { return stop_thread_; });
  }
}

void PreemptionMonitor::Impl::record(NoticeKind kind, const std::string& source,
                                     const std::string& detail, bool node_local) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<int>(kind) <= static_cast<int>(best_.kind)) return;
    best_.kind = kind;
    best_.source = source;
    best_.detail = detail;
    best_.seconds_since_start =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    kind_.store(static_cast<int>(kind));
    TUTTI_TIMELINE(instant(timeline::kPreemption, "preemption", notice_kind_name(kind),
                           &timeline::Args().s("source", source).s("detail", detail)));
    TUTTI_LOG(kWarn) << "preemption notice (" << notice_kind_name(kind) << ") from " << source
                     << (detail.empty() ? "" : ": ") << detail;
  }
  // A notice that stops the job and says this node is going away: elastic
  // tutti-run must not start the next run here.  A rebalance that only
  // saves keeps the node.
  if (node_local &&
      (kind == NoticeKind::kStop || (kind == NoticeKind::kRebalance && stop_on_rebalance)) &&
      !leaving_recorded_.exchange(true))
    preempt::record_leaving(source, detail.empty() ? notice_kind_name(kind) : detail);
}

NoticeKind PreemptionMonitor::Impl::local() {
  if (signals_) {
    const int sig = preempt::received_signal();
    if (sig != 0 && kind_.load() < static_cast<int>(NoticeKind::kStop))
      record(NoticeKind::kStop, preempt::signal_name(sig), "",
             preempt::notice_is_node_local(preempt::signal_name(sig),
                                           preempt::received_signal_sender()));
  }
  return static_cast<NoticeKind>(kind_.load());
}

// ---- public -----------------------------------------------------------------

PreemptionMonitor::PreemptionMonitor(PreemptionOptions options)
    : impl_(std::make_unique<Impl>(options)) {}
PreemptionMonitor::~PreemptionMonitor() = default;

NoticeKind PreemptionMonitor::local() const { return impl_->local(); }
std::optional<PreemptionNotice> PreemptionMonitor::notice() const { return impl_->notice(); }

NoticeKind PreemptionMonitor::agree(ProcessGroup& group) {
  int32_t v = static_cast<int32_t>(impl_->local());
  OpOptions o;
  o.name = "preemption notice agreement";
  const int32_t mine = v;
  group.allreduce(Tensor::of(&v, 1), ReduceOp::kMax, o);
  // A rank that learns of the notice from a peer (its own sources have not
  // seen it yet) marks it on its own timeline too, once per kind.
  if (v > mine && v > impl_->agreed_traced) {
    impl_->agreed_traced = v;
    TUTTI_TIMELINE(instant(timeline::kPreemption, "preemption",
                           notice_kind_name(static_cast<NoticeKind>(v)),
                           &timeline::Args().s("source", "a peer (agreement)")));
  }
  return static_cast<NoticeKind>(v);
}

bool PreemptionMonitor::should_stop(ProcessGroup& group) {
  const NoticeKind k = agree(group);
  return k == NoticeKind::kStop || (impl_->stop_on_rebalance && k == NoticeKind::kRebalance);
}

PreemptionAction PreemptionMonitor::decide(ProcessGroup& group) {
  const NoticeKind k = agree(group);
  if (k == NoticeKind::kStop || (impl_->stop_on_rebalance && k == NoticeKind::kRebalance))
    return PreemptionAction::kStop;
  // k is identical on every rank, so this edge is too.
  if (k == NoticeKind::kRebalance && !impl_->rebalance_saved) {
    impl_->rebalance_saved = true;
    return PreemptionAction::kSaveNow;
  }
  return PreemptionAction::kContinue;
}

void PreemptionMonitor::notify(NoticeKind kind, const std::string& source,
                               const std::string& detail) {
  impl_->record(kind, source, detail, /*node_local=*/false);
}

std::vector<std::string> PreemptionMonitor::sources() const { return impl_->names; }

void exit_preempted() {
  // The checkpoint is committed: a repeated notice (tutti-run re-sends
  // SIGUSR1 to mpirun until the job ends) must not turn this exit into a
  // death by signal once a monitor's destructor has restored the default
  // handlers.
  ::signal(SIGUSR1, SIG_IGN);
  ::signal(SIGUSR2, SIG_IGN);
  try {
    shutdown();
  } catch (const std::exception& e) {
    TUTTI_LOG(kError) << "shutdown before the preemption exit failed: " << e.what();
  }
  std::exit(kPreemptedExitCode);
}

}  // namespace tutti
