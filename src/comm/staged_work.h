// Work whose operation is first queued, then started (posted to MPI or
// enqueued on a CUDA stream) by the progress engine, and completes later.
// Holds the shared queued -> started | failed bookkeeping.
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>

#include "core/timeline.h"
#include "tutti/comm.h"

namespace tutti {
namespace comm {

class StagedWork : public Work {
 public:
  // `backend` labels the op on the timeline ("nccl", "staged", "mpi");
  // `track` is the timeline group track its host side is drawn on.
  // No defaults: a subclass that took another's label drew host send/recv
  // as NCCL ops.
  StagedWork(const char* backend, std::string track)
      : backend_(backend), track_(std::move(track)) {}
  uint64_t seq() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return seq_;
  }
  std::string description() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return desc_;
  }
  // Called by the engine once the operation is posted.
  void started(uint64_t seq, std::string desc) {
    // The timeline sees the host side only: submitted -> posted to the
    // stream (the GPU's end is not traced).
    if (timeline::on() && enqueued_ns_) {
      timeline::Args a;
      trace_args(a);
      a.i("seq", static_cast<int64_t>(seq)).s("backend", backend_);
      timeline::complete(timeline::group_track(track_), "comm", desc, enqueued_ns_,
                         timeline::now_ns(), &a);
    }
    settle(kStarted, nullptr, seq, std::move(desc));
  }
  // Called by the engine when the operation could not be started.
  void failed(std::exception_ptr e, uint64_t seq, std::string desc) {
    settle(kDone, e, seq, std::move(desc));
  }

 protected:
  enum Stage { kQueued, kStarted, kDone };
  // What the op's timeline event says besides seq and backend (op, group,
  // bytes...); nothing by default.
  virtual void trace_args(timeline::Args& a) const { (void)a; }
  // Waits until the engine has started or failed the operation; `lock`
  // holds mu_ afterwards.  Rethrows a failure.
  void wait_started(std::unique_lock<std::mutex>& lock) {
    cv_.wait(lock, [&] { return stage_ != kQueued; });
    if (error_) std::rethrow_exception(error_);
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Stage stage_ = kQueued;
  uint64_t seq_ = 0;
  std::string desc_;
  std::exception_ptr error_;
  const int64_t enqueued_ns_ = timeline::on() ? timeline::now_ns() : 0;
  const char* const backend_;
  const std::string track_;

 private:
  void settle(Stage stage, std::exception_ptr e, uint64_t seq, std::string desc) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stage_ = stage;
      error_ = e;
      seq_ = seq;
      desc_ = std::move(desc);
    }
    cv_.notify_all();
  }
};

}  // namespace comm
}  // namespace tutti
