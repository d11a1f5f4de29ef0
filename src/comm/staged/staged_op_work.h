// The Work of one staged operation (staged_communicator.h), with the NCCL
// path's semantics:
//  * wait(): blocks the host until the op is started, i.e. its result's
//    host-to-device copy is enqueued (the host collective is over), then
//    makes the caller's stream (OpOptions::stream) wait for that copy;
//    rethrows the op's error.
//  * synchronize(): blocks until the result is in device memory.
//  * test(): true once it is; never blocks.
// Send/recv are only posted by the engine (so that a pending receive never
// holds up the collectives behind it, as on the MPI path); the first thread
// that waits for one, or finds it complete in test(), completes it: a
// receive's host-to-device copy is enqueued then.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/staged/copier.h"
#include "comm/staged/staging.h"
#include "comm/staged_work.h"
#include "tutti/error.h"

namespace tutti {
namespace staged {

class StagedOpWork : public comm::StagedWork {
 public:
  // `broke`: called with the error when a copy this work makes from a
  // waiting thread fails (the communicator is unusable then).
  StagedOpWork(std::unique_ptr<OpCopies> copies,
               std::function<void(const Error&)> broke);
  ~StagedOpWork() override;

  void wait() override;
  void synchronize() override;
  bool test() override;

  // The engine's side.
  OpCopies& copies() { return *copies_; }
  // A send/recv was posted as `host` over `staging`; a receive lands at
  // `dst` (`bytes`).  Before started().
  void posted(WorkPtr host, std::unique_ptr<Staging> staging, void* dst, size_t bytes);

 private:
  // Completes a posted send/recv once its host work is done (`block`: waits
  // for it).  True when complete.  mu_ held; rethrows the op's error.
  bool finish_p2p(std::unique_lock<std::mutex>& lock, bool block);

  std::unique_ptr<OpCopies> copies_;
  std::function<void(const Error&)> broke_;
  // A posted send/recv until finish_p2p() completed it.
  WorkPtr host_;
  std::unique_ptr<Staging> staging_;
  void* dst_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace staged
}  // namespace tutti
