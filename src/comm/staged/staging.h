// One operation's host staging: the same request over host memory leased
// from the communicator's pool, and which copies it needs.
//
// The host request mirrors the device request exactly: each device buffer
// becomes a staging buffer of the same size, with the same aliasing (in
// place stays in place; an all-gather whose input is this rank's block of
// the output keeps that block), and kind, dtype, shapes, reduce op, root,
// tag, counts and options are the same (minus the stream).  The host
// collective therefore runs the same MPI calls on the same values as it
// would on host tensors: the results are bit-identical.
#pragma once

#include <cstddef>
#include <exception>
#include <memory>

#include "core/host_buffer.h"
#include "tutti/comm.h"

namespace tutti {
namespace staged {

class Staging {
 public:
  // Leases the staging memory of `r` (valid on this rank: it passed
  // comm::validate) from `pool`, which it keeps alive until the buffer is
  // back (a Work may outlive its communicator).  `rank` decides a
  // broadcast's copies.
  Staging(const OpRequest& r, int rank, std::shared_ptr<HostBufferPool> pool);
  // A request this rank rejected: no memory, and the request as it is for
  // the host communicator, which only describes it (kind, dtype, counts) to
  // its peers: the layered check (comm/layered_host.h) rejects it before
  // anything reads the tensors, and the agreement check marks this rank
  // invalid.
  explicit Staging(const OpRequest& r);
  ~Staging();  // gives the buffer back unless abandon()ed
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  const OpRequest& host_request() const { return host_; }
  // Device input -> staging input before the host op (this rank sends data).
  bool copy_in() const { return copy_in_; }
  // Staging output -> device output after it (this rank receives data).
  bool copy_out() const { return copy_out_; }
  void* staging_in() const { return host_.input.data(); }
  void* staging_out() const { return host_.output.data(); }

  // Returns the buffer to the pool now.  Only once no copy or MPI request
  // can touch it any more, or when the next holder is ordered after them
  // (the copier's invariant, copier.h).
  void release();
  // Never returns the buffer, never frees it: a copy or an MPI request that
  // failed may still write it (leaked on purpose, as the MPI path's
  // abandoned request buffers).
  void abandon();
  // After the host op failed with `error`: back to the pool where the host
  // communicator cannot still be using the buffer (it refused or rejected
  // the op, or the exchange completed: kInvalidArgument, kMismatch,
  // kAborted), else abandon() (a timeout leaves the MPI request pending;
  // an MPI or peer failure leaves it unknown).
  void settle_after(const std::exception_ptr& error);

 private:
  OpRequest host_;
  std::shared_ptr<HostBufferPool> pool_;
  HostBuffer buffer_;
  bool copy_in_ = false;
  bool copy_out_ = false;
};

}  // namespace staged
}  // namespace tutti
