// Runs a communicator's operations one at a time, in submission order.
//
// Every rank submits the same sequence of collectives, so running them in
// order on one thread keeps the ranks matched.  A blocking call that finds
// the engine idle runs on the caller's thread (no hand-off latency); an
// async call, or a blocking one behind queued work, is queued for the
// engine's thread (MPI runs at MPI_THREAD_MULTIPLE: init() refuses less).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace tutti {
namespace comm {

class ProgressEngine {
 public:
  explicit ProgressEngine(std::string name);
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  // Tasks must not throw (they report through their Work).  After stop():
  // a blocking call still runs on the caller's thread; one that would be
  // queued throws Error(kAborted) (no thread would run it).
  void submit(std::function<void()> task, bool blocking);
  // Runs `fn` in order after everything submitted so far and waits for it;
  // rethrows what `fn` threw.  For work that must keep the communicator's
  // order without being an operation (splits, bootstrap collectives on the
  // host communicator).  Never from a task of this engine (it would wait
  // for itself).
  void run_and_wait(const std::function<void()>& fn);
  // Waits until everything submitted so far has run.
  void drain();
  // Drains, then stops the thread.  Idempotent.
  void stop();

 private:
  void loop();
  // Runs `task` here with the engine marked busy; `lock` is held on entry
  // and exit.
  void run_here(std::unique_lock<std::mutex>& lock,
                const std::function<void()>& task);

  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace comm
}  // namespace tutti
