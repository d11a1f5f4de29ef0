#include "comm/mpi/window_check.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "comm/counters.h"
#include "comm/fold.h"
#include "comm/rank_list.h"

namespace tutti {
namespace mpi {

using comm::counters::Protocol;

void WindowCheck::WordOps::combine(const void* second, void* first, size_t bytes) const {
  auto* a = static_cast<char*>(first);
  const auto* b = static_cast<const char*>(second);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    uint64_t x, y;
    std::memcpy(&x, a + i, 8);
    std::memcpy(&y, b + i, 8);
    x = max_ ? std::max(x, y) : std::min(x, y);
    std::memcpy(a + i, &x, 8);
  }
}

void WindowCheck::WordOps::size_differs(void* mine, size_t bytes) const {
  std::memset(mine, max_ ? 0xff : 0, bytes);
}

WindowCheck::WindowCheck(MPI_Comm check_comm, MPI_Comm detail_comm,
                         comm::OpWindowRecord window, const char* outcome)
    : detail_comm_(detail_comm), outcome_(outcome), window_(std::move(window)) {
  hash_ = window_.hash();
  if (!window_.invalid.empty()) hash_ ^= 0x5a5aull;  // a rejection always differs
  if (hash_ == 0 || hash_ == comm::kPoisonWord) hash_ = 1;
  post_ = ScheduleTags::next_post(check_comm);
  const size_t header = sizeof(comm::CheckHeader);
  reduce_.emplace(check_comm, post_, 0, header, header, max_, Protocol::kCheck);
  comm::CheckHeader h;
  h.f = hash_;
  h.not_f = ~hash_;
  std::memcpy(reduce_->frame(), &h, header);
  reduce_->start();
}

WindowCheck::~WindowCheck() = default;

std::string WindowCheck::range() const {
  if (window_.first_seq == window_.last_seq) return "";
  return detail::cat(" (the first that differed among #", window_.first_seq, "-#",
                     window_.last_seq, ", checked together: TUTTI_NCCL_CHECK_EVERY)");
}

bool WindowCheck::test(const comm::OpLabel& desc, bool* progressed) {
  const size_t n = window_.words.size();
  while (phase_ != kSettled) {
    if (phase_ == kGather) {
      if (!gather_->test(progressed)) return false;
      phase_ = kSettled;
      settle_mismatch(desc);
      return true;
    }
    if (!reduce_->test(progressed)) return false;
    if (phase_ == kHash) {
      comm::CheckHeader h;
      std::memcpy(&h, reduce_->result(), sizeof(h));
      if (h.f == hash_ && h.not_f == ~hash_) {
        phase_ = kSettled;
        reduce_.reset();
        return true;
      }
      // 2a: every operation's word and complement, MAX.
      const size_t bytes = 16 * n;
      reduce_.emplace(detail_comm_, post_, 1, bytes, bytes, max_, Protocol::kCheckDetail);
      auto* f = static_cast<uint64_t*>(reduce_->frame());
      for (size_t i = 0; i < n; ++i) {
        f[2 * i] = window_.words[i];
        f[2 * i + 1] = ~window_.words[i];
      }
      reduce_->start();
      phase_ = kWords;
    } else if (phase_ == kWords) {
      const auto* m = static_cast<const uint64_t*>(reduce_->result());
      uint64_t mine = n;
      for (size_t i = 0; i < n; ++i) {
        if (m[2 * i] != window_.words[i] || m[2 * i + 1] != ~window_.words[i]) {
          mine = i;
          break;
        }
      }
      // 2b: the first index any rank differs at.
      reduce_.emplace(detail_comm_, post_, 2, 8, 8, min_, Protocol::kCheckDetail);
      std::memcpy(reduce_->frame(), &mine, 8);
      reduce_->start();
      phase_ = kIndex;
    } else {  // kIndex
      uint64_t first = 0;
      std::memcpy(&first, reduce_->result(), 8);
      reduce_.reset();
      // Only the hash differed (a collision of every word is not possible:
      // equal words give equal hashes): report on the last operation.
      const size_t at = n == 0 ? 0 : std::min<size_t>(first, n - 1);
      first_diff_ = static_cast<int64_t>(at);
      if (n) record_.wire = window_.wires[at];
      record_.wire.pad = std::find(window_.invalid.begin(), window_.invalid.end(),
                                   static_cast<uint32_t>(at)) != window_.invalid.end();
      record_.ops = n;
      gather_.reset(new BruckAllgather(detail_comm_, post_, 3, &record_, sizeof(Record),
                                       Protocol::kCheckDetail));
      phase_ = kGather;
    }
  }
  return true;
}

void WindowCheck::settle_mismatch(const comm::OpLabel& desc) {
  int size = 0;
  TUTTI_MPI_CHECK(MPI_Comm_size(detail_comm_, &size), desc, " (agreement check)");
  const auto* records = static_cast<const Record*>(gather_->result());
  std::vector<comm::WireDesc> all(static_cast<size_t>(size));
  std::map<uint64_t, std::vector<int>> lengths;
  std::vector<int> invalid;
  for (int r = 0; r < size; ++r) {
    all[r] = records[r].wire;
    lengths[records[r].ops].push_back(r);
    if (all[r].pad) invalid.push_back(r);
  }
  if (lengths.size() > 1) {
    std::string who;
    for (const auto& l : lengths)
      who += detail::cat(who.empty() ? "" : "; ", comm::format_ranks(l.second, comm::report_max_ranks()), " checked ",
                         l.first, " operation", l.first == 1 ? "" : "s");
    TUTTI_THROW(kMismatch, desc, ": ranks checked different numbers of operations in the "
                "window ending here (", who, "; TUTTI_CHECK_COLLECTIVES and "
                "TUTTI_NCCL_CHECK_EVERY must be the same on every rank); ", outcome_);
  }
  if (!invalid.empty()) {
    if (!window_.invalid.empty()) return;  // the caller throws its own, precise error
    TUTTI_THROW(kMismatch, desc, ": ", comm::format_ranks(invalid, comm::report_max_ranks()), " rejected the arguments of ",
                comm::describe_wire(all[invalid[0]]), range(), " (see the error on ",
                invalid.size() > 1 ? "those ranks" : "that rank", "); ", outcome_);
  }
  const std::string differ = comm::mismatch_message(all);
  if (differ.empty())
    TUTTI_THROW(kInternal, desc, ": the window's agreement check disagreed but every rank "
                "has the same descriptor at its first differing operation #",
                all[0].seq);
  TUTTI_THROW(kMismatch, desc, ": ranks disagree on operation #", all[0].seq, range(), ": ",
              differ, "; ", outcome_);
}

bool WindowCheck::wait(const Deadline& deadline, const comm::OpLabel& desc,
                       StallWatch* stall) {
  return poll_until([&](bool* progressed) { return test(desc, progressed); },
                    deadline, stall);
}

}  // namespace mpi
}  // namespace tutti
