#include "comm/watchdog.h"

#include <pthread.h>

#include <algorithm>
#include <vector>

#include "comm/backoff.h"
#include "core/check.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {
namespace comm {
namespace {

// A cause quoted inside another rank-prefixed message: drop its own
// "rank R: " so the rank is not named twice.
std::string unprefixed(const std::string& message) {
  const std::string prefix = detail::rank_prefix();
  if (!prefix.empty() && message.compare(0, prefix.size(), prefix) == 0)
    return message.substr(prefix.size());
  return message;
}

}  // namespace

Watchdog::Watchdog(std::string transport, std::string name, Hooks hooks)
    : transport_(std::move(transport)), name_(std::move(name)),
      hooks_(std::move(hooks)),
      stall_warn_s_(config::get_double("TUTTI_STALL_WARN_S")) {}

void Watchdog::set_stall_warn_s(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  stall_warn_s_ = seconds;
  for (auto& item : items_) item.next_warn = item.start + stall_period();
}

uint64_t Watchdog::stall_warnings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stall_warnings_;
}

std::string Watchdog::last_stall_warning() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_stall_warning_;
}

std::string Watchdog::peer_report(uint64_t seq, bool stall) const {
  if (!hooks_.peers) return "";
  try {
    const std::string report = hooks_.peers(seq, stall);
    return report.empty() ? "" : "; " + report;
  } catch (const std::exception& e) {
    return detail::cat("; peers could not be asked: ", e.what());
  }
}

Watchdog::Clock::duration Watchdog::stall_period() const {
  // At least a millisecond, so that a tiny setting cannot spin poll().
  return std::max<Clock::duration>(
      std::chrono::milliseconds(1),
      std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(stall_warn_s_)));
}

Watchdog::~Watchdog() { stop_thread(); }

void Watchdog::add(std::shared_ptr<WatchedOp> op, uint64_t seq,
                   std::string desc, double timeout_s, Clock::time_point start) {
  std::unique_lock<std::mutex> lock(mu_);
  if (broken_) {
    const std::string cause = cause_;
    lock.unlock();
    op->fail(std::make_exception_ptr(Error(
        ErrorCode::kAborted,
        detail::cat(detail::rank_prefix(), desc, ": the ", transport_,
                    " communicator '", name_,
                    "' is unusable after an earlier failure: ",
                    unprefixed(cause)))));
    return;
  }
  Item item{std::move(op), seq, std::move(desc), timeout_s, start, start,
            start + stall_period()};
  if (timeout_s > 0)
    item.deadline = start + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(timeout_s));
  items_.push_back(std::move(item));
  ++changes_;
  cv_.notify_all();
}

size_t Watchdog::poll(Clock::time_point now) {
  std::lock_guard<std::mutex> one_pass(poll_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  if (broken_) return 0;
  // Logged without the lock, the peers' report between head and tail.
  struct Stall {
    uint64_t seq;
    std::string head, tail;
  };
  std::vector<Stall> stalls;
  // Ops leave in any order: a later op's check may finish first.
  for (auto it = items_.begin(); it != items_.end();) {
    bool done = false;
    try {
      done = it->op->poll();
    } catch (const Error& e) {
      const Error cause = e;
      const WatchedOp* culprit = it->op.get();
      lock.unlock();
      break_with(cause, culprit);
      return 0;
    } catch (const std::exception& e) {
      const Error cause(ErrorCode::kInternal,
                        detail::cat(detail::rank_prefix(), it->desc,
                                    ": polling its progress failed: ", e.what()));
      const WatchedOp* culprit = it->op.get();
      lock.unlock();
      break_with(cause, culprit);
      return 0;
    }
    if (done) {
      it = items_.erase(it);
      ++changes_;
      continue;
    }
    if (it->timeout_s > 0 && now >= it->deadline) {
      std::string oldest;
      if (it != items_.begin())
        oldest = detail::cat(" (the oldest operation still in flight is ",
                             items_.front().desc, ", ",
                             items_.front().op->phase(), ")");
      const std::string head =
          detail::cat(detail::rank_prefix(), it->desc, " did not complete within ",
                      it->timeout_s, " s (TUTTI_TIMEOUT) while ",
                      it->op->phase(), oldest);
      const uint64_t seq = it->seq;
      const WatchedOp* culprit = it->op.get();
      lock.unlock();
      // Asked without the lock (the ops stay registered: nothing else
      // breaks the communicator meanwhile but a concurrent cause, which
      // wins in break_with).
      const Error cause(
          ErrorCode::kTimeout,
          detail::cat(head, peer_report(seq, false), "; the ", transport_,
                      " communicator '", name_,
                      "' was aborted (a peer vanished, hung, or issued "
                      "different operations). The communicator is unusable "
                      "now."));
      break_with(cause, culprit);
      return 0;
    }
    if (stall_warn_s_ > 0 && now >= it->next_warn) {
      while (it->next_warn <= now) it->next_warn += stall_period();
      ++stall_warnings_;
      stalls.push_back(
          {it->seq,
           detail::cat("stall: ", it->desc, " has been in flight for ",
                       static_cast<int64_t>(
                           std::chrono::duration<double>(now - it->start)
                               .count() *
                           10) /
                           10.0,
                       " s while ", it->op->phase(), " on the ", transport_,
                       " communicator '", name_, "'"),
           detail::cat(" (TUTTI_STALL_WARN_S=", stall_warn_s_,
                       it->timeout_s > 0
                           ? detail::cat("; fails at TUTTI_TIMEOUT=",
                                         it->timeout_s, " s")
                           : std::string("; no timeout"),
                       ")")});
    }
    ++it;
  }
  const size_t left = items_.size();
  std::string oldest = left ? items_.front().desc : std::string();
  const WatchedOp* culprit = left ? items_.front().op.get() : nullptr;
  lock.unlock();
  for (const auto& s : stalls) {
    const std::string m = s.head + peer_report(s.seq, true) + s.tail;
    TUTTI_LOG(kWarn) << m;
    std::lock_guard<std::mutex> relock(mu_);
    last_stall_warning_ = m;
  }
  if (hooks_.ranks_lost && left > 0) {
    const std::string lost = hooks_.ranks_lost();
    if (!lost.empty()) {
      break_with(Error(ErrorCode::kRanksLost,
                       detail::cat(detail::rank_prefix(), oldest, ": ", lost, "; the ",
                                   transport_, " communicator '", name_,
                                   "' was aborted. Every communicator over the dead rank is "
                                   "unusable now: the survivors call tutti::recover() "
                                   "(tutti.recover()) to go on without it")),
                 culprit);
      return 0;
    }
  }
  if (hooks_.async_error) {
    const std::string err = hooks_.async_error();
    if (!err.empty()) {
      break_with(Error(ErrorCode::kCommFailure,
                       detail::cat(detail::rank_prefix(),
                                   oldest.empty() ? "no operation in flight"
                                                  : oldest,
                                   ": ", transport_, " communicator '", name_,
                                   "' reported an asynchronous error (", err,
                                   "); it was aborted (a peer or the network "
                                   "failed). The communicator is unusable now.")),
                 culprit);
      return 0;
    }
  }
  return left;
}

void Watchdog::break_with(const Error& cause, const WatchedOp* culprit) {
  std::deque<Item> items;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_) return;
    broken_ = true;
    cause_ = cause.message();
    items.swap(items_);
  }
  cv_.notify_all();
  TUTTI_LOG(kError) << cause.message();
  // The ops fail first, then the process-wide reaction, then the abort: the
  // abort can block (ncclCommAbort's cudaFree waits for every kernel on the
  // device, also one of the user's that the op was ordered after), and
  // neither a waiting thread nor TUTTI_EXIT_ON_COMM_FAILURE may wait for it.
  const auto first = std::make_exception_ptr(cause);
  for (auto& it : items) {
    if (it.op.get() == culprit) {
      it.op->fail(first);
      continue;
    }
    it.op->fail(std::make_exception_ptr(Error(
        ErrorCode::kAborted,
        detail::cat(detail::rank_prefix(), it.desc, ": aborted because the ",
                    transport_, " communicator '", name_,
                    "' broke: ", unprefixed(cause.message())))));
  }
  if (hooks_.on_broken) hooks_.on_broken(cause);
  if (hooks_.abort) {
    try {
      hooks_.abort();
    } catch (const std::exception& e) {
      TUTTI_LOG(kError) << "aborting the " << transport_ << " communicator '"
                        << name_ << "' failed: " << e.what();
    }
  }
}

bool Watchdog::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

std::string Watchdog::cause() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cause_;
}

size_t Watchdog::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return items_.size();
}

void Watchdog::throw_if_broken(const std::string& desc) const {
  std::string cause;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_) return;
    cause = cause_;
  }
  TUTTI_THROW(kAborted, desc, ": the ", transport_, " communicator '", name_,
              "' is unusable after an earlier failure: ", unprefixed(cause));
}

void Watchdog::start_thread(std::chrono::microseconds interval,
                            ThreadSetup setup) {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread(
      [this, interval, setup] { loop(interval, setup); });
}

void Watchdog::stop_thread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id())
    thread_.join();
}

void Watchdog::loop(std::chrono::microseconds interval,
                    const ThreadSetup& setup) {
  pthread_setname_np(pthread_self(), "tutti-watchdog");
  const std::shared_ptr<void> held = setup ? setup() : nullptr;
  // While the same ops stay in flight (a late peer, a long kernel) the
  // passes thin out: the pause doubles from `interval` up to the waits'
  // sleep cap (TUTTI_MPI_WAIT_SLEEP_US, comm/backoff.h), so a stalled op
  // does not wake this thread thousands of times a second; any change in
  // the set starts again from `interval`.
  const auto cap = std::max<std::chrono::microseconds>(
      interval, std::chrono::microseconds(wait_sleep_cap_us()));
  auto pause = interval;
  uint64_t seen = ~uint64_t{0};
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (!items_.empty() && !broken_); });
    if (stop_) return;
    lock.unlock();
    poll();
    lock.lock();
    pause = changes_ == seen ? std::min(cap, pause * 2) : interval;
    seen = changes_;
    cv_.wait_for(lock, pause, [&] { return stop_; });
  }
}

}  // namespace comm
}  // namespace tutti
