#include "data_parallel/bucket_worker.h"

#include <pthread.h>

#include "core/check.h"

namespace tutti {
namespace dp {

BucketWorker::BucketWorker(std::string name, int num_buckets, Job job)
    : name_(std::move(name)), job_(std::move(job)),
      queue_(static_cast<size_t>(num_buckets)),
      state_(static_cast<size_t>(num_buckets), kIdle),
      error_(static_cast<size_t>(num_buckets)) {
  thread_ = std::thread([this] { loop(); });
}

BucketWorker::~BucketWorker() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return head_ == tail_; });
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BucketWorker::enqueue(int bucket) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t b = static_cast<size_t>(bucket);
    TUTTI_CHECK(b < state_.size() && state_[b] == kIdle && tail_ < queue_.size(),
                "bucket ", bucket, " queued twice in one step");
    state_[b] = kQueued;
    queue_[tail_++] = bucket;
  }
  cv_.notify_all();
}

void BucketWorker::wait(int bucket) {
  std::unique_lock<std::mutex> lock(mu_);
  const size_t b = static_cast<size_t>(bucket);
  TUTTI_CHECK(b < state_.size() && state_[b] != kIdle, "bucket ", bucket,
              " waited for but never queued");
  cv_.wait(lock, [&] { return state_[b] == kDone; });
  if (error_[b]) std::rethrow_exception(error_[b]);
}

void BucketWorker::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return head_ == tail_; });
}

void BucketWorker::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  TUTTI_CHECK(head_ == tail_, "reset while buckets are queued");
  head_ = tail_ = 0;
  for (auto& s : state_) s = kIdle;
  for (auto& e : error_) e = nullptr;
  first_error_ = nullptr;
}

void BucketWorker::loop() {
  const std::string thread_name = ("tutti-" + name_).substr(0, 15);
  pthread_setname_np(pthread_self(), thread_name.c_str());
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || head_ < tail_; });
    if (head_ == tail_) return;  // stopping with nothing queued
    const int bucket = queue_[head_];
    std::exception_ptr skipped = first_error_;
    lock.unlock();
    std::exception_ptr err;
    if (skipped) {
      // The cause's code travels on: a waiter that meets this bucket first
      // (hierarchical: wait_bucket(k) waits for job k + 1) must see what
      // failed, e.g. kRanksLost for a dead peer (the caller recovers on
      // that code), not a kAborted of the worker's own making.
      const Error cause = detail::error_of(skipped);
      const std::string prefix = detail::rank_prefix();
      std::string text = cause.message();
      if (text.compare(0, prefix.size(), prefix) == 0) text.erase(0, prefix.size());
      err = std::make_exception_ptr(Error(
          cause.code(), detail::cat(prefix, "bucket ", bucket,
                                    " was not reduced: an earlier bucket of this step failed: ",
                                    text)));
    } else {
      try {
        job_(bucket);
      } catch (...) {
        err = std::current_exception();
      }
    }
    lock.lock();
    error_[static_cast<size_t>(bucket)] = err;
    if (err && !first_error_) first_error_ = err;
    state_[static_cast<size_t>(bucket)] = kDone;
    ++head_;
    cv_.notify_all();
  }
}

}  // namespace dp
}  // namespace tutti
