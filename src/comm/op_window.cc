#include "comm/op_window.h"

#include <algorithm>

#include "comm/fold.h"
#include "core/check.h"

namespace tutti {
namespace comm {

uint64_t OpWindowRecord::hash() const {
  // FNV-1a over the words, then a final avalanche; collisions only delay a
  // diagnostic to the next window (the words differ at the same index).
  uint64_t h = 0xcbf29ce484222325ull ^ (last_seq - first_seq);
  for (uint64_t w : words) {
    for (int b = 0; b < 64; b += 8) h = (h ^ ((w >> b) & 0xff)) * 0x100000001b3ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  if (h == 0 || h == kPoisonWord) h = 1;
  return h;
}

OpWindow::OpWindow(int every) : every_(every) {
  TUTTI_ARG_CHECK(every >= 1, "a window of operations checked together needs at "
                  "least 1 operation (TUTTI_NCCL_CHECK_EVERY), got ", every);
}

uint64_t OpWindow::window_end(uint64_t seq, int every) {
  if (seq <= 2) return seq == 0 ? 1 : seq;
  const uint64_t k = static_cast<uint64_t>(std::max(every, 1));
  uint64_t end = 2, size = 1;
  while (size < k) {  // the ramp: 2, 4, 8, ... capped at k
    size = std::min(size * 2, k);
    end += size;
    if (seq <= end) return end;
  }
  return end + k * ((seq - end + k - 1) / k);
}

bool OpWindow::add(uint64_t seq, const WireDesc& wire, bool locally_invalid,
                   OpWindowRecord* out) {
  if (open_.words.empty()) {
    open_.first_seq = seq;
    if (end_ < seq) end_ = window_end(seq, every_);
  }
  if (locally_invalid) open_.invalid.push_back(static_cast<uint32_t>(open_.words.size()));
  open_.words.push_back(check_word(wire, locally_invalid));
  open_.wires.push_back(wire);
  open_.last_seq = seq;
  if (seq < end_) return false;
  *out = std::move(open_);
  open_ = OpWindowRecord();
  open_.words.reserve(static_cast<size_t>(every_));
  open_.wires.reserve(static_cast<size_t>(every_));
  end_ = window_end(seq + 1, every_);
  return true;
}

}  // namespace comm
}  // namespace tutti
