#include "data_parallel/list_agreement.h"

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

// The message for the first rank whose list differs from rank 0's.
std::string describe_difference(const char* noun,
                                const std::vector<std::vector<std::string>>& all) {
  const auto& ref = all[0];
  int differing = 0;
  std::string first;
  for (size_t r = 1; r < all.size(); ++r) {
    const auto& mine = all[r];
    if (mine == ref) continue;
    ++differing;
    if (!first.empty()) continue;
    size_t i = 0;
    while (i < mine.size() && i < ref.size() && mine[i] == ref[i]) ++i;
    const std::string who = "rank " + std::to_string(r);
    if (i < mine.size() && i < ref.size()) {
      first = detail::cat(who, "'s ", noun, " #", i, " is ", mine[i],
                          ", but rank 0's is ", ref[i]);
    } else if (i < ref.size()) {
      first = detail::cat(who, " has ", mine.size(), " ", noun, "s and rank 0 has ",
                          ref.size(), ": rank 0's ", noun, " #", i, " ", ref[i],
                          " is missing on ", who);
    } else {
      first = detail::cat(who, " has ", mine.size(), " ", noun, "s and rank 0 has ",
                          ref.size(), ": ", who, "'s ", noun, " #", i, " ",
                          mine[i], " is not on rank 0");
    }
  }
  if (differing > 1)
    first += detail::cat(" (", differing, " ranks differ from rank 0)");
  return first;
}

}  // namespace

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
  const int size = comm.size();
  if (size <= 1 || lists.empty()) return;
  const size_t k = lists.size();
  std::vector<uint64_t> mine(k), all(k * static_cast<size_t>(size));
  for (size_t j = 0; j < k; ++j) mine[j] = hash_items(lists[j].items);
  OpOptions o;
  o.name = context + " fingerprint";
  // uint64 hashes travel as int64 (the same bits; only equality matters).
  comm.allgather(Tensor(mine.data(), DType::kInt64, Shape{static_cast<int64_t>(k)}),
                 Tensor(all.data(), DType::kInt64, Shape{static_cast<int64_t>(all.size())}), o);
  for (size_t j = 0; j < k; ++j) {
    bool same = true;
    for (int r = 1; r < size; ++r)
      same = same && all[static_cast<size_t>(r) * k + j] == all[j];
    if (same) continue;
    // Every rank saw the same hashes: all exchange list j in full.
    const std::vector<uint8_t> bytes = serialize(lists[j].items);
    int64_t n = static_cast<int64_t>(bytes.size());
    std::vector<int64_t> counts(static_cast<size_t>(size));
    o.name = context + " " + lists[j].noun + " list length";
    comm.allgather(Tensor::of(&n, 1), Tensor::of(counts), o);
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    std::vector<uint8_t> gathered(static_cast<size_t>(total));
    o.name = context + " " + lists[j].noun + " list";
    comm.allgatherv(Tensor(const_cast<uint8_t*>(bytes.data()), DType::kUInt8, Shape{n}),
                    Tensor(gathered.data(), DType::kUInt8, Shape{total}), counts, o);
    std::vector<std::vector<std::string>> lists_by_rank;
    int64_t at = 0;
    for (int r = 0; r < size; ++r) {
      lists_by_rank.push_back(deserialize(gathered.data() + at,
                                          static_cast<size_t>(counts[static_cast<size_t>(r)])));
      at += counts[static_cast<size_t>(r)];
    }
    std::string diff = describe_difference(lists[j].noun, lists_by_rank);
    if (diff.empty())  // equal lists with different hashes cannot happen
      diff = "the lists hash differently but compare equal";
    TUTTI_THROW(kMismatch, context, ": ranks disagree: ", diff);
  }
}

}  // namespace dp
}  // namespace tutti
