#include "comm/counters.h"

#include <atomic>
#include <sstream>

namespace tutti {
namespace comm {
namespace counters {
namespace {

constexpr int kN = static_cast<int>(Protocol::kNumProtocols);

struct Slot {
  std::atomic<uint64_t> messages{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> rounds{0};
  std::atomic<uint64_t> calls{0};
};

Slot g_slots[kN];

Slot& slot(Protocol p) { return g_slots[static_cast<int>(p)]; }

}  // namespace

const char* protocol_name(Protocol p) {
  switch (p) {
    case Protocol::kCheck: return "check";
    case Protocol::kFold: return "fold";
    case Protocol::kCheckDetail: return "check_detail";
    case Protocol::kMpiCollective: return "mpi_collective";
    case Protocol::kNumProtocols: break;
  }
  return "unknown";
}

void add_message(Protocol p, uint64_t bytes) {
  Slot& s = slot(p);
  s.messages.fetch_add(1, std::memory_order_relaxed);
  s.bytes.fetch_add(bytes, std::memory_order_relaxed);
}

void add_round(Protocol p) { slot(p).rounds.fetch_add(1, std::memory_order_relaxed); }

void add_call(Protocol p) { slot(p).calls.fetch_add(1, std::memory_order_relaxed); }

Counts get(Protocol p) {
  const Slot& s = slot(p);
  Counts c;
  c.messages = s.messages.load(std::memory_order_relaxed);
  c.bytes = s.bytes.load(std::memory_order_relaxed);
  c.rounds = s.rounds.load(std::memory_order_relaxed);
  c.calls = s.calls.load(std::memory_order_relaxed);
  return c;
}

void reset() {
  for (Slot& s : g_slots) {
    s.messages.store(0, std::memory_order_relaxed);
    s.bytes.store(0, std::memory_order_relaxed);
    s.rounds.store(0, std::memory_order_relaxed);
    s.calls.store(0, std::memory_order_relaxed);
  }
}

std::string to_json() {
  std::ostringstream os;
  os << "{";
  for (int i = 0; i < kN; ++i) {
    const auto p = static_cast<Protocol>(i);
    const Counts c = get(p);
    os << (i ? ", " : "") << "\"" << protocol_name(p) << "\": {\"messages\": "
       << c.messages << ", \"bytes\": " << c.bytes << ", \"rounds\": " << c.rounds
       << ", \"calls\": " << c.calls << "}";
  }
  os << "}";
  return os.str();
}

}  // namespace counters
}  // namespace comm
}  // namespace tutti
