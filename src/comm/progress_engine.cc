#include "comm/progress_engine.h"

#include <pthread.h>

#include "core/check.h"

namespace tutti {
namespace comm {

ProgressEngine::ProgressEngine(std::string name) : name_(std::move(name)) {}

ProgressEngine::~ProgressEngine() { stop(); }

void ProgressEngine::submit(std::function<void()> task, bool blocking) {
  std::unique_lock<std::mutex> lock(mu_);
  if (blocking && !busy_ && queue_.empty()) {
    run_here(lock, task);
    return;
  }
  // Stopped (or stopping): no thread will run a queued task, and a Work
  // waiting for it would wait forever.
  if (stopping_)
    TUTTI_THROW(kAborted, "communicator '", name_, "' is closed: an operation "
                "submitted while or after it closed will never run");
  if (!thread_.joinable()) {
    thread_ = std::thread([this] { loop(); });
  }
  queue_.push_back(std::move(task));
  cv_.notify_all();
}

void ProgressEngine::run_here(std::unique_lock<std::mutex>& lock,
                              const std::function<void()>& task) {
  busy_ = true;
  lock.unlock();
  task();
  lock.lock();
  busy_ = false;
  cv_.notify_all();
}

void ProgressEngine::loop() {
  const std::string thread_name = ("tutti-" + name_).substr(0, 15);
  pthread_setname_np(pthread_self(), thread_name.c_str());
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || (!queue_.empty() && !busy_); });
    if (queue_.empty()) {
      if (stopping_) return;
      continue;
    }
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    run_here(lock, task);
  }
}

void ProgressEngine::run_and_wait(const std::function<void()>& fn) {
  std::exception_ptr err;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  submit(
      [&] {
        try {
          fn();
        } catch (...) {
          err = std::current_exception();
        }
        std::lock_guard<std::mutex> lock(mu);
        done = true;
        cv.notify_all();
      },
      true);
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (err) std::rethrow_exception(err);
}

void ProgressEngine::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void ProgressEngine::stop() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace comm
}  // namespace tutti
