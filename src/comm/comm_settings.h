// The settings every communicator reads per operation (TUTTI_TIMEOUT,
// TUTTI_CHECK_COLLECTIVES, TUTTI_STALL_WARN_S), cached and re-read only
// after config_reload() bumps the settings generation.  One per communicator (MPI and NCCL).
#pragma once

#include <cstdint>
#include <mutex>

#include "tutti/config.h"

namespace tutti {
namespace comm {

class CommSettings {
 public:
  struct Values {
    double timeout_s = 300;  // TUTTI_TIMEOUT
    bool check_ops = true;   // TUTTI_CHECK_COLLECTIVES
    double stall_warn_s = 60;  // TUTTI_STALL_WARN_S
  };

  // The current values (a copy: safe to use after the lock is gone).
  Values get() {
    const uint64_t gen = config::generation();
    std::lock_guard<std::mutex> lock(mu_);
    if (gen != generation_) {
      values_.timeout_s = config::get_double("TUTTI_TIMEOUT");
      values_.check_ops = config::get_bool("TUTTI_CHECK_COLLECTIVES");
      values_.stall_warn_s = config::get_double("TUTTI_STALL_WARN_S");
      generation_ = gen;
    }
    return values_;
  }

 private:
  std::mutex mu_;
  uint64_t generation_ = 0;
  Values values_;
};

}  // namespace comm
}  // namespace tutti
