// The hang watchdog of a communicator whose operations complete after they
// were started (NCCL: on the GPU, long after the host enqueued them).
//
// Every started operation is registered with its sequence number,
// description and deadline (TUTTI_TIMEOUT or OpOptions::timeout_s).  A poll
// pass drops completed operations and breaks the communicator, once and for
// good, on the first of:
//   * an operation past its deadline          -> kTimeout for that op
//   * an operation whose poll throws an Error  -> that error (e.g. kMismatch
//     from the overlapped agreement check)
//   * the transport's asynchronous error       -> kCommFailure for the oldest
//     op in flight (NCCL: ncclCommGetAsyncError)
//   * a dead peer the MPI side knows of        -> kRanksLost for the oldest
//     op in flight (ULFM: mpi::ulfm::failure_note(); docs/elastic.md)
// A timeout and a stall warning name the ranks that never arrived when the
// backend can ask its peers (Hooks::peers; NCCL: over the MPI side channel,
// as the MPI communicator's own timeouts do).
// Breaking fails the culprit with its error and every other op in flight
// with kAborted naming the cause, tells on_broken, and only then calls the
// abort hook (ncclCommAbort, which can block until every kernel on the
// device ends); later submissions fail with kAborted through
// throw_if_broken().
//
// The class knows nothing of CUDA, NCCL or MPI: the hooks and WatchedOp are
// how a backend plugs in, and tests drive poll() with fake ops and a fake
// clock (tests/comm/test_watchdog.cc).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "tutti/error.h"

namespace tutti {
namespace comm {

// One operation in flight, as the watchdog sees it.
class WatchedOp {
 public:
  virtual ~WatchedOp() = default;
  // True once the operation completed.  Throws Error when it is known to
  // have failed (the agreement check found a mismatch).  Thread-safe.
  virtual bool poll() = 0;
  // What the operation waits for now, for the timeout message
  // ("agreeing on the operation", "waiting for the GPU").
  virtual std::string phase() const = 0;
  // Fails the operation's Work (the first failure wins).  Thread-safe.
  virtual void fail(std::exception_ptr error) = 0;
};

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  struct Hooks {
    // The transport's asynchronous error: empty while healthy, else its
    // text.  Optional.
    std::function<std::string()> async_error;
    // A dead process of the job, as the MPI side knows it (ULFM,
    // mpi::ulfm::failure_note()): "" while none, else its text ("world
    // rank 2 died ...").  Asked every pass while ops are in flight; an
    // answer breaks the communicator with kRanksLost, so a device op
    // blocked on a dead peer ends within a pass of MPI's detection
    // instead of at its deadline.  Optional.
    std::function<std::string()> ranks_lost;
    // Abandons everything in flight (ncclCommAbort).  Called once, on the
    // thread that breaks the communicator, without the watchdog's lock.
    std::function<void()> abort;
    // Told once the communicator broke, after the ops were failed (the
    // process-wide reaction: no MPI_Finalize, TUTTI_EXIT_ON_COMM_FAILURE).
    std::function<void(const Error&)> on_broken;
    // Where the other ranks are on op #seq: "never arrived: rank 1 (...)"
    // for a timeout, "arrived: ...; missing: ..." for a stall warning
    // (`stall`); "" if unknown.  Optional.  Called without the watchdog's
    // lock; may block while peers are asked (TUTTI_STATUS_GRACE_MS).
    std::function<std::string(uint64_t seq, bool stall)> peers;
  };

  // `transport` and `name` appear in messages ("NCCL communicator
  // 'world-cuda0'").
  Watchdog(std::string transport, std::string name, Hooks hooks);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Tracks an operation that was started at `start`.  timeout_s <= 0: no
  // deadline.  On a broken communicator the op fails at once (kAborted).
  void add(std::shared_ptr<WatchedOp> op, uint64_t seq, std::string desc,
           double timeout_s, Clock::time_point start = Clock::now());
  // One pass at time `now`; returns the number of ops still in flight.
  size_t poll(Clock::time_point now = Clock::now());
  // Breaks the communicator because of `cause`, which concerns `culprit`
  // (null: no op in particular; that op fails with `cause` itself, the
  // others with kAborted).  The first cause wins; later calls do nothing.
  void break_with(const Error& cause, const WatchedOp* culprit);

  // The stall inspector: an op in flight for `seconds` (then every
  // `seconds` again) is logged at WARN level with its phase, until it
  // completes or times out.  0 disables; the constructor reads
  // TUTTI_STALL_WARN_S.
  void set_stall_warn_s(double seconds);
  // Stall warnings logged so far, and the last one's text (for tests).
  uint64_t stall_warnings() const;
  std::string last_stall_warning() const;

  bool broken() const;
  // The error that broke the communicator ("" while healthy).
  std::string cause() const;
  size_t in_flight() const;
  // Throws kAborted "<desc>: the NCCL communicator '<name>' is unusable
  // after an earlier failure: <cause>" once broken.
  void throw_if_broken(const std::string& desc) const;

  // What a polling thread holds for its lifetime (a cuda::DeviceGuard).
  using ThreadSetup = std::function<std::shared_ptr<void>()>;
  // Polls on a thread of its own every `interval` while ops are in flight
  // (idle otherwise); while no op is added or completes, the pause doubles
  // up to TUTTI_MPI_WAIT_SLEEP_US (comm/backoff.h).  `setup` runs first on that thread and what it
  // returns lives as long as the thread (set the device there).
  void start_thread(std::chrono::microseconds interval,
                    ThreadSetup setup = nullptr);
  // Stops the thread (ops in flight stay registered).  Idempotent.
  void stop_thread();

 private:
  struct Item {
    std::shared_ptr<WatchedOp> op;
    uint64_t seq;
    std::string desc;
    double timeout_s;
    Clock::time_point deadline;
    Clock::time_point start;
    Clock::time_point next_warn;  // the next stall warning
  };
  Clock::duration stall_period() const;  // under mu_
  // "; <Hooks::peers' report>" or "" (without mu_).
  std::string peer_report(uint64_t seq, bool stall) const;
  void loop(std::chrono::microseconds interval, const ThreadSetup& setup);

  const std::string transport_;
  const std::string name_;
  Hooks hooks_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;  // start order
  uint64_t changes_ = 0;    // ops added or completed (the thread's backoff)
  bool broken_ = false;
  std::string cause_;
  double stall_warn_s_ = 0;
  uint64_t stall_warnings_ = 0;
  std::string last_stall_warning_;
  bool stop_ = false;
  std::thread thread_;
  std::mutex poll_mu_;  // one poll pass at a time
};

}  // namespace comm
}  // namespace tutti
