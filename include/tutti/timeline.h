// The timeline: a Chrome / Perfetto trace of what this rank did.
//
// TUTTI_TIMELINE=path starts it at tutti::init() (docs/timeline.md); these
// functions start and stop it by hand (Horovod's hvd.start_timeline) and
// let an application put its own phases (forward, backward, optimizer) on
// the "compute" track beside tutti's collectives, buckets and checkpoints.
// Everything here is cheap when no timeline is recording (one relaxed
// atomic load) and never throws from the recording calls.
#pragma once

#include <cstdint>
#include <string>

#include "tutti/export.h"

namespace tutti {
namespace timeline {

// Starts recording this rank's trace into the file `path` resolves to
// (docs/timeline.md: "<path>.rank<R>.json", or "<dir>/rank<R>.json" when
// path is a directory or ends with '/').  R is the world rank when tutti is
// initialised, else 0.  Throws Error(kInvalidArgument) when a timeline is
// already recording, Error(kIo) when the file cannot be created.
TUTTI_API void start(const std::string& path);
// Flushes and closes the trace (the file is then a complete JSON array).
// Idempotent; tutti::shutdown() and exit_preempted() call it.
TUTTI_API void stop();
// True while a timeline records.
TUTTI_API bool active();
// The file being written ("" when none).
TUTTI_API std::string file();
// An instant event named `name` on the compute track.
TUTTI_API void mark(const std::string& name);
// Opens / closes a span on the compute track (B/E events; spans nest, and
// end() closes the innermost one this thread opened).
TUTTI_API void begin(const std::string& name);
TUTTI_API void end();

// A span on the compute track for the lifetime of the object.
class Range {
 public:
  explicit Range(const char* name) : on_(active()) {
    if (on_) begin(name);
  }
  ~Range() {
    if (on_) end();
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  bool on_;
};

}  // namespace timeline
}  // namespace tutti
