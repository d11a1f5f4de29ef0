#include "comm/mpi/agreement.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "core/cpu_reduce.h"

namespace tutti {
namespace mpi {

AgreementCheck::Ops::Ops(const comm::FoldPlan* fold) {
  if (fold) {
    combine_ = fold->combine;
    dtype_ = fold->dtype;
    op_ = fold->op;
  }
}

void AgreementCheck::Ops::combine(const void* second, void* first, size_t bytes) const {
  auto* a = static_cast<comm::CheckHeader*>(first);
  const auto* b = static_cast<const comm::CheckHeader*>(second);
  a->f = std::max(a->f, b->f);
  a->not_f = std::max(a->not_f, b->not_f);
  const size_t n = bytes - sizeof(comm::CheckHeader);
  if (n == 0) return;
  char* pa = static_cast<char*>(first) + sizeof(comm::CheckHeader);
  const char* pb = static_cast<const char*>(second) + sizeof(comm::CheckHeader);
  if (combine_ == comm::FoldCombine::kReduce) {
    reduce_inplace(dtype_, op_, pb, pa, n / dtype_size(dtype_));
    return;
  }
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x, y;
    std::memcpy(&x, pa + i, 8);
    std::memcpy(&y, pb + i, 8);
    x |= y;
    std::memcpy(pa + i, &x, 8);
  }
  for (; i < n; ++i) pa[i] = static_cast<char>(pa[i] | pb[i]);
}

void AgreementCheck::Ops::size_differs(void* mine, size_t) const {
  auto* h = static_cast<comm::CheckHeader*>(mine);
  h->f = h->not_f = comm::kPoisonWord;
}

AgreementCheck::AgreementCheck(MPI_Comm check_comm, MPI_Comm detail_comm,
                               const comm::WireDesc& wire, bool locally_invalid,
                               const char* outcome, bool serve_joined,
                               const comm::FoldPlan* fold, size_t fold_capacity,
                               bool compare, FrameScratch* scratch)
    : detail_comm_(detail_comm), locally_invalid_(locally_invalid),
      outcome_(outcome), serve_joined_(serve_joined),
      fold_(fold && fold->folds && !locally_invalid), compare_(compare),
      ops_(fold_ ? fold : nullptr) {
  record_.wire = wire;
  record_.wire.pad = locally_invalid ? 1 : 0;
  f_ = compare ? comm::check_word(record_.wire, locally_invalid) : 0;
  const size_t payload = fold_ ? fold->bytes : 0;
  const size_t header = sizeof(comm::CheckHeader);
  record_.frame_bytes = header + payload;
  post_ = ScheduleTags::next_post(check_comm);
  reduce_.emplace(
      check_comm, post_, 0, header + payload, header + std::max(fold_capacity, payload),
      ops_, fold_ ? comm::counters::Protocol::kFold : comm::counters::Protocol::kCheck,
      scratch);
  comm::CheckHeader h;
  h.f = f_;
  h.not_f = compare ? ~f_ : 0;
  char* frame = static_cast<char*>(reduce_->frame());
  std::memcpy(frame, &h, header);
  if (payload) comm::fill_payload(*fold, frame + header);
  reduce_->start();
}

AgreementCheck::~AgreementCheck() = default;

const void* AgreementCheck::payload() const {
  return static_cast<const char*>(reduce_->result()) + sizeof(comm::CheckHeader);
}

bool AgreementCheck::test(const comm::OpLabel& desc, bool* progressed) {
  if (phase_ == kSettled) return true;
  if (phase_ == kReduce) {
    if (!reduce_->test(progressed)) return false;
    comm::CheckHeader h;
    std::memcpy(&h, reduce_->result(), sizeof(h));
    const bool poisoned = h.f == comm::kPoisonWord && h.not_f == comm::kPoisonWord;
    if (compare_ ? h.f == f_ && h.not_f == ~f_ : !poisoned) {
      phase_ = kSettled;
      return true;
    }
    if (!compare_) {
      phase_ = kSettled;
      TUTTI_THROW(kMismatch, desc, ": ranks passed different sizes to this "
                  "operation (its data travels with the agreement check, and "
                  "a peer's frame was not ", record_.frame_bytes, " bytes like "
                  "this rank's); ", outcome_,
                  " (TUTTI_CHECK_COLLECTIVES=0: the check that would name the "
                  "ranks is off)");
    }
    gather_.reset(new BruckAllgather(detail_comm_, post_, 1, &record_, sizeof(Record),
                                     comm::counters::Protocol::kCheckDetail));
    phase_ = kGather;
  }
  if (!gather_->test(progressed)) return false;
  const auto* records = static_cast<const Record*>(gather_->result());
  int size = 0;
  TUTTI_MPI_CHECK(MPI_Comm_size(detail_comm_, &size), desc, " (agreement check)");
  all_.resize(static_cast<size_t>(size));
  frame_bytes_.resize(static_cast<size_t>(size));
  for (size_t i = 0; i < all_.size(); ++i) {
    all_[i] = records[i].wire;
    frame_bytes_[i] = records[i].frame_bytes;
  }
  phase_ = kSettled;
  settle_mismatch(desc);
  return true;
}

namespace {

// "rank 1 sent a frame of 1040 bytes but rank 0 sent one of 16 bytes" for ranks
// whose descriptors agree but whose frames differ (one folded the op, one
// did not: TUTTI_MPI_FOLD_BYTES differs).
std::string frame_size_message(const std::vector<uint64_t>& bytes) {
  std::map<uint64_t, std::vector<int>> groups;
  for (size_t r = 0; r < bytes.size(); ++r)
    groups[bytes[r]].push_back(static_cast<int>(r));
  if (groups.size() <= 1) return "";
  std::string out;
  for (const auto& g : groups) {
    if (g.first == bytes[0]) continue;
    std::string who;
    for (size_t i = 0; i < g.second.size() && i < 5; ++i)
      who += (i ? ", " : "") + std::to_string(g.second[i]);
    if (g.second.size() > 5) who += detail::cat(", ... (", g.second.size(), " ranks)");
    out += detail::cat(out.empty() ? "" : "; ", g.second.size() > 1 ? "ranks " : "rank ",
                       who, g.second.size() > 1 ? " sent frames of " : " sent a frame of ",
                       g.first, " bytes");
  }
  return detail::cat(out, " but rank 0 sent one of ", bytes[0], " bytes");
}

}  // namespace

void AgreementCheck::settle_mismatch(const comm::OpLabel& desc) {
  if (record_.wire.kind == comm::kJoinKind) return;  // the join loop decides
  std::vector<int> invalid;
  for (size_t i = 0; i < all_.size(); ++i)
    if (all_[i].pad) invalid.push_back(static_cast<int>(i));
  if (!invalid.empty()) {
    if (locally_invalid_) return;  // the caller throws its own, precise error
    std::string who;
    for (size_t i = 0; i < invalid.size(); ++i)
      who += (i ? ", " : "") + std::to_string(invalid[i]);
    TUTTI_THROW(kMismatch, desc, ": rank", invalid.size() > 1 ? "s " : " ", who,
                " rejected the arguments of this operation (see the error on ",
                invalid.size() > 1 ? "those ranks" : "that rank",
                "); ", outcome_);
  }
  if (serve_joined_) {
    // The same verdict the joined ranks reach from the same descriptors.
    const comm::JoinVerdict join = comm::join_verdict(all_);
    if (join.any_joined && join.runners_agree) {
      if (join.servable) return;  // the joined ranks take part
      TUTTI_THROW(kMismatch, desc, ": rank", join.joined.find(',') ==
                  std::string::npos ? " " : "s ", join.joined,
                  " called join() (out of data) and cannot take part: ",
                  join.refusal, "; ", outcome_);
    }
  }
  for (auto& d : all_) d.pad = 0;
  const std::string differ = comm::mismatch_message(all_);
  if (differ.empty()) {
    const std::string frames = frame_size_message(frame_bytes_);
    if (frames.empty())
      TUTTI_THROW(kInternal, desc, ": the agreement check disagreed but every rank "
                  "sent the same descriptor and frame size");
    TUTTI_THROW(kMismatch, desc, ": ranks agree on the operation but not on "
                "folding its data into the agreement check: ", frames,
                " (TUTTI_MPI_FOLD_BYTES must be the same on every rank); ", outcome_);
  }
  TUTTI_THROW(kMismatch, desc, ": ranks disagree on the operation: ", differ, "; ",
              outcome_);
}

bool AgreementCheck::wait(const Deadline& deadline, const comm::OpLabel& desc,
                          StallWatch* stall) {
  return poll_until([&](bool* progressed) { return test(desc, progressed); },
                    deadline, stall);
}

}  // namespace mpi
}  // namespace tutti
