#include "comm/mpi/log_coll.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "comm/mpi/mpi_runtime.h"
#include "comm/mpi/ulfm.h"

namespace tutti {
namespace mpi {
namespace {

constexpr int kTagsPerPost = ScheduleTags::kSteps * ScheduleTags::kRoundsPerStep;

struct PostCounter {
  uint64_t next = 0;
};

int delete_counter(MPI_Comm, int, void* value, void*) {
  delete static_cast<PostCounter*>(value);
  return MPI_SUCCESS;
}

std::mutex g_keyval_mu;
int g_keyval = MPI_KEYVAL_INVALID;
uint64_t g_posts_mod = 0;  // distinct post indices the tag space holds

// The keyval (created on first use, after MPI_Init) and the tag space.
int keyval() {
  std::lock_guard<std::mutex> lock(g_keyval_mu);
  if (g_keyval == MPI_KEYVAL_INVALID) {
    TUTTI_MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_counter,
                                           &g_keyval, nullptr),
                    "creating the post counter of tutti's schedules");
    int* ub = nullptr;
    int flag = 0;
    TUTTI_MPI_CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag),
                    "asking MPI for its largest tag");
    const int64_t tag_ub = flag && ub ? *ub : 32767;
    g_posts_mod = static_cast<uint64_t>((tag_ub + 1) / kTagsPerPost);
  }
  return g_keyval;
}

// Frame buffers kept for reuse, so that a schedule in steady state (one
// per host op) allocates no buffer: at most kPoolBlocks blocks, the
// smallest that fits is taken (never one more than twice the size asked,
// so that small frames do not use up the large blocks).  A schedule abandoned in flight keeps its
// blocks (MPI may still write them).
constexpr size_t kPoolBlocks = 32;
std::mutex g_pool_mu;
std::vector<std::pair<char*, size_t>>& pool() {
  static auto* blocks = new std::vector<std::pair<char*, size_t>>();  // never freed
  return *blocks;
}

char* take_block(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  {
    std::lock_guard<std::mutex> lock(g_pool_mu);
    auto& blocks = pool();
    size_t best = blocks.size();
    for (size_t i = 0; i < blocks.size(); ++i)
      if (blocks[i].second >= bytes && blocks[i].second / 2 <= bytes &&
          (best == blocks.size() || blocks[i].second < blocks[best].second))
        best = i;
    if (best < blocks.size()) {
      char* p = blocks[best].first;
      blocks[best] = blocks.back();
      blocks.pop_back();
      return p;
    }
  }
  // The block's size is kept in front of it.
  char* raw = new char[bytes + sizeof(size_t)];
  std::memcpy(raw, &bytes, sizeof(size_t));
  return raw + sizeof(size_t);
}

void give_block(char* p) {
  size_t bytes = 0;
  std::memcpy(&bytes, p - sizeof(size_t), sizeof(size_t));
  {
    std::lock_guard<std::mutex> lock(g_pool_mu);
    auto& blocks = pool();
    if (blocks.size() < kPoolBlocks) {
      if (blocks.capacity() < kPoolBlocks) blocks.reserve(kPoolBlocks);
      blocks.emplace_back(p, bytes);
      return;
    }
  }
  delete[] (p - sizeof(size_t));
}

}  // namespace

uint64_t ScheduleTags::next_post(MPI_Comm comm) {
  const int kv = keyval();
  PostCounter* counter = nullptr;
  int flag = 0;
  TUTTI_MPI_CHECK(MPI_Comm_get_attr(comm, kv, &counter, &flag),
                  "reading the post counter of tutti's schedules");
  if (!flag) {
    counter = new PostCounter();
    const int rc = MPI_Comm_set_attr(comm, kv, counter);
    if (rc != MPI_SUCCESS) {
      delete counter;
      throw_mpi_error(rc, "MPI_Comm_set_attr", "keeping the post counter of tutti's schedules",
                      __FILE__, __LINE__);
    }
  }
  return counter->next++;
}

int ScheduleTags::tag(uint64_t post, int step, int round) {
  static const uint64_t posts_mod = (keyval(), g_posts_mod);
  return static_cast<int>((post % posts_mod) * kTagsPerPost) +
         step * kRoundsPerStep + round;
}

int ceil_log2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

Schedule::Schedule(MPI_Comm comm, uint64_t post, int step,
                   comm::counters::Protocol protocol)
    : comm_(comm), post_(post), step_(step), protocol_(protocol) {
  TUTTI_MPI_CHECK(MPI_Comm_rank(comm_, &rank_), "starting a tutti schedule");
  TUTTI_MPI_CHECK(MPI_Comm_size(comm_, &size_), "starting a tutti schedule");
  comm::counters::add_call(protocol_);
}

Schedule::~Schedule() = default;

int Schedule::pending(MPI_Request* out) const {
  int n = 0;
  for (int i = 0; i < nreqs_; ++i)
    if (reqs_[i] != MPI_REQUEST_NULL) out[n++] = reqs_[i];
  return n;
}

void Schedule::post(int round, int from, void* recv, size_t recv_bytes, int to,
                    const void* send, size_t send_bytes) {
  const int tag = ScheduleTags::tag(post_, step_, round);
  nreqs_ = 0;
  has_recv_ = from >= 0;
  if (from >= 0)
    TUTTI_MPI_CHECK(MPI_Irecv(recv, static_cast<int>(recv_bytes), MPI_BYTE, from,
                              tag, comm_, &reqs_[nreqs_++]),
                    "round ", round, " of a tutti schedule (receiving from rank ", from, ")");
  if (to >= 0) {
    TUTTI_MPI_CHECK(MPI_Isend(send, static_cast<int>(send_bytes), MPI_BYTE, to, tag,
                              comm_, &reqs_[nreqs_++]),
                    "round ", round, " of a tutti schedule (sending to rank ", to, ")");
    comm::counters::add_message(protocol_, send_bytes);
  }
}

bool Schedule::test(bool* progressed) {
  while (!done_) {
    int flag = 0;
    MPI_Status st[2];
    const int rc = MPI_Testall(nreqs_, reqs_, &flag, st);
    int64_t received = 0;
    if (rc == MPI_ERR_IN_STATUS) {
      // A frame larger than the receive buffer (MPI_ERR_TRUNCATE on the
      // receive, request 0): the peer's frame has another size, which the
      // subclass reports.  Any other error in a status is MPI failing; a
      // dead peer (ULFM) is raised before the rest, so that the survivors
      // recover (the other request may read MPI_ERR_PENDING, or a send-only
      // round's status hold the failure: MPI_ERR_IN_STATUS itself is no
      // ULFM code, and raised as such ended an in-process recovery).
      int error = MPI_SUCCESS;
      for (int i = 0; i < nreqs_; ++i) {
        const int code = st[i].MPI_ERROR;
        if (code == MPI_SUCCESS) continue;
        int cls = code;
        MPI_Error_class(code, &cls);
        if (has_recv_ && i == 0 && cls == MPI_ERR_TRUNCATE) {
          received = -1;
          continue;
        }
        if (error == MPI_SUCCESS || ulfm::is_failure(code)) error = code;
      }
      if (error != MPI_SUCCESS)
        throw_mpi_error(error, "MPI_Testall", "a round of a tutti schedule", __FILE__, __LINE__);
      flag = 1;
    } else if (rc != MPI_SUCCESS) {
      throw_mpi_error(rc, "MPI_Testall", "a round of a tutti schedule", __FILE__, __LINE__);
    }
    if (!flag) return false;
    if (has_recv_ && received == 0) {
      int count = 0;
      TUTTI_MPI_CHECK(MPI_Get_count(&st[0], MPI_BYTE, &count), "a round of a tutti schedule");
      received = count;
    }
    nreqs_ = 0;
    ++rounds_done_;
    comm::counters::add_round(protocol_);
    if (progressed) *progressed = true;
    advance(received);
  }
  return true;
}

// ---- recursive doubling

FrameScratch::~FrameScratch() {
  delete[] buf[0];
  delete[] buf[1];
}

RdAllreduce::RdAllreduce(MPI_Comm comm, uint64_t post, int step, size_t bytes,
                         size_t capacity, const FrameOps& ops,
                         comm::counters::Protocol protocol, FrameScratch* scratch)
    : Schedule(comm, post, step, protocol), bytes_(bytes),
      capacity_(std::max(bytes, capacity)), ops_(ops), scratch_(scratch) {
  if (scratch_) {
    if (scratch_->capacity < capacity_ || !scratch_->buf[0]) {
      delete[] scratch_->buf[0];
      delete[] scratch_->buf[1];
      scratch_->buf[0] = scratch_->buf[1] = nullptr;
      scratch_->capacity = 0;
      scratch_->buf[0] = new char[std::max<size_t>(capacity_, 1)];
      scratch_->buf[1] = new char[std::max<size_t>(capacity_, 1)];
      scratch_->capacity = capacity_;
    }
    mine_ = scratch_->buf[0];
    other_ = scratch_->buf[1];
  } else {
    // Pool blocks: MPI may still write them after a timeout (in_flight()).
    mine_ = take_block(capacity_);
    other_ = take_block(capacity_);
  }
  while (pof2_ * 2 <= size_) pof2_ *= 2;
  extra_ = size_ - pof2_;
  if (rank_ < 2 * extra_)
    vrank_ = rank_ % 2 ? rank_ / 2 : -1;
  else
    vrank_ = rank_ - extra_;
  stages_ = ceil_log2(pof2_) + 2;
  stage_ = rank_ < 2 * extra_ ? 0 : 1;
}

void RdAllreduce::start() {
  if (size_ == 1) {
    done_ = true;
    return;
  }
  start_round();
}

RdAllreduce::~RdAllreduce() {
  if (scratch_) {
    if (in_flight()) {  // MPI keeps the buffers
      scratch_->buf[0] = scratch_->buf[1] = nullptr;
      scratch_->capacity = 0;
    }
    return;
  }
  if (!in_flight()) {
    give_block(mine_);
    give_block(other_);
  }
}

void RdAllreduce::start_round() {
  const int last = stages_ - 1;
  if (stage_ == 0) {
    // Fold in: the even rank hands its frame to the odd one.
    if (vrank_ < 0)
      post(0, -1, nullptr, 0, rank_ + 1, mine_, bytes_);
    else
      post(0, rank_ - 1, other_, capacity_, -1, nullptr, 0);
    return;
  }
  if (stage_ == last) {
    // Fold out: the odd rank returns the result.
    if (vrank_ < 0)
      post(last, rank_ + 1, other_, capacity_, -1, nullptr, 0);
    else
      post(last, -1, nullptr, 0, rank_ - 1, mine_, bytes_);
    return;
  }
  const int partner = real_rank(vrank_ ^ (1 << (stage_ - 1)));
  post(stage_, partner, other_, capacity_, partner, mine_, bytes_);
}

void RdAllreduce::advance(int64_t received) {
  const int last = stages_ - 1;
  const bool got_frame = !(stage_ == 0 && vrank_ < 0) && !(stage_ == last && vrank_ >= 0);
  if (got_frame) {
    const bool same = received == static_cast<int64_t>(bytes_);
    if (stage_ == last) {
      // The result itself.
      if (same)
        std::swap(mine_, other_);
      else
        ops_.size_differs(mine_, bytes_);
    } else if (!same) {
      ops_.size_differs(mine_, bytes_);
    } else {
      // The peer's frame is the lower operand when the peer ranks lower.
      const int peer = stage_ == 0 ? rank_ - 1
                                   : real_rank(vrank_ ^ (1 << (stage_ - 1)));
      if (peer < rank_) {
        ops_.combine(mine_, other_, bytes_);
        std::swap(mine_, other_);
      } else {
        ops_.combine(other_, mine_, bytes_);
      }
    }
  }
  // Next stage this rank takes part in.
  if (stage_ == last) {
    done_ = true;
    return;
  }
  if (vrank_ < 0) {
    stage_ = last;  // the even rank waits for the result
  } else {
    ++stage_;
    if (stage_ == last && rank_ >= 2 * extra_) {
      done_ = true;
      return;
    }
  }
  start_round();
}

// ---- Bruck

BruckAllgather::BruckAllgather(MPI_Comm comm, uint64_t post, int step,
                               const void* block, size_t block_bytes,
                               comm::counters::Protocol protocol)
    : Schedule(comm, post, step, protocol), block_(block_bytes) {
  rounds_ = ceil_log2(size_);
  const size_t total = block_ * static_cast<size_t>(size_);
  tmp_ = take_block(total);
  if (block_) std::memcpy(tmp_, block, block_);
  if (size_ == 1) {
    out_.assign(tmp_, tmp_ + total);
    done_ = true;
    return;
  }
  start_round();
}

BruckAllgather::~BruckAllgather() {
  if (!in_flight()) give_block(tmp_);
}

void BruckAllgather::start_round() {
  const int d = 1 << round_;
  const int n = std::min(d, size_ - d);
  const size_t bytes = block_ * static_cast<size_t>(n);
  post(round_, (rank_ + d) % size_, tmp_ + block_ * static_cast<size_t>(d), bytes,
       (rank_ - d + size_) % size_, tmp_, bytes);
}

void BruckAllgather::advance(int64_t received) {
  const int d = 1 << round_;
  const int64_t expected =
      static_cast<int64_t>(block_) * std::min(d, size_ - d);
  if (received != expected)
    TUTTI_THROW(kInternal, "Bruck all-gather round ", round_, ": received ", received,
                " bytes, expected ", expected, " (every rank gathers blocks of ", block_,
                " bytes)");
  if (++round_ < rounds_) {
    start_round();
    return;
  }
  // tmp_ holds ranks rank, rank+1, ...: rotate into rank order.
  out_.resize(block_ * static_cast<size_t>(size_));
  for (int i = 0; i < size_; ++i)
    if (block_)
      std::memcpy(out_.data() + block_ * static_cast<size_t>((rank_ + i) % size_),
                  tmp_ + block_ * static_cast<size_t>(i), block_);
  done_ = true;
}

}  // namespace mpi
}  // namespace tutti
