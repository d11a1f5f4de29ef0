// The timeline recorder's internal side: what the library's hooks call.
//
// A hook is one line that costs one relaxed atomic load when no timeline
// records:
//   TUTTI_TIMELINE(bucket_launch(index, bytes));
//   TUTTI_TIMELINE_SCOPE(scope, timeline::kCheckpoint, "checkpoint", "snapshot");
// Recording appends a fixed-size event to the calling thread's buffer (a
// mutex only the background writer ever contends for); the writer formats
// and appends them to the file every 100 ms.  A thread's buffer holds at
// most kMaxPending events between two flushes; beyond that events are
// dropped and counted (the final metadata reports the count), so memory is
// bounded whatever the event rate.
//
// The file is a JSON array of trace events written without its closing
// bracket until stop(): Chrome and Perfetto accept an unterminated array, so
// a rank killed mid-run (SIGKILL) leaves a loadable trace up to its last
// flush.  Timestamps are microseconds since this rank's anchor; the anchor's
// wall-clock time is in the first event's args (scripts/timeline_merge.py
// aligns the ranks with it).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "tutti/timeline.h"

namespace tutti {
namespace timeline {

namespace detail {
extern std::atomic<bool> g_on;
}
// The one load a hook costs when off.
inline bool on() { return detail::g_on.load(std::memory_order_relaxed); }

// Tracks (trace "threads") of a rank.  Collectives go on one track per
// process group, buckets on one track each.
enum Track : int {
  kCompute = 1,          // the application's phases (timeline::begin/end)
  kFramework = 8,        // reducer calls made on the training thread
  kCompression = 9,      // encode / decode
  kAmp = 10,             // loss-scale updates and skipped steps
  kCheckpoint = 11,      // snapshot and commit (the training thread)
  kCheckpointWriter = 12,// persist (the asynchronous writer)
  kPreemption = 13,      // notices, restarts
  kGroupBase = 20,       // + the group's index: its collectives
  kBucketBase = 100,     // + the bucket index: fill and communication
  kExtraComputeBase = 2000,  // + k: the compute track of the k-th other thread
};
constexpr int kMaxGroups = 64;
constexpr int kMaxBuckets = 1024;
constexpr size_t kMaxPending = 1 << 14;

// Steady-clock nanoseconds (the recorder's clock).
int64_t now_ns();

// A few JSON args, built in a fixed buffer (no allocation).
class Args {
 public:
  Args() { buf_[0] = '\0'; }
  Args& i(const char* key, int64_t v);
  Args& d(const char* key, double v);
  Args& s(const char* key, const char* v);
  Args& s(const char* key, const std::string& v) { return s(key, v.c_str()); }
  const char* json() const { return buf_; }  // "\"k\": 1, ..." (no braces)

 private:
  void add(const char* key, const char* raw, bool quote);
  char buf_[320];
  size_t n_ = 0;
};

// A complete event (ph X) on `track` from t0 to t1 (now_ns() values).
void complete(int track, const char* cat, const std::string& name, int64_t t0,
              int64_t t1, const Args* args = nullptr);
// An instant event (ph i, thread scope) on `track` at t (0: now).
void instant(int track, const char* cat, const std::string& name,
             const Args* args = nullptr, int64_t t = 0);
// A counter (ph C): the series `key` of the counter `name` takes `value`.
void counter(const char* name, const char* key, double value);

// The track of a process group's collectives ("comm <group>"), named in the
// trace the first time it is used.
int group_track(const std::string& group);

// Buckets of the data-parallel reducer: a gradient of bucket b is in
// (the first one opens its "fill" span), b is launched (closes "fill", opens
// "allreduce", with its bytes), b's result is ready (closes "allreduce").
void bucket_grad(int bucket);
void bucket_launch(int bucket, int64_t bytes);
void bucket_ready(int bucket);

// Starts the timeline if TUTTI_TIMELINE is set and none records yet
// (tutti::init calls it once the world rank is known); marks a restart when
// TUTTI_RESTART_COUNT > 0.
void start_from_env();

// A complete event for the lifetime of the object, on `track`.
class Scope {
 public:
  Scope(int track, const char* cat, const char* name)
      : on_(on()), track_(track), cat_(cat), name_(name), t0_(on_ ? now_ns() : 0) {}
  ~Scope() {
    if (on_) complete(track_, cat_, name_, t0_, now_ns(), args_set_ ? &args_ : nullptr);
  }
  // Args to attach (only read when recording).
  Args& args() {
    args_set_ = true;
    return args_;
  }
  bool recording() const { return on_; }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool on_;
  int track_;
  const char* cat_;
  const char* name_;
  int64_t t0_;
  bool args_set_ = false;
  Args args_;
};

}  // namespace timeline
}  // namespace tutti

// One-line hooks.  TUTTI_TIMELINE(f(x)) calls timeline::f(x) only while a
// timeline records.
#define TUTTI_TIMELINE(call)                                          \
  do {                                                                \
    if (::tutti::timeline::on()) ::tutti::timeline::call;             \
  } while (0)
#define TUTTI_TIMELINE_SCOPE(var, track, cat, name) \
  ::tutti::timeline::Scope var((track), (cat), (name))
