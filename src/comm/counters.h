// Per-protocol traffic counters: how many messages and bytes this process
// sent for each of tutti's own protocols, in how many dependent rounds, over
// how many calls.  They exist to show growth with the rank count in tests
// (tests/scale/, tests/comm/test_log_coll.cc): a protocol in O(log W) sends
// at most a + b*ceil(log2 W) messages per call and rank, one in O(W) does
// not.  Relaxed atomics: one uncontended add per message, nothing
// allocated; readers take a snapshot that is exact once the protocol's
// calls have returned on this process.
//
// "rounds" are the dependent steps of a schedule tutti runs itself (a round
// waits for the previous one's messages).  For an operation left to MPI
// (coll/libnbc's ring for a large all-reduce) only calls are counted here:
// its internal messages are invisible to tutti, and Open MPI's PML
// monitoring (MPI_T pvars pml_monitoring_messages_count/_size) counts them.
#pragma once

#include <cstdint>
#include <string>

namespace tutti {
namespace comm {
namespace counters {

enum class Protocol : uint8_t {
  kCheck,        // agreement check, phase 1 (header-only frame)
  kFold,         // agreement check with an operation folded into its frame
  kCheckDetail,  // agreement check, phase 2 (descriptors gathered on mismatch)
  kMpiCollective,  // an operation handed to MPI (calls only)
  kNumProtocols
};

// "check", "fold", "check_detail", "mpi_collective".
const char* protocol_name(Protocol p);

struct Counts {
  uint64_t messages = 0;  // messages sent
  uint64_t bytes = 0;     // bytes sent
  uint64_t rounds = 0;    // dependent rounds of tutti's own schedules
  uint64_t calls = 0;     // schedules (or MPI calls) started
};

void add_message(Protocol p, uint64_t bytes);
void add_round(Protocol p);
void add_call(Protocol p);

Counts get(Protocol p);
// All protocols back to zero (tests bracket a phase with reset()/get()).
void reset();
// {"check": {"messages": 3, "bytes": 48, "rounds": 3, "calls": 3}, ...}:
// every protocol, one line, for probes that print per-rank JSON.
std::string to_json();

}  // namespace counters
}  // namespace comm
}  // namespace tutti
