// The device side of the staged transport: how one operation's tensors get
// into host staging memory and its result back, in order with the caller's
// stream.  Two implementations: CudaCopier (cuda_copier.h: async copies on
// the communicator's own stream, ordered by events) and MemcpyCopier
// (below: host "device" tensors, plain memcpy), which lets CI run the whole
// staged communicator, the same code, on host pointers.
//
// One operation's copies, in this order (the engine of the communicator
// drives them, one operation at a time):
//   begin(stream)      at submission, on the caller's thread: marks where
//                      the caller's stream is (its work so far produced the
//                      input);
//   to_host(...)*      device -> staging, after that mark;
//   wait_host(...)     the host waits until those copies landed;
//   <the host collective runs on the staging buffers>
//   to_device(...)*    staging -> device;
//   finish()           marks the end of the op's copies;
// then, from whichever thread waits for the op:
//   stream_wait()      the caller's stream waits for finish() (no host wait);
//   done()             true once the device finished them.
//
// Invariant the staging pool relies on (staged_communicator.cc): every copy
// of every op goes on one stream, and wait_host() returns only once that
// stream has run everything enqueued on it before, so a staging buffer that
// an earlier op's to_device() still read is free again for the host when a
// later op's wait_host() returns.
#pragma once

#include <cstddef>
#include <memory>

#include "tutti/device.h"

namespace tutti {
namespace staged {

class OpCopies {
 public:
  virtual ~OpCopies() = default;
  virtual void to_host(void* dst, const void* src, size_t bytes) = 0;
  // False when `timeout_s` (> 0) passed first: the caller's stream never
  // reached the op (the copies stay pending).
  virtual bool wait_host(double timeout_s) = 0;
  virtual void to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void finish() = 0;
  virtual void stream_wait() = 0;
  virtual bool done() = 0;
};

class Copier {
 public:
  virtual ~Copier() = default;
  // The device of the tensors it copies (the communicator serves only it).
  virtual Device device() const = 0;
  // Whether staging memory should be page-locked (asynchronous copies).
  virtual bool pinned() const = 0;
  // A copier of the same kind for the same device, with its own stream (a
  // split's communicator).
  virtual std::unique_ptr<Copier> another() const = 0;
  // One op's copies; `stream` is OpOptions::stream (a cudaStream_t).
  virtual std::unique_ptr<OpCopies> begin(void* stream) = 0;
  // Blocks until every copy enqueued so far has finished (close()); false
  // when `timeout_s` (> 0) passed first.
  virtual bool quiesce(double timeout_s) = 0;
};

// Host tensors, copied with memcpy at once: every wait is already over.
class MemcpyCopier : public Copier {
 public:
  Device device() const override { return Device::cpu(); }
  bool pinned() const override { return false; }
  std::unique_ptr<Copier> another() const override { return std::make_unique<MemcpyCopier>(); }
  std::unique_ptr<OpCopies> begin(void* stream) override;
  bool quiesce(double) override { return true; }
};

}  // namespace staged
}  // namespace tutti
