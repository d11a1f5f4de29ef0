// The reducer's communication thread for buckets whose reduction is a
// sequence of blocking collectives (a Compressor, the hierarchical
// all-reduce): the training thread enqueues bucket ids in launch order and
// goes on computing; the worker runs the job for each in that order, so
// every rank issues the same collectives in the same order.
//
// No allocation per step: the queue is a preallocated array reset at each
// step's end.  After a job fails, the rest of the step's buckets are not run
// (they fail with a "skipped" error carrying the first error's code, so a
// waiter that meets one first sees e.g. kRanksLost): a rank that failed
// locally must not issue later collectives its peers are not expecting to
// match.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tutti {
namespace dp {

class BucketWorker {
 public:
  using Job = std::function<void(int bucket)>;
  BucketWorker(std::string name, int num_buckets, Job job);
  ~BucketWorker();
  BucketWorker(const BucketWorker&) = delete;
  BucketWorker& operator=(const BucketWorker&) = delete;

  // Queues `bucket` (each bucket at most once per step).
  void enqueue(int bucket);
  // Blocks until `bucket` ran; rethrows its error.
  void wait(int bucket);
  // Blocks until every queued bucket ran (errors stay for wait()).
  void drain();
  // Forgets the step: every queued bucket must have run (drain() first).
  void reset();

 private:
  enum State : unsigned char { kIdle, kQueued, kDone };
  void loop();

  std::string name_;
  Job job_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> queue_;
  size_t head_ = 0, tail_ = 0;
  std::vector<State> state_;
  std::vector<std::exception_ptr> error_;
  std::exception_ptr first_error_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dp
}  // namespace tutti
