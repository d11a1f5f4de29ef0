// MPI plumbing shared by the MPI communicator: initialisation ownership,
// dtype/op mapping, and waits that honour the watchdog deadline.
#pragma once

#include <mpi.h>

#include <chrono>
#include <functional>
#include <string>

#include "comm/op_desc.h"
#include "core/check.h"
#include "tutti/comm.h"

namespace tutti {
namespace mpi {

// What TUTTI_MPI_CHECK throws: Error(kMpi) "rank R: <context>: MPI_Xxx
// failed: <MPI's text>" (detail::call_failed).
[[noreturn]] void throw_mpi_error(int code, const char* expr,
                                  const std::string& context, const char* file,
                                  int line);
// What TUTTI_MPI_WARN does with a failure: logs the same text at WARN and
// returns false (true for MPI_SUCCESS).
bool mpi_ok(int code, const char* expr, const std::string& context);

// MPI's own error text for a return code.
std::string error_string(int code);

// True when a launcher (mpirun/mpiexec, srun, a PMI/PMIx server) started
// this process.
bool launched_by_launcher();
bool is_initialized();

struct InitState {
  bool owned = false;    // tutti called MPI_Init_thread and will finalise
  int thread_level = 0;  // MPI_THREAD_* granted
};
// "MPI_THREAD_FUNNELED" for MPI_THREAD_FUNNELED, ...
std::string thread_level_name(int level);
// The level tutti asks MPI_Init_thread for: MPI_THREAD_MULTIPLE unless
// TUTTI_MPI_THREAD_LEVEL names a lower one (to test the refusal below).
int requested_thread_level();
// Empty when MPI granted enough; else why tutti cannot run.  tutti needs
// MPI_THREAD_MULTIPLE: its progress threads, the NCCL agreement check and
// watchdog, the status responder and the data-parallel bucket worker call
// MPI concurrently with the application's thread.  `owned`: tutti
// initialised MPI (else the application or mpi4py did).
std::string thread_level_problem(int granted, bool owned);
// Initialises MPI if nobody has (asking for requested_thread_level()), or
// adopts the application's MPI.  Throws kUnsupported when the granted level
// is below MPI_THREAD_MULTIPLE (thread_level_problem()).
InitState initialize();
// Frees tutti's user-defined ops and, if tutti owns MPI, finalises it.
void finalize(const InitState& state);

// MPI datatype of one element (16-bit floats travel as MPI_UINT16_T).
MPI_Datatype datatype(DType dtype);
// The MPI op implementing `op` on `dtype` with tutti's semantics
// (core/cpu_reduce.h): MPI's predefined ops where they agree, user-defined
// ones for 16-bit floats and for NaN-propagating float min/max.  kAvg maps
// to the sum; the caller divides.
MPI_Op reduce_op(DType dtype, ReduceOp op);

class Deadline {
 public:
  // seconds <= 0: never expires.
  explicit Deadline(double seconds);
  bool expired() const;
  double seconds() const { return seconds_; }

 private:
  double seconds_;
  std::chrono::steady_clock::time_point when_;
};

// The stall inspector's clock for one operation: report(waited_s) runs
// every `period_s` seconds after `start` (the op's start, so that the
// agreement check and the data exchange share it) for as long as the op
// waits.  period_s <= 0 disables it.  wait_rc() looks at it only where it
// checks its deadline (after the first spinning polls, every 64th yield,
// every sleep): an op that completes promptly never does, and nothing is
// sent unless report() sends it.  `check`, when set, runs at every poll
// whatever the period (the departure check: it throws to end the wait when
// a member the op waits for has left; one atomic load otherwise).
class StallWatch {
 public:
  using Clock = std::chrono::steady_clock;
  StallWatch(double period_s, std::function<void(double waited_s)> report,
             Clock::time_point start = Clock::now(),
             std::function<void()> check = nullptr);
  // Runs check(), then calls report() if a period has ended since the last
  // call (once, however many periods passed).
  void poll(Clock::time_point now);
  bool enabled() const { return period_s_ > 0; }

 private:
  double period_s_;
  std::function<void(double)> report_;
  std::function<void()> check_;
  Clock::time_point start_;
  Clock::time_point next_;
};

// Polls `request` until it completes (true) or the deadline passes (false;
// the request is left pending).  An MPI error throws kMpi naming `desc`.
// Backs off as comm::Backoff says (spin, yield, then sleeps up to
// TUTTI_MPI_WAIT_SLEEP_US), so a long wait (a late peer) costs little CPU:
// the cores stay with the computation the communication overlaps.
// A `stall` watch is polled alongside the deadline.  `min_yield_us`: the
// yield phase lasts at least this long (an op MPI runs in many rounds that
// only advance while this rank polls: modelled_us()).
bool wait(MPI_Request* request, const Deadline& deadline,
          const comm::OpLabel& desc, MPI_Status* status = MPI_STATUS_IGNORE,
          StallWatch* stall = nullptr, int64_t min_yield_us = 0);

// As wait(), but an MPI error is returned in *rc (MPI_SUCCESS otherwise)
// instead of thrown, for callers that translate it (e.g. MPI_ERR_TRUNCATE).
bool wait_rc(MPI_Request* request, const Deadline& deadline, MPI_Status* status,
             int* rc, StallWatch* stall = nullptr, int64_t min_yield_us = 0);

// The one host wait loop behind wait_rc() and tutti's own schedules: calls
// poll(&progressed) until it returns true (then true) or the deadline
// passes (false), backing off as comm::Backoff says; a poll that sets
// progressed (a round completed) starts the backoff over
// (Backoff::progressed()).  `stall` is polled where the deadline is.
bool poll_until(const std::function<bool(bool* progressed)>& poll,
                const Deadline& deadline, StallWatch* stall = nullptr,
                int64_t min_yield_us = 0);

// How long an MPI collective of `bytes` per rank in `rounds` dependent
// rounds is expected to take, for a wait's yield phase: rounds x 10 us plus
// 1 ns per byte (1 GB/s), capped at 20 ms.  Sleeping inside a multi-round
// libnbc op costs a sleep per round in which this rank forwards; yielding
// as long as the op should take avoids that without spinning on a late peer
// for longer than 20 ms.
int64_t modelled_us(int64_t rounds, int64_t bytes);

// TUTTI_MPI_LARGE_ALGORITHM as the value of Open MPI's
// coll_libnbc_iallreduce_algorithm for a world of `world_size` ranks
// ("auto": "1", the ring, up to 8 ranks, else "3", Rabenseifner's
// reduce-scatter + all-gather; "ring": "1"; "rabenseifner": "3"; "mpi": ""
// (libnbc's own rule)).  Throws kInvalidArgument on another value.
std::string libnbc_allreduce_algorithm(const std::string& setting, int world_size);

}  // namespace mpi
}  // namespace tutti

// The check for every MPI call (tutti sets MPI_ERRORS_RETURN on each
// communicator it uses, so failures come back as return codes).  The
// optional arguments are the context, concatenated: the op (an OpLabel
// names op, sequence number, group and peer) or what the call was for.
// Throws Error(kMpi) "rank R: <context>: MPI_Xxx failed: <MPI's text>".
#define TUTTI_MPI_CHECK(expr, ...)                                         \
  do {                                                                     \
    const int tutti_rc_ = (expr);                                          \
    if (tutti_rc_ != MPI_SUCCESS)                                          \
      ::tutti::mpi::throw_mpi_error(tutti_rc_, #expr,                      \
                                    ::tutti::detail::cat(__VA_ARGS__),     \
                                    __FILE__, __LINE__);                   \
  } while (0)

// The same check where throwing is wrong (close() and destructors, the
// status responder thread, a diagnosis gathered while another error is
// being raised): logs the failure at WARN; evaluates to true on success.
#define TUTTI_MPI_WARN(expr, ...)                                         \
  ::tutti::mpi::mpi_ok((expr), #expr, ::tutti::detail::cat(__VA_ARGS__))
