// Staging: the host mirror of a device request.
#include "comm/staged/staging.h"

#include <cstdint>
#include <utility>

#include "tutti/error.h"

namespace tutti {
namespace staged {
namespace {

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

// The same tensor on the host at `data`.
Tensor on_host(const Tensor& t, void* data) {
  return Tensor(t.nbytes() ? data : nullptr, t.dtype(), t.shape(), Device::cpu());
}

OpRequest host_copy(const OpRequest& r) {
  OpRequest h = r;
  h.options.stream = nullptr;
  return h;
}

}  // namespace

Staging::Staging(const OpRequest& r) : host_(host_copy(r)) {}

Staging::Staging(const OpRequest& r, int rank, std::shared_ptr<HostBufferPool> pool)
    : host_(host_copy(r)), pool_(std::move(pool)) {
  const CollectiveKind k = r.kind;
  if (k == CollectiveKind::kBarrier) return;
  const Tensor& in = r.input;
  const Tensor& out = r.output;
  // Layout: the output first; the input inside it where the device input
  // lies inside the device output (in place, or an all-gather's own
  // block), else after it.
  const auto in0 = reinterpret_cast<uintptr_t>(in.data());
  const auto out0 = reinterpret_cast<uintptr_t>(out.data());
  const bool inside = in.nbytes() == 0 ||
                      (out.nbytes() && in0 >= out0 && in0 + in.nbytes() <= out0 + out.nbytes());
  const size_t in_offset = inside ? (in.nbytes() ? in0 - out0 : 0) : align64(out.nbytes());
  const size_t total = inside ? out.nbytes() : in_offset + in.nbytes();
  if (total) buffer_ = pool_->acquire(total);
  char* base = static_cast<char*>(buffer_.data());
  host_.output = on_host(out, base);
  host_.input = on_host(in, base ? base + in_offset : nullptr);
  switch (k) {
    case CollectiveKind::kBroadcast:  // in place: the root sends, the others receive
      copy_in_ = rank == r.root;
      copy_out_ = rank != r.root;
      break;
    case CollectiveKind::kSend:
      copy_in_ = true;
      break;
    case CollectiveKind::kRecv:
      copy_out_ = true;
      break;
    default:  // all-reduce, all-gather(v), reduce-scatter, all-to-all
      copy_in_ = true;
      copy_out_ = true;
      break;
  }
}

Staging::~Staging() { release(); }

void Staging::release() {
  if (pool_ && buffer_.data()) pool_->release(std::move(buffer_));
  pool_ = nullptr;
}

void Staging::abandon() {
  if (buffer_.data()) (void)new HostBuffer(std::move(buffer_));  // leaked on purpose
  pool_ = nullptr;
}

void Staging::settle_after(const std::exception_ptr& error) {
  bool free = false;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    free = e.code() == ErrorCode::kInvalidArgument || e.code() == ErrorCode::kMismatch ||
           e.code() == ErrorCode::kAborted;
  } catch (...) {
  }
  if (free)
    release();
  else
    abandon();
}

}  // namespace staged
}  // namespace tutti
