// The threads a checkpoint load hashes and copies with: the calling thread
// plus up to threads()-1 helpers, kept for the whole load so that running
// one batch of tasks costs no thread start.  TUTTI_CKPT_LOAD_THREADS sets
// the count; 0 (the default) takes the machine's cores shared among the
// node's ranks, at most kMaxAuto.  Memory bandwidth, not cores, bounds a
// load from RAM, so a few threads reach it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tutti {
namespace ckpt {

class LoadWorkers {
 public:
  static constexpr int kMaxAuto = 8;

  // `threads` >= 1 (1: everything on the calling thread).
  explicit LoadWorkers(int threads);
  ~LoadWorkers();
  LoadWorkers(const LoadWorkers&) = delete;
  LoadWorkers& operator=(const LoadWorkers&) = delete;

  // The count TUTTI_CKPT_LOAD_THREADS asks for, with `ranks_on_node` ranks
  // sharing this machine's cores.
  static int count_for(int ranks_on_node);

  int threads() const { return static_cast<int>(helpers_.size()) + 1; }

  // Runs fn(0) .. fn(n-1), each once, spread over the threads, and returns
  // when all are done.  If tasks throw, rethrows the exception of the
  // lowest-numbered one (the same error whatever the threads' timing).
  void run(size_t n, const std::function<void(size_t)>& fn);

 private:
  void helper_loop();
  void work(const std::function<void(size_t)>* fn, size_t n);

  std::mutex mu_;
  std::condition_variable wake_, idle_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  std::atomic<size_t> next_{0};
  size_t active_ = 0;       // helpers inside a batch
  unsigned long gen_ = 0;   // batches started
  bool stop_ = false;
  size_t error_index_ = 0;
  std::exception_ptr error_;
  std::vector<std::thread> helpers_;
};

}  // namespace ckpt
}  // namespace tutti
