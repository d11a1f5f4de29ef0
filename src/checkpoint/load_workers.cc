#include "checkpoint/load_workers.h"

#include <algorithm>

#include "tutti/config.h"

namespace tutti {
namespace ckpt {

LoadWorkers::LoadWorkers(int threads) {
  for (int i = 1; i < threads; ++i) helpers_.emplace_back([this] { helper_loop(); });
}

LoadWorkers::~LoadWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : helpers_) t.join();
}

int LoadWorkers::count_for(int ranks_on_node) {
  const int64_t asked = config::get_int("TUTTI_CKPT_LOAD_THREADS");
  if (asked > 0) return static_cast<int>(std::min<int64_t>(asked, 256));
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, std::min(kMaxAuto, cores / std::max(1, ranks_on_node)));
}

void LoadWorkers::work(const std::function<void(size_t)>* fn, size_t n) {
  for (size_t i = next_.fetch_add(1); i < n; i = next_.fetch_add(1)) {
    try {
      (*fn)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_ || i < error_index_) {
        error_ = std::current_exception();
        error_index_ = i;
      }
    }
  }
}

void LoadWorkers::helper_loop() {
  unsigned long seen = 0;
  for (;;) {
    const std::function<void(size_t)>* fn;
    size_t n;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || gen_ != seen; });
      if (stop_) return;
      seen = gen_;
      fn = fn_;
      n = n_;
      ++active_;
    }
    work(fn, n);
    std::lock_guard<std::mutex> lock(mu_);
    if (--active_ == 0) idle_.notify_all();
  }
}

void LoadWorkers::run(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (helpers_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [&] { return active_ == 0; });
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    error_ = nullptr;
    ++gen_;
  }
  wake_.notify_all();
  work(&fn, n);
  std::exception_ptr error;
  {
    // Every task is claimed; wait for the helpers still running one.  A
    // helper that wakes later finds nothing left to claim.
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [&] { return active_ == 0; });
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace ckpt
}  // namespace tutti
