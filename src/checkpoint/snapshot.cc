#include "checkpoint/snapshot.h"

#include <cstring>
#include <map>
#include <set>

#include "core/check.h"
#include "core/cuda_utils.h"

namespace tutti {
namespace ckpt {

#if TUTTI_WITH_CUDA
// One copy stream and one completion event per device touched.
struct SnapshotCopier::Cuda {
  struct PerDevice {
    std::unique_ptr<cuda::Stream> stream;
    std::unique_ptr<cuda::Event> ready;  // the user stream reached the save
    std::unique_ptr<cuda::Event> done;   // the copies finished
    bool active = false;
  };
  std::map<int, PerDevice> devices;
};
#else
struct SnapshotCopier::Cuda {};
#endif

SnapshotCopier::SnapshotCopier(void* user_stream)
    : cuda_(new Cuda()), user_stream_(user_stream) {}

SnapshotCopier::~SnapshotCopier() {
  try {
    wait();
  } catch (...) {
  }
}

void SnapshotCopier::copy(const Tensor& src, void* dst) {
  if (src.nbytes() == 0) return;
  if (!src.is_cuda()) {
    std::memcpy(dst, src.data(), src.nbytes());
    return;
  }
#if TUTTI_WITH_CUDA
  const int dev = src.device().index;
  cuda::DeviceGuard guard(dev);
  auto& d = cuda_->devices[dev];
  if (!d.stream) {
    d.stream = std::make_unique<cuda::Stream>(dev);
    d.ready = std::make_unique<cuda::Event>(dev);
    d.done = std::make_unique<cuda::Event>(dev);
  }
  auto user = static_cast<cudaStream_t>(user_stream_);
  if (!d.active) {
    // Order the copies after the work that produced the state.
    d.ready->record(user);
    TUTTI_CUDA_CHECK(cudaStreamWaitEvent(d.stream->get(), d.ready->get(), 0));
    d.active = true;
  }
  TUTTI_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.nbytes(),
                                   cudaMemcpyDeviceToHost, d.stream->get()));
#else
  TUTTI_THROW(kUnsupported, "tensor on ", src.device().str(),
              " reached a checkpoint, but this build of tutti has no CUDA support");
#endif
}

void SnapshotCopier::finish() {
#if TUTTI_WITH_CUDA
  for (auto& kv : cuda_->devices) {
    auto& d = kv.second;
    if (!d.active) continue;
    cuda::DeviceGuard guard(kv.first);
    d.done->record(d.stream->get());
    // Later work on the user's stream (an optimizer step overwriting the
    // parameters) runs after the copies, without blocking the host.
    TUTTI_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(user_stream_),
                                         d.done->get(), 0));
  }
#endif
}

void SnapshotCopier::wait() {
#if TUTTI_WITH_CUDA
  for (auto& kv : cuda_->devices) {
    auto& d = kv.second;
    if (!d.active) continue;
    d.active = false;
    cuda::DeviceGuard guard(kv.first);
    TUTTI_CUDA_CHECK(cudaEventSynchronize(d.done->get()));
  }
#endif
}

StateDict flatten_components(
    const std::vector<std::pair<std::string, Stateful*>>& components) {
  StateDict out;
  std::set<std::string> seen;
  for (const auto& c : components) {
    TUTTI_ARG_CHECK(c.second != nullptr, "checkpoint component '", c.first,
                    "' is a null Stateful*");
    TUTTI_ARG_CHECK(!c.first.empty() && c.first.find('/') == std::string::npos,
                    "checkpoint component name '", c.first,
                    "' must be non-empty and contain no '/'");
    TUTTI_ARG_CHECK(seen.insert(c.first).second, "checkpoint component '", c.first,
                    "' is listed twice");
    for (auto& t : c.second->state_dict()) {
      t.name = c.first + "/" + t.name;
      out.push_back(std::move(t));
    }
  }
  return out;
}

std::vector<Placement> describe_state(const StateDict& state, int64_t step) {
  std::vector<Placement> out;
  out.reserve(state.size());
  std::set<std::string> names;
  for (const auto& nt : state) {
    const std::string what = detail::cat("checkpoint step ", step, ": tensor '",
                                         nt.name);
    TUTTI_ARG_CHECK(!nt.name.empty() && nt.name != "__metadata__", what,
                    "': invalid tensor name");
    TUTTI_ARG_CHECK(names.insert(nt.name).second, what,
                    "' appears twice in the state (names must be unique)");
    TUTTI_ARG_CHECK(nt.tensor.defined(), what, "' has no memory");
    if (nt.tensor.is_cuda() && !cuda_built())
      TUTTI_THROW(kUnsupported, what, "' is on ", nt.tensor.device().str(),
                  " but this build of tutti has no CUDA support");
    out.push_back(make_placement(nt.tensor.shape().vec(), nt.shard,
                                 ErrorCode::kInvalidArgument, what));
  }
  return out;
}

std::vector<WriteItem> write_everything(const StateDict& state,
                                        const std::vector<Placement>& placements) {
  std::vector<WriteItem> items(state.size());
  for (size_t i = 0; i < state.size(); ++i) {
    items[i].src = i;
    items[i].count = static_cast<uint64_t>(state[i].tensor.numel());
    items[i].placement = placements[i];
  }
  return items;
}

Snapshot take_snapshot(const StateDict& state, const std::vector<WriteItem>& items,
                       HostBufferPool& pool, SnapshotCopier& copier) {
  Snapshot s;
  uint64_t offset = 0;
  for (const WriteItem& it : items) {
    const NamedTensor& nt = state[it.src];
    SnapshotTensor t;
    t.name = nt.name;
    t.dtype = nt.tensor.dtype();
    t.placement = it.placement;
    t.group = nt.shard.group;
    t.offset = offset;
    t.bytes = it.count * nt.tensor.element_size();
    offset += t.bytes;
    s.tensors.push_back(std::move(t));
  }
  s.total = offset;
  s.buffer = pool.acquire(static_cast<size_t>(offset) + kSnapshotAlign);
  const auto addr = reinterpret_cast<uintptr_t>(s.buffer.data());
  s.pad = static_cast<size_t>((kSnapshotAlign - addr % kSnapshotAlign) % kSnapshotAlign);
  unsigned char* base = s.buffer.as<unsigned char>() + s.pad;
  for (size_t i = 0; i < items.size(); ++i) {
    const WriteItem& it = items[i];
    const Tensor& src = state[it.src].tensor;
    const Tensor piece = it.first == 0 && it.count == static_cast<uint64_t>(src.numel())
                             ? src
                             : src.flatten().slice(static_cast<int64_t>(it.first),
                                                   static_cast<int64_t>(it.first + it.count));
    copier.copy(piece, base + s.tensors[i].offset);
  }
  copier.finish();
  return s;
}

}  // namespace ckpt
}  // namespace tutti
