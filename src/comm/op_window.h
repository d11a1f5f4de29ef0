// Windows of operations checked together (the NCCL path's agreement check,
// docs/scale.md).  No MPI, no CUDA: the grouping and the hash only.
//
// Checking that every rank runs the same collective costs ceil(log2 W)
// messages per check; checking every K-th operation instead cuts that by K.
// The operations are grouped in windows by sequence number only (never by
// time or by waits, which differ between ranks and would pair unlike
// checks), so every rank closes the same windows:
//
//   sizes 1, 1, 2, 4, 8, ... up to `every` (K), then K, K, ...
//   ends  1, 2, 4, 8, 16, ..., then one every K operations
//
// The ramp checks the first operations one by one (a program that differs
// between ranks usually does so at its first step) and bounds a window at
// K operations.  The operation that closes a window carries the check of
// the whole window: a hash of its operations' check words, and on a
// disagreement their words one by one, so that the error still names the
// first operation that differed (mpi::WindowCheck).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/op_desc.h"

namespace tutti {
namespace comm {

// The operations of one closed window, in sequence order.
struct OpWindowRecord {
  uint64_t first_seq = 0;
  uint64_t last_seq = 0;
  // The check words (comm::check_word) and descriptors of its operations.
  std::vector<uint64_t> words;
  std::vector<WireDesc> wires;
  // Indexes into words/wires of the operations this rank rejected (their
  // arguments failed local validation).
  std::vector<uint32_t> invalid;
  // A hash of `words` (never 0 or all ones, like a check word).
  uint64_t hash() const;
};

class OpWindow {
 public:
  // `every` >= 1 (1: every operation is its own window).
  explicit OpWindow(int every);

  // The last sequence number of the window that holds `seq` (1-based), for
  // a window size cap of `every`.  Closed form: seq itself for seq <= 2,
  // the next power of two while the ramp is below `every`, then steps of
  // `every`.
  static uint64_t window_end(uint64_t seq, int every);

  // Records operation `seq` (increasing: the caller numbers its checked
  // operations 1, 2, 3, ...; a gap is an operation not checked, the same on
  // every rank).  True when it closes its window: *out then holds the
  // window (every operation recorded since the previous close).
  bool add(uint64_t seq, const WireDesc& wire, bool locally_invalid, OpWindowRecord* out);

  int every() const { return every_; }
  // Operations recorded in the open window, its first sequence number and
  // the one that will close it (for messages about unchecked operations).
  size_t open_ops() const { return open_.words.size(); }
  uint64_t open_first() const { return open_.first_seq; }
  uint64_t open_end() const { return end_; }

 private:
  int every_;
  uint64_t end_ = 0;  // last seq of the open window (0: none opened yet)
  OpWindowRecord open_;
};

}  // namespace comm
}  // namespace tutti
