// The registry of StreamCaches that tutti::shutdown() releases
// (core/stream_cache.h).
#include "core/stream_cache.h"

#include <algorithm>
#include <mutex>
#include <vector>

namespace tutti {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<StreamCacheBase*> caches;  // never destroyed (see the header)
};

Registry& registry() {
  static Registry* r = new Registry();  // outlives static destructors
  return *r;
}

}  // namespace

StreamCacheBase::StreamCacheBase() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.caches.push_back(this);
}

StreamCacheBase::~StreamCacheBase() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.caches.erase(std::remove(r.caches.begin(), r.caches.end(), this), r.caches.end());
}

void release_stream_caches() {
  // Under the registry's lock, so no cache is destroyed while released.
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (StreamCacheBase* c : r.caches) c->release_values();
}

}  // namespace tutti
