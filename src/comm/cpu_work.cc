#include "comm/cpu_work.h"

#include "comm/op_desc.h"

namespace tutti {
namespace comm {

void CpuWork::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool CpuWork::test() {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_ && error_) std::rethrow_exception(error_);
  return done_;
}

uint64_t CpuWork::seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seq_;
}

std::string CpuWork::description() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (request_) return describe(*request_, seq_, group_);
  return description_;
}

void CpuWork::start(uint64_t seq, std::shared_ptr<const OpRequest> request,
                    const std::string& group) {
  std::lock_guard<std::mutex> lock(mu_);
  seq_ = seq;
  request_ = std::move(request);
  group_ = group;
}

void CpuWork::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = error;
  }
  cv_.notify_all();
}

}  // namespace comm
}  // namespace tutti
