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
};

class NoticeSource {
 public:
  virtual ~NoticeSource() = default;
  virtual const char* name() const = 0;
  // Called from the polling thread only.  Never throws: a source that
  // cannot reach its endpoint reports kNone (and logs once).
  virtual Observation poll() = 0;
};

std::unique_ptr<NoticeSource> make_aws_source(const std::string& base_url, int timeout_ms);
std::unique_ptr<NoticeSource> make_gcp_source(const std::string& base_url, int timeout_ms);
std::unique_ptr<NoticeSource> make_azure_source(const std::string& base_url, int timeout_ms);
std::unique_ptr<NoticeSource> make_file_source(const std::string& path);

}  // namespace preempt
}  // namespace tutti
