#include "data_parallel/list_agreement.h"

#include <atomic>
#include <cstring>

#include "core/check.h"

namespace tutti {
namespace dp {
namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

void fnv(uint64_t& h, const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
}

// Items as <uint64 length><bytes>...
std::vector<uint8_t> serialize(const std::vector<std::string>& items) {
  std::vector<uint8_t> out;
  for (const auto& s : items) {
    const uint64_t n = s.size();
    const size_t at = out.size();
    out.resize(at + sizeof(n) + s.size());
    std::memcpy(out.data() + at, &n, sizeof(n));
    std::memcpy(out.data() + at + sizeof(n), s.data(), s.size());
  }
  return out;
}

std::vector<std::string> deserialize(const uint8_t* p, size_t n) {
  std::vector<std::string> items;
  size_t at = 0;
  while (at < n) {
    uint64_t len = 0;
    TUTTI_CHECK(at + sizeof(len) <= n, "truncated list");
    std::memcpy(&len, p + at, sizeof(len));
    at += sizeof(len);
    TUTTI_CHECK(at + len <= n, "truncated list item");
    items.emplace_back(reinterpret_cast<const char*>(p + at), len);
    at += len;
  }
  return items;
}

// The message for rank `r`, the first whose list (`mine`) differs from rank
// 0's (`ref`); `differing` ranks differ in all.
std::string describe_difference(const char* noun, int r, const std::vector<std::string>& mine,
                                const std::vector<std::string>& ref, int64_t differing) {
  size_t i = 0;
  while (i < mine.size() && i < ref.size() && mine[i] == ref[i]) ++i;
  const std::string who = "rank " + std::to_string(r);
  std::string first;
  if (i < mine.size() && i < ref.size()) {
    first = detail::cat(who, "'s ", noun, " #", i, " is ", mine[i], ", but rank 0's is ", ref[i]);
  } else if (i < ref.size()) {
    first = detail::cat(who, " has ", mine.size(), " ", noun, "s and rank 0 has ", ref.size(),
                        ": rank 0's ", noun, " #", i, " ", ref[i], " is missing on ", who);
  } else if (i < mine.size()) {
    first = detail::cat(who, " has ", mine.size(), " ", noun, "s and rank 0 has ", ref.size(),
                        ": ", who, "'s ", noun, " #", i, " ", mine[i], " is not on rank 0");
  } else {  // equal lists with different hashes cannot happen
    first = "the lists hash differently but compare equal";
  }
  if (differing > 1) first += detail::cat(" (", differing, " ranks differ from rank 0)");
  return first;
}

std::atomic<uint64_t> g_collectives{0}, g_bytes{0};

// One counted collective of `t`'s bytes (uint64 values travel as int64: the
// same bits, and MAX / SUM / broadcast are all the protocol needs).
void counted_allreduce(Communicator& comm, const Tensor& t, ReduceOp op, const std::string& name) {
  count_agreement_collective(t.nbytes());
  OpOptions o;
  o.name = name;
  comm.allreduce(t, op, o);
}

void counted_broadcast(Communicator& comm, const Tensor& t, int root, const std::string& name) {
  count_agreement_collective(t.nbytes());
  OpOptions o;
  o.name = name;
  comm.broadcast(t, root, o);
}

// Rank `root`'s items, `bytes` long serialized (known on every rank), on
// every rank.
std::vector<std::string> broadcast_items(Communicator& comm, const std::vector<uint8_t>& mine,
                                         int64_t bytes, int root, const std::string& name) {
  std::vector<uint8_t> buf(static_cast<size_t>(bytes));
  if (comm.rank() == root) buf = mine;
  if (bytes > 0)  // every rank knows the length: all skip an empty list
    counted_broadcast(comm, Tensor(buf.data(), DType::kUInt8, Shape{bytes}), root, name);
  return deserialize(buf.data(), buf.size());
}

}  // namespace

AgreementCost agreement_cost() {
  AgreementCost c;
  c.collectives = g_collectives.load(std::memory_order_relaxed);
  c.bytes = g_bytes.load(std::memory_order_relaxed);
  return c;
}

void reset_agreement_cost() {
  g_collectives.store(0, std::memory_order_relaxed);
  g_bytes.store(0, std::memory_order_relaxed);
}

void count_agreement_collective(uint64_t bytes) {
  g_collectives.fetch_add(1, std::memory_order_relaxed);
  g_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

uint64_t hash_items(const std::vector<std::string>& items) {
  uint64_t h = kFnvOffset;
  for (const auto& s : items) {
    const uint64_t n = s.size();
    fnv(h, &n, sizeof(n));
    fnv(h, s.data(), s.size());
  }
  return h;
}

void check_lists_agree(Communicator& comm, const std::string& context,
                       const std::vector<NamedList>& lists) {
  const int size = comm.size(), rank = comm.rank();
  if (size <= 1 || lists.empty()) return;
  const size_t k = lists.size();
  // Per list: h, ~h and (rank 0 only, others 0) its serialized length, so
  // that a difference needs no extra round to size rank 0's list.
  std::vector<std::vector<uint8_t>> bytes(k);
  std::vector<int64_t> words(3 * k);
  for (size_t j = 0; j < k; ++j) {
    const uint64_t h = hash_items(lists[j].items);
    bytes[j] = serialize(lists[j].items);
    words[3 * j] = static_cast<int64_t>(h);
    words[3 * j + 1] = static_cast<int64_t>(~h);
    words[3 * j + 2] = rank == 0 ? static_cast<int64_t>(bytes[j].size()) : 0;
  }
  // ~ reverses the order of int64 too, so MAX of ~h is ~(min of h): the
  // lists agree iff max(h) == min(h), which every rank reads alike.
  counted_allreduce(comm, Tensor(words.data(), DType::kInt64, Shape{static_cast<int64_t>(3 * k)}),
                    ReduceOp::kMax, context + " fingerprint");
  for (size_t j = 0; j < k; ++j) {
    if (words[3 * j] == ~words[3 * j + 1]) continue;
    const std::string what = context + " " + lists[j].noun + " list";
    const std::vector<std::string> ref =
        broadcast_items(comm, bytes[j], words[3 * j + 2], 0, what + " of rank 0");
    const bool differs = lists[j].items != ref;
    // MAX of (W - rank) << 40 | length over the ranks that differ: the
    // lowest such rank and its list's length (lists below 1 TiB, W below
    // 2^23).
    int64_t first = differs ? (static_cast<int64_t>(size - rank) << 40) |
                                  static_cast<int64_t>(bytes[j].size())
                            : 0;
    int64_t count = differs ? 1 : 0;
    counted_allreduce(comm, Tensor::of(&first, 1), ReduceOp::kMax, what + " first difference");
    counted_allreduce(comm, Tensor::of(&count, 1), ReduceOp::kSum, what + " differences");
    if (first == 0)  // equal lists with different hashes cannot happen
      TUTTI_THROW(kMismatch, context, ": ranks disagree: the ", lists[j].noun,
                  " lists hash differently but compare equal");
    const int r = size - static_cast<int>(first >> 40);
    const std::vector<std::string> theirs = broadcast_items(
        comm, bytes[j], first & ((int64_t{1} << 40) - 1), r, what + " of rank " + std::to_string(r));
    TUTTI_THROW(kMismatch, context, ": ranks disagree: ",
                describe_difference(lists[j].noun, r, theirs, ref, count));
  }
}

}  // namespace dp
}  // namespace tutti
