// One way of learning that the machine is going away.  Each polled source
// (a cloud metadata endpoint, the trigger file) implements NoticeSource; the
// monitor's thread polls them.  Signals are not polled: their handler sets
// a flag (signal_source.h).
#pragma once

#include <memory>
#include <string>

#include "tutti/preemption.h"

namespace tutti {
namespace preempt {

struct Observation {
  NoticeKind kind = NoticeKind::kNone;
  std::string detail;
  // > 0: wait this long before the next poll (a throttled endpoint).
  int retry_after_ms = 0;
};

class NoticeSource {
 public:
  virtual ~NoticeSource() = default;
  virtual const char* name() const = 0;
  // Called from this source's polling thread only (each source has its
  // own: a hanging endpoint never delays another source).  A source that
  // cannot reach its endpoint, or gets an answer it cannot read, reports
  // kNone and logs once.  The monitor also catches anything a poll throws
  // (logged once per source, treated as no notice), so a malformed answer
  // can never end the process.
  virtual Observation poll() = 0;
};

std::unique_ptr<NoticeSource> make_aws_source(const std::string& base_url, int timeout_ms);
std::unique_ptr<NoticeSource> make_gcp_source(const std::string& base_url, int timeout_ms);
std::unique_ptr<NoticeSource> make_azure_source(const std::string& base_url, int timeout_ms);
std::unique_ptr<NoticeSource> make_file_source(const std::string& path);

// One poller per node for a metadata source (node_shared_source.cc): the
// rank holding <dir>'s per-endpoint flock polls `url` through `inner` and
// publishes what it saw; the other ranks of the node read that.  `dir`
// empty or "none": `inner` itself (every rank polls).
std::unique_ptr<NoticeSource> make_node_shared(std::unique_ptr<NoticeSource> inner,
                                               const std::string& dir, const std::string& url,
                                               int poll_ms);

}  // namespace preempt
}  // namespace tutti
