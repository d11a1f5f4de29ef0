#include "checkpoint/agreement.h"

#include <atomic>
#include <cstring>

#include "core/check.h"
#include "tutti/config.h"

namespace tutti {
namespace ckpt {
namespace {

constexpr int kGatherTag = 0x7c47;  // the tree gather's messages (private communicator)

struct Counters {
  std::atomic<uint64_t> collectives{0}, data{0}, sent{0}, received{0}, bytes{0};
};
Counters& counters() {
  static Counters c;
  return c;
}
void count_collective() { counters().collectives.fetch_add(1, std::memory_order_relaxed); }

void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
void put_i32(std::string& s, int32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }

}  // namespace

ProtocolCounts protocol_counts() {
  ProtocolCounts p;
  p.collectives = counters().collectives.load(std::memory_order_relaxed);
  p.data_broadcasts = counters().data.load(std::memory_order_relaxed);
  p.messages_sent = counters().sent.load(std::memory_order_relaxed);
  p.messages_received = counters().received.load(std::memory_order_relaxed);
  p.bytes_sent = counters().bytes.load(std::memory_order_relaxed);
  return p;
}

void reset_protocol_counts() {
  counters().collectives = 0;
  counters().data = 0;
  counters().sent = 0;
  counters().received = 0;
  counters().bytes = 0;
}

OpOptions Agreement::options(const char* phase) const {
  OpOptions o;
  o.name = what_ + ": " + phase;
  o.timeout_s = timeout_s_;
  return o;
}

int64_t Agreement::broadcast(int64_t value, int root, const char* phase) {
  count_collective();
  comm_.broadcast(Tensor::of(&value, 1), root, options(phase));
  return value;
}

std::vector<int64_t> Agreement::broadcast(std::vector<int64_t> values, int root,
                                          const char* phase) {
  count_collective();
  comm_.broadcast(Tensor::of(values), root, options(phase));
  return values;
}

int64_t Agreement::allreduce_max(int64_t value, const char* phase) {
  count_collective();
  comm_.allreduce(Tensor::of(&value, 1), ReduceOp::kMax, options(phase));
  return value;
}

std::vector<int64_t> Agreement::allreduce_max(std::vector<int64_t> words, const char* phase) {
  if (words.empty()) return words;
  count_collective();
  comm_.allreduce(Tensor::of(words), ReduceOp::kMax, options(phase));
  return words;
}

std::string Agreement::broadcast(const std::string& text, int root, const char* phase) {
  int64_t n = static_cast<int64_t>(text.size());
  n = broadcast(n, root, phase);
  if (n == 0) return std::string();
  std::vector<uint8_t> buf(static_cast<size_t>(n));
  if (comm_.rank() == root) buf.assign(text.begin(), text.end());
  count_collective();
  comm_.broadcast(Tensor::of(buf), root, options(phase));
  return std::string(buf.begin(), buf.end());
}

void Agreement::broadcast_bytes(void* data, uint64_t n, int root, const char* phase) {
  if (n == 0) return;
  counters().data.fetch_add(1, std::memory_order_relaxed);
  comm_.broadcast(Tensor(data, DType::kUInt8, Shape{static_cast<int64_t>(n)}), root,
                  options(phase));
}

std::string Agreement::tree_gather(std::string mine, const Merge& merge, const char* phase) {
  const int rank = comm_.rank(), size = comm_.size();
  const OpOptions o = options(phase);
  for (int mask = 1; mask < size; mask <<= 1) {
    if (rank & mask) {  // send the subtree's aggregate to the parent; done
      int64_t n = static_cast<int64_t>(mine.size());
      comm_.send(Tensor::of(&n, 1), rank - mask, kGatherTag, o);
      if (n > 0)
        comm_.send(Tensor(&mine[0], DType::kUInt8, Shape{n}), rank - mask, kGatherTag, o);
      counters().sent.fetch_add(n > 0 ? 2 : 1, std::memory_order_relaxed);
      counters().bytes.fetch_add(8 + static_cast<uint64_t>(n), std::memory_order_relaxed);
      return std::string();
    }
    const int child = rank + mask;
    if (child >= size) continue;
    int64_t n = 0;
    comm_.recv(Tensor::of(&n, 1), child, kGatherTag, o);
    TUTTI_CHECK(n >= 0, what_, ": ", phase, ": rank ", child, " announced ", n, " bytes");
    std::string theirs(static_cast<size_t>(n), '\0');
    if (n > 0) comm_.recv(Tensor(&theirs[0], DType::kUInt8, Shape{n}), child, kGatherTag, o);
    counters().received.fetch_add(n > 0 ? 2 : 1, std::memory_order_relaxed);
    merge(mine, theirs);
  }
  return mine;
}

std::vector<std::pair<int, std::string>> Agreement::gather_records(const std::string* mine,
                                                                   const char* phase) {
  // An aggregate is a sequence of [int32 rank][uint64 length][bytes].
  std::string agg;
  if (mine) {
    put_i32(agg, comm_.rank());
    put_u64(agg, mine->size());
    agg += *mine;
  }
  agg = tree_gather(std::move(agg),
                    [](std::string& into, const std::string& child) { into += child; }, phase);
  std::vector<std::pair<int, std::string>> out;
  for (size_t at = 0; at < agg.size();) {
    TUTTI_CHECK(agg.size() - at >= 12, what_, ": ", phase, ": truncated record");
    int32_t r = 0;
    uint64_t n = 0;
    std::memcpy(&r, agg.data() + at, 4);
    std::memcpy(&n, agg.data() + at + 4, 8);
    at += 12;
    TUTTI_CHECK(n <= agg.size() - at, what_, ": ", phase, ": record of rank ", r,
                " overruns the aggregate");
    out.emplace_back(r, agg.substr(at, static_cast<size_t>(n)));
    at += static_cast<size_t>(n);
  }
  return out;
}

double agreement_timeout(double requested) {
  if (requested > 0) return requested;
  const double ckpt = config::get_double("TUTTI_CKPT_TIMEOUT");
  if (ckpt > 0) return ckpt;
  return config::get_double("TUTTI_TIMEOUT");
}

}  // namespace ckpt
}  // namespace tutti
