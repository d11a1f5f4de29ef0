// A Work completed by the thread that runs the operation (host backends).
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "core/timeline.h"
#include "tutti/comm.h"

namespace tutti {
namespace comm {

class CpuWork : public Work {
 public:
  CpuWork(uint64_t seq, std::string description)
      : seq_(seq),
        description_(std::move(description)),
        enqueued_ns_(timeline::on() ? timeline::now_ns() : 0) {}

  void wait() override;
  void synchronize() override { wait(); }
  bool test() override;
  uint64_t seq() const override;
  std::string description() const override;

  // Records the sequence number once the op starts; the description is
  // formatted from the request only if someone asks for it.
  void start(uint64_t seq, std::shared_ptr<const OpRequest> request,
             const std::string& group);

  // The ranks agreed on the operation; the data exchange starts (the
  // timeline's phase boundary; a no-op while no timeline records).
  void agreed() {
    if (timeline::on()) agreed_ns_ = timeline::now_ns();
  }

  // Marks the work done (error may be null).  Called once.
  void finish(std::exception_ptr error = nullptr);

 private:
  mutable std::mutex mu_;
  uint64_t seq_;
  std::string description_;
  std::shared_ptr<const OpRequest> request_;
  std::string group_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  // Timeline instants (now_ns(); 0: not recorded): submitted, started on the
  // progress engine, agreement done.  Written by the engine thread only.
  int64_t enqueued_ns_ = 0;
  int64_t started_ns_ = 0;
  int64_t agreed_ns_ = 0;
  void trace(bool failed) const;
};

}  // namespace comm
}  // namespace tutti
