// tutti's own latency-bound schedules over MPI point-to-point: collectives
// in ceil(log2 W) dependent rounds, run as non-blocking state machines so a
// caller can poll them against a deadline (the agreement check, small
// all-reduces folded into it; docs/communication.md, "Algorithm").
//
// Why not MPI's non-blocking collectives: Open MPI serves MPI_Iallreduce
// from coll/libnbc, whose ring tutti forces for large messages (it measured
// 1.2-3.0x MPI_Allreduce at 2 ranks) and which then takes 2(W-1) dependent
// rounds for 16 bytes as well; its iallgather is linear (W-1 messages per
// rank).  The variable that picks libnbc's algorithm is process-wide, so it
// cannot say "ring for large, recursive doubling for small".
//
// Each schedule sends on a communicator private to tutti (never one that
// carries the user's send/recv tags), with tags from one post index per
// communicator (ScheduleTags::next_post) taken when the schedule's owner
// posts it in op order on every rank.  Several schedules may be in flight on
// one communicator and be advanced in any order, by any thread (one thread
// at a time per schedule): messages match by (source, tag), not by posting
// order.  A schedule advances only inside its own test(): a rank that stops
// testing holds up its partners' later rounds (as libnbc does between MPI
// calls).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/counters.h"

namespace tutti {
namespace mpi {

// Tags: post index, step (a schedule's part: 0 = the check's phase 1, 1-3
// its later exchanges), round.  MPI guarantees tags up to 32767; Open MPI
// allows 2^31-1, which leaves 2^24 posts before a tag repeats.
struct ScheduleTags {
  static constexpr int kSteps = 4;
  static constexpr int kRoundsPerStep = 32;  // covers W < 2^30 with the fold
  // A fresh post index on `comm` (one counter per communicator, kept as an
  // MPI attribute and freed with it).  Call it in the same order on every
  // rank of `comm`.
  static uint64_t next_post(MPI_Comm comm);
  static int tag(uint64_t post, int step, int round);
};

// ceil(log2 n) for n >= 1.
int ceil_log2(int n);

// What a reduction schedule does with two frames.  `first` holds the
// operand of the lower-ranked side: first = f(first, second), so that every
// rank evaluates the same expression tree and gets the same bits, also for
// min/max of -0/+0 and NaN payloads, where f is not bitwise commutative.
class FrameOps {
 public:
  virtual ~FrameOps() = default;
  virtual void combine(const void* second, void* first, size_t bytes) const = 0;
  // A peer's frame had another size than this rank's (or did not fit the
  // receive buffer): nothing is combined; `mine` (this rank's `bytes`)
  // must record it so that every rank learns it (the check's header is set
  // to all ones, which its MAX combine propagates).
  virtual void size_differs(void* mine, size_t bytes) const = 0;
};

// Rounds of tutti's point-to-point schedules; test() advances.
class Schedule {
 public:
  virtual ~Schedule();
  Schedule(const Schedule&) = delete;
  Schedule& operator=(const Schedule&) = delete;

  // Advances without blocking: tests the current round's requests and,
  // while rounds complete, posts the next.  True once complete.
  // *progressed is set when a round completed (a waiter's backoff starts
  // over: comm::Backoff::progressed()).  Throws kMpi on an MPI error.
  bool test(bool* progressed = nullptr);
  bool done() const { return done_; }
  // Rounds this rank completed (its share of the schedule; closed forms in
  // tests/comm/test_log_coll.cc).
  int rounds_done() const { return rounds_done_; }
  // The requests of the current round (empty when done), for a caller that
  // tests many schedules at once.
  int pending(MPI_Request* out) const;

 protected:
  Schedule(MPI_Comm comm, uint64_t post, int step,
           comm::counters::Protocol protocol);
  // Posts round `round` (its tag index): a receive of up to `recv_bytes`
  // into `recv` from `from` and a send of `send_bytes` from `send` to `to`
  // (-1: none).
  void post(int round, int from, void* recv, size_t recv_bytes, int to,
            const void* send, size_t send_bytes);
  // The current round completed (its receive held `received` bytes, or -1
  // when the message did not fit): the subclass combines and posts the next
  // round, or sets done_.
  virtual void advance(int64_t received) = 0;
  // Whether requests are still pending.  A schedule destroyed before it
  // completed (its wait timed out: the communicator is unusable) leaks its
  // buffers, which MPI may still write.
  bool in_flight() const { return nreqs_ > 0; }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  bool done_ = false;

 private:
  uint64_t post_;
  int step_;
  comm::counters::Protocol protocol_;
  MPI_Request reqs_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  int nreqs_ = 0;
  bool has_recv_ = false;
  int rounds_done_ = 0;
};

// Two frame buffers that a caller running one schedule at a time keeps
// across its schedules (the MPI backend's engine, one per communicator), so
// that a stream of host ops allocates no buffer after the first.  A
// schedule abandoned in flight leaves them to MPI (leaked).
struct FrameScratch {
  FrameScratch() = default;
  ~FrameScratch();
  FrameScratch(const FrameScratch&) = delete;
  FrameScratch& operator=(const FrameScratch&) = delete;
  char* buf[2] = {nullptr, nullptr};
  size_t capacity = 0;
};

// All-reduce by recursive doubling, W any: with p the largest power of two
// <= W and r = W - p, ranks 2i and 2i+1 (i < r) first fold into 2i+1, the
// p survivors exchange whole frames in log2(p) rounds (partner = rank xor
// 2^k among survivors), and 2i+1 sends the result back to 2i.  Rounds per
// rank: log2(p), or log2(p) + 2 for the odd ranks below 2r (2 for the even
// ones, which only send and receive).  Messages sent per rank: log2(p), +1
// for the odd ranks below 2r; the even ones below 2r send 1.
class RdAllreduce : public Schedule {
 public:
  // A frame of `bytes`; peers' frames may be up to `capacity` bytes
  // (>= bytes) and one of another size than this rank's is handed to
  // ops.size_differs().  `ops` must outlive the schedule.  Write this
  // rank's contribution into frame(), then start().  The frames live in
  // `scratch` when given (grown to `capacity`), else in blocks of a pool.
  RdAllreduce(MPI_Comm comm, uint64_t post, int step, size_t bytes,
              size_t capacity, const FrameOps& ops,
              comm::counters::Protocol protocol, FrameScratch* scratch = nullptr);
  ~RdAllreduce() override;
  void* frame() { return mine_; }
  // Posts the first round.
  void start();
  // The result once done() (this rank's `bytes`).
  const void* result() const { return mine_; }
  size_t bytes() const { return bytes_; }

 private:
  void advance(int64_t received) override;
  void start_round();
  // Real rank of survivor `v`.
  int real_rank(int v) const { return v < extra_ ? 2 * v + 1 : v + extra_; }

  size_t bytes_;
  size_t capacity_;
  const FrameOps& ops_;
  FrameScratch* scratch_;
  char* mine_;
  char* other_;
  int pof2_ = 1;
  int extra_ = 0;    // r
  int vrank_ = -1;   // survivor index, -1 for even ranks below 2r
  int stage_ = 0;    // 0: fold in, 1..log2(p): doubling, log2(p)+1: fold out
  int stages_ = 0;   // log2(p) + 2
};

// All-gather by Bruck's algorithm: ceil(log2 W) rounds for any W, round k
// sends min(2^k, W - 2^k) blocks to rank - 2^k and receives as many from
// rank + 2^k.  Messages sent per rank: ceil(log2 W).
class BruckAllgather : public Schedule {
 public:
  // `block` bytes from this rank; result() holds W blocks in rank order.
  BruckAllgather(MPI_Comm comm, uint64_t post, int step, const void* block,
                 size_t block_bytes, comm::counters::Protocol protocol);
  ~BruckAllgather() override;
  const void* result() const { return out_.data(); }

 private:
  void advance(int64_t received) override;
  void start_round();

  size_t block_;
  int round_ = 0;
  int rounds_ = 0;
  char* tmp_;  // blocks of ranks rank, rank+1, ... (mod W)
  std::vector<char> out_;
};

}  // namespace mpi
}  // namespace tutti
