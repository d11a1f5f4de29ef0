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
// Release at shutdown: every cache registers itself, and
// release_stream_caches() (tutti::shutdown(), after the communicators
// closed) frees every entry's value, so the device memory and library
// handles they hold (cuBLAS workspaces) are returned before the process ends
// and a leak checker (compute-sanitizer --leak-check full) sees none.  The
// entries stay; a get() after that (a later init()) builds the value anew.
// Nothing may use a cache while it is released.
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

class StreamCacheBase {
 public:
  StreamCacheBase();  // registers the cache for release_stream_caches()
  virtual ~StreamCacheBase();  // unregisters it
  StreamCacheBase(const StreamCacheBase&) = delete;
  StreamCacheBase& operator=(const StreamCacheBase&) = delete;
  // Frees every entry's value (under the entry's mutex).
  virtual void release_values() = 0;
};

// Frees the values of every StreamCache created so far (see above).
void release_stream_caches();

template <typename T>
class StreamCache : public StreamCacheBase {
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
    if (it != entries_.end()) {
      if (!it->second->value) {  // released at a shutdown: build it again
        std::lock_guard<std::mutex> entry_lock(it->second->mu);
        it->second->value = make();
      }
      return *it->second;
    }
    auto entry = std::make_unique<Entry>();
    entry->value = make();
    Entry& ref = *entry;
    entries_.emplace(key, std::move(entry));
    return ref;
  }

  void release_values() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& kv : entries_) {
      std::lock_guard<std::mutex> entry_lock(kv.second->mu);
      kv.second->value.reset();
    }
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
