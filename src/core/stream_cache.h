// Per-(device, stream) objects created on first use and kept for the
// process: cuBLAS handles with their workspaces (core/cuda_gemm.cc), the
// tensor-parallel reduction scratch (tensor_parallel/ops.cc).
//
// Why per stream: memory a kernel uses as scratch is safe to reuse by later
// work on the same stream (stream order), never by work on another stream
// that may run at the same time.  A cache keyed by (device, stream) gives
// each stream its own copy without the callers passing one around.
//
// Thread safety: get() may be called from any thread.  The entry it returns
// stays at the same address for the cache's lifetime (entries are never
// erased); it carries its own mutex, which callers hold while they bind
// per-call state into the entry (cublasSetStream, host staging), so two
// threads that share a stream serialise on that entry only.
//
// A stream's entry outlives the stream: if the runtime hands a later stream
// the same address, that stream inherits the entry, which is safe once the
// old stream's work finished (destroy a stream only after synchronising it).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace tutti {

template <typename T>
class StreamCache {
 public:
  struct Entry {
    std::mutex mu;  // held by callers while they use `value`
    std::unique_ptr<T> value;
  };

  // The entry of (device, stream); `make` builds its value on first use
  // (under the cache's lock, so each value is built once; it may throw, in
  // which case nothing is cached and the next get() tries again).
  Entry& get(int device, const void* stream,
             const std::function<std::unique_ptr<T>()>& make) {
    const Key key{device, reinterpret_cast<uintptr_t>(stream)};
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) return *it->second;
    auto entry = std::make_unique<Entry>();
    entry->value = make();
    Entry& ref = *entry;
    entries_.emplace(key, std::move(entry));
    return ref;
  }

  // Entries created so far (tests).
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_.size();
  }

 private:
  using Key = std::pair<int, uintptr_t>;
  mutable std::mutex mu_;
  std::map<Key, std::unique_ptr<Entry>> entries_;
};

}  // namespace tutti
