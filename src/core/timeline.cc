// The timeline recorder (src/core/timeline.h explains the design).
#include "core/timeline.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/runtime_state.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {
namespace timeline {
namespace detail {
std::atomic<bool> g_on{false};
}

namespace {

constexpr size_t kNameLen = 96;
constexpr auto kFlushPeriod = std::chrono::milliseconds(100);

struct Event {
  int64_t t;
  int64_t dur;  // X only
  int32_t track;
  char ph;
  const char* cat;  // a string literal
  char name[kNameLen];
  char args[sizeof(Args)];
};

// One thread's events between two flushes.  Shared with the registry, so a
// thread that ends leaves its last events for the writer.
struct ThreadBuf {
  std::mutex mu;
  std::vector<Event> events;
  uint64_t dropped = 0;
};

// Copies `s` into dst[cap], truncated, NUL-terminated.
void copy_cstr(char* dst, size_t cap, const char* s) {
  const size_t n = strnlen(s, cap - 1);
  std::memcpy(dst, s, n);
  dst[n] = '\0';
}

// Appends `s` to `out` as the body of a JSON string.
void escape_into(std::string& out, const char* s) {
  for (; *s; ++s) {
    const unsigned char c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char u[8];
      std::snprintf(u, sizeof(u), "\\u%04x", c);
      out += u;
    } else {
      out += static_cast<char>(c);
    }
  }
}

class Recorder {
 public:
  ~Recorder() { stop(); }

  void start(const std::string& path) {
    std::lock_guard<std::mutex> lock(control_mu_);
    TUTTI_ARG_CHECK(!detail::g_on.load(), "timeline::start('", path,
                    "'): a timeline is already recording into '", file_, "'");
    TUTTI_ARG_CHECK(!path.empty(), "timeline::start(): empty path");
    rank_ = runtime_world_rank() < 0 ? 0 : runtime_world_rank();
    const int size = runtime_world_size() < 0 ? 1 : runtime_world_size();
    const int64_t restarts = config::get_int("TUTTI_RESTART_COUNT");
    const std::string name = resolve(path, rank_, restarts);
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
      TUTTI_THROW(kIo, "rank ", rank_, ": cannot create the timeline file '", name,
                  "' (TUTTI_TIMELINE / timeline::start): ", std::strerror(errno));
    file_ = name;
    fd_ = fd;
    write_failed_ = false;
    chunk_.clear();
    first_ = true;
    {
      std::lock_guard<std::mutex> rl(registry_mu_);
      for (auto& b : bufs_) {
        std::lock_guard<std::mutex> bl(b->mu);
        b->events.clear();
        b->dropped = 0;
      }
    }
    {
      std::lock_guard<std::mutex> gl(groups_mu_);
      groups_.clear();
    }
    for (auto& t : fill_t0_) t.store(0, std::memory_order_relaxed);
    for (auto& t : launch_t0_) t.store(0, std::memory_order_relaxed);
    for (auto& t : bucket_named_) t.store(false, std::memory_order_relaxed);
    dropped_total_ = 0;
    anchor_ = now_ns();
    const int64_t wall_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
    chunk_ = "[\n";
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    // The writer thread is not running yet: write the header directly.
    std::string pname = "rank " + std::to_string(rank_);
    if (restarts > 0) pname += " (restart " + std::to_string(restarts) + ")";
    metadata(0, "process_name", pname.c_str());
    write_raw("{\"name\": \"process_sort_index\", \"ph\": \"M\", \"ts\": 0, \"pid\": " +
              std::to_string(rank_) + ", \"tid\": 0, \"args\": {\"sort_index\": " +
              std::to_string(rank_) + "}}");
    static const std::pair<int, const char*> kTracks[] = {
        {kCompute, "compute"},         {kFramework, "framework (reducer)"},
        {kCompression, "compression"}, {kAmp, "amp"},
        {kCheckpoint, "checkpoint"},   {kCheckpointWriter, "checkpoint writer"},
        {kPreemption, "preemption / restarts"}};
    for (const auto& t : kTracks) metadata(t.first, "thread_name", t.second);
    Args a;
    a.i("wall_clock_us", wall_us).i("rank", rank_).i("size", size).s("host", host)
        .i("pid", getpid()).i("restart_count", restarts);
    std::string anchor = "{\"name\": \"timeline_start\", \"cat\": \"meta\", \"ph\": \"i\", "
                         "\"s\": \"p\", \"ts\": 0, \"pid\": " + std::to_string(rank_) +
                         ", \"tid\": " + std::to_string(kPreemption) + ", \"args\": {" +
                         a.json() + "}}";
    write_raw(anchor);
    write_chunk();
    stopping_ = false;
    writer_ = std::thread([this] { writer_loop(); });
    detail::g_on.store(true, std::memory_order_release);
    if (restarts > 0) {
      Args r;
      r.i("restart_count", restarts);
      instant(kPreemption, "preemption", "restart", &r);
    }
  }

  void stop() {
    std::lock_guard<std::mutex> lock(control_mu_);
    if (!detail::g_on.exchange(false)) return;
    {
      std::lock_guard<std::mutex> l(writer_mu_);
      stopping_ = true;
    }
    writer_cv_.notify_all();
    if (writer_.joinable()) writer_.join();
    flush();  // what was recorded between the writer's last pass and now
    if (dropped_total_ > 0)
      TUTTI_LOG(kWarn) << "timeline: " << dropped_total_
                       << " event(s) dropped (more than " << kMaxPending
                       << " per thread within 100 ms)";
    chunk_ += "\n]\n";
    write_chunk();
    ::close(fd_);
    fd_ = -1;
    file_.clear();
  }

  std::string file() {
    std::lock_guard<std::mutex> lock(control_mu_);
    return file_;
  }

  void record(char ph, int track, const char* cat, const char* name, int64_t t,
              int64_t dur, const Args* args) {
    ThreadBuf& b = local();
    std::lock_guard<std::mutex> lock(b.mu);
    if (b.events.size() >= kMaxPending) {
      ++b.dropped;
      return;
    }
    b.events.emplace_back();
    Event& e = b.events.back();
    e.t = t;
    e.dur = dur;
    e.track = track;
    e.ph = ph;
    e.cat = cat;
    copy_cstr(e.name, sizeof(e.name), name);
    copy_cstr(e.args, sizeof(e.args), args ? args->json() : "");
  }

  int group_track(const std::string& group) {
    int track;
    {
      std::lock_guard<std::mutex> lock(groups_mu_);
      auto it = groups_.find(group);
      if (it != groups_.end()) return it->second;
      track = kGroupBase + static_cast<int>(groups_.size()) % kMaxGroups;
      groups_.emplace(group, track);
    }
    // Named outside groups_mu_: record() may take registry_mu_.
    Args a;
    a.s("name", "comm " + group);
    record('M', track, "meta", "thread_name", 0, 0, &a);
    return track;
  }

  void name_bucket(int b) {
    if (bucket_named_[b].exchange(true, std::memory_order_relaxed)) return;
    Args a;
    a.s("name", "bucket " + std::to_string(b));
    record('M', kBucketBase + b, "meta", "thread_name", 0, 0, &a);
  }

  std::atomic<int64_t> fill_t0_[kMaxBuckets] = {};
  std::atomic<int64_t> launch_t0_[kMaxBuckets] = {};
  int64_t anchor_ = 0;

 private:
  // "<path>.rank<R>.json" or "<path>/rank<R>.json"; a job that tutti-run
  // restarted writes "...rank<R>.restart<K>.json", beside the earlier runs'.
  static std::string resolve(const std::string& path, int rank, int64_t restarts) {
    struct stat st;
    const bool dir = path.back() == '/' ||
                     (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode));
    const std::string leaf = "rank" + std::to_string(rank) +
                             (restarts > 0 ? ".restart" + std::to_string(restarts) : "") +
                             ".json";
    if (dir) {
      if (path.back() == '/') ::mkdir(path.c_str(), 0755);  // one level
      return path + (path.back() == '/' ? "" : "/") + leaf;
    }
    return path + "." + leaf;
  }

  ThreadBuf& local() {
    thread_local std::shared_ptr<ThreadBuf> mine;
    if (!mine) {
      mine = std::make_shared<ThreadBuf>();
      mine->events.reserve(256);
      std::lock_guard<std::mutex> lock(registry_mu_);
      bufs_.push_back(mine);
    }
    return *mine;
  }

  void metadata(int track, const char* what, const char* value) {
    std::string s = "{\"name\": \"";
    s += what;
    s += "\", \"ph\": \"M\", \"ts\": 0, \"pid\": " + std::to_string(rank_) +
         ", \"tid\": " + std::to_string(track) + ", \"args\": {\"name\": \"";
    escape_into(s, value);
    s += "\"}}";
    write_raw(s);
  }

  // Appends one event's text, with the comma that separates it from the
  // previous one, so the file is always a valid unterminated array.
  void write_raw(const std::string& s) {
    if (!first_) chunk_ += ",\n";
    first_ = false;
    chunk_ += s;
  }

  // One write(2) per flush, so a SIGKILL leaves whole events only (the
  // file ends after the last flushed event).  A failing write (disk full)
  // is reported once and the rest of the trace dropped.
  void write_chunk() {
    size_t done = 0;
    while (done < chunk_.size() && !write_failed_) {
      const ssize_t n = ::write(fd_, chunk_.data() + done, chunk_.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        write_failed_ = true;
        TUTTI_LOG(kError) << "timeline: writing '" << file_ << "' failed ("
                          << std::strerror(errno) << "); the rest of the trace is lost";
        break;
      }
      done += static_cast<size_t>(n);
    }
    chunk_.clear();
  }

  void format(const Event& e, std::string& s) {
    s.clear();
    s += "{\"name\": \"";
    escape_into(s, e.name);
    s += "\", \"cat\": \"";
    s += e.cat;
    s += "\", \"ph\": \"";
    s += e.ph;
    char num[96];
    const double ts = e.ph == 'M' ? 0.0 : static_cast<double>(e.t - anchor_) / 1000.0;
    std::snprintf(num, sizeof(num), "\", \"ts\": %.3f", ts);
    s += num;
    if (e.ph == 'X') {
      std::snprintf(num, sizeof(num), ", \"dur\": %.3f",
                    static_cast<double>(e.dur > 0 ? e.dur : 0) / 1000.0);
      s += num;
    }
    if (e.ph == 'i') s += ", \"s\": \"t\"";
    std::snprintf(num, sizeof(num), ", \"pid\": %d, \"tid\": %d", rank_, e.track);
    s += num;
    s += ", \"args\": {";
    s += e.args;
    s += "}}";
  }

  // Moves every thread's events to the file (the writer thread, or stop()
  // after the writer ended: never both at once).
  void flush() {
    std::vector<std::shared_ptr<ThreadBuf>> bufs;
    {
      std::lock_guard<std::mutex> lock(registry_mu_);
      // Threads that ended (only the registry holds their buffer) leave
      // once their last events were written (the pass after they ended).
      bufs_.erase(std::remove_if(bufs_.begin(), bufs_.end(),
                                 [](const std::shared_ptr<ThreadBuf>& b) {
                                   std::lock_guard<std::mutex> bl(b->mu);
                                   return b.use_count() == 1 && b->events.empty();
                                 }),
                  bufs_.end());
      bufs = bufs_;
    }
    std::string line;
    for (auto& b : bufs) {
      {
        std::lock_guard<std::mutex> lock(b->mu);
        spare_.swap(b->events);
        dropped_total_ += b->dropped;
        b->dropped = 0;
      }
      for (const Event& e : spare_) {
        format(e, line);
        write_raw(line);
      }
      spare_.clear();
    }
    write_chunk();
  }

  void writer_loop() {
    std::unique_lock<std::mutex> lock(writer_mu_);
    while (!stopping_) {
      writer_cv_.wait_for(lock, kFlushPeriod, [&] { return stopping_; });
      lock.unlock();
      flush();
      lock.lock();
    }
  }

  std::mutex control_mu_;  // start / stop
  std::string file_;
  int fd_ = -1;
  std::string chunk_;  // formatted, not yet written
  bool write_failed_ = false;
  bool first_ = true;
  int rank_ = 0;
  uint64_t dropped_total_ = 0;
  std::vector<Event> spare_;

  std::mutex registry_mu_;
  std::vector<std::shared_ptr<ThreadBuf>> bufs_;
  std::mutex groups_mu_;
  std::map<std::string, int> groups_;
  std::atomic<bool> bucket_named_[kMaxBuckets] = {};

  std::mutex writer_mu_;
  std::condition_variable writer_cv_;
  bool stopping_ = false;
  std::thread writer_;
};

Recorder& recorder() {
  static Recorder r;  // its destructor closes a timeline nobody stopped
  return r;
}

bool valid_bucket(int b) { return b >= 0 && b < kMaxBuckets; }

// The compute track of the calling thread: the first thread that opens a
// span gets "compute", later ones "compute 2", ... (B/E nest per track).
struct ComputeTrack {
  int track = 0;
  std::vector<std::string> open;
};
ComputeTrack& compute_track() {
  thread_local ComputeTrack t;
  static std::atomic<int> next{0};
  if (t.track == 0) {
    const int k = next.fetch_add(1);
    t.track = k == 0 ? kCompute : kExtraComputeBase + k;
    if (k > 0 && on()) {
      Args a;
      a.s("name", "compute " + std::to_string(k + 1));
      recorder().record('M', t.track, "meta", "thread_name", 0, 0, &a);
    }
  }
  return t;
}

}  // namespace

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Appends straight into the fixed buffer (no allocation: hooks on the
// collective path build args for every op); an arg that does not fit is
// left out whole.
void Args::add(const char* key, const char* raw, bool quote) {
  const size_t cap = sizeof(buf_) - 1;
  size_t n = n_;
  auto put = [&](char c) {
    if (n < cap) buf_[n] = c;
    ++n;
  };
  auto put_escaped = [&](const char* s) {
    for (; *s; ++s) {
      const unsigned char c = static_cast<unsigned char>(*s);
      if (c == '"' || c == '\\') {
        put('\\');
        put(static_cast<char>(c));
      } else if (c < 0x20) {
        char u[8];
        std::snprintf(u, sizeof(u), "\\u%04x", c);
        for (const char* p = u; *p; ++p) put(*p);
      } else {
        put(static_cast<char>(c));
      }
    }
  };
  if (n_) {
    put(',');
    put(' ');
  }
  put('"');
  put_escaped(key);
  put('"');
  put(':');
  put(' ');
  if (quote) put('"');
  if (quote)
    put_escaped(raw);
  else
    for (const char* p = raw; *p; ++p) put(*p);
  if (quote) put('"');
  if (n > cap) {  // did not fit: drop it
    buf_[n_] = '\0';
    return;
  }
  n_ = n;
  buf_[n_] = '\0';
}

Args& Args::i(const char* key, int64_t v) {
  char num[32];
  std::snprintf(num, sizeof(num), "%lld", static_cast<long long>(v));
  add(key, num, false);
  return *this;
}

Args& Args::d(const char* key, double v) {
  char num[40];
  std::snprintf(num, sizeof(num), "%.6g", v);
  add(key, num, false);
  return *this;
}

Args& Args::s(const char* key, const char* v) {
  add(key, v, true);
  return *this;
}

void complete(int track, const char* cat, const std::string& name, int64_t t0,
              int64_t t1, const Args* args) {
  if (!on()) return;
  recorder().record('X', track, cat, name.c_str(), t0, t1 - t0, args);
}

void instant(int track, const char* cat, const std::string& name, const Args* args,
             int64_t t) {
  if (!on()) return;
  recorder().record('i', track, cat, name.c_str(), t ? t : now_ns(), 0, args);
}

void counter(const char* name, const char* key, double value) {
  if (!on()) return;
  Args a;
  a.d(key, value);
  recorder().record('C', kAmp, "amp", name, now_ns(), 0, &a);
}

int group_track(const std::string& group) { return recorder().group_track(group); }

void bucket_grad(int b) {
  if (!on() || !valid_bucket(b)) return;
  int64_t zero = 0;
  recorder().fill_t0_[b].compare_exchange_strong(zero, now_ns(), std::memory_order_relaxed);
}

void bucket_launch(int b, int64_t bytes) {
  if (!on() || !valid_bucket(b)) return;
  Recorder& r = recorder();
  r.name_bucket(b);
  const int64_t now = now_ns();
  const int64_t t0 = r.fill_t0_[b].exchange(0, std::memory_order_relaxed);
  Args a;
  a.i("bucket", b).i("bytes", bytes);
  r.record('X', kBucketBase + b, "bucket", "fill", t0 ? t0 : now, t0 ? now - t0 : 0, &a);
  r.launch_t0_[b].store(now, std::memory_order_relaxed);
  r.record('i', kBucketBase + b, "bucket", "launch", now, 0, &a);
}

void bucket_ready(int b) {
  if (!on() || !valid_bucket(b)) return;
  Recorder& r = recorder();
  const int64_t t0 = r.launch_t0_[b].exchange(0, std::memory_order_relaxed);
  if (t0 == 0) return;  // launched before the timeline started
  const int64_t now = now_ns();
  Args a;
  a.i("bucket", b);
  r.record('X', kBucketBase + b, "bucket", "allreduce", t0, now - t0, &a);
  r.record('i', kBucketBase + b, "bucket", "ready", now, 0, &a);
}

void start_from_env() {
  const std::string path = config::get_string("TUTTI_TIMELINE");
  if (path.empty() || active()) return;
  start(path);
}

// ---- the public API

void start(const std::string& path) { recorder().start(path); }
void stop() { recorder().stop(); }
bool active() { return on(); }
std::string file() { return recorder().file(); }

void mark(const std::string& name) {
  if (!on()) return;
  recorder().record('i', compute_track().track, "user", name.c_str(), now_ns(), 0, nullptr);
}

void begin(const std::string& name) {
  if (!on()) return;
  ComputeTrack& t = compute_track();
  t.open.push_back(name);
  recorder().record('B', t.track, "user", name.c_str(), now_ns(), 0, nullptr);
}

void end() {
  ComputeTrack& t = compute_track();
  if (t.open.empty()) return;
  const std::string name = std::move(t.open.back());
  t.open.pop_back();
  // Closed even if the timeline stopped meanwhile: the E is simply dropped
  // with the rest after stop().
  if (!on()) return;
  recorder().record('E', t.track, "user", name.c_str(), now_ns(), 0, nullptr);
}

}  // namespace timeline
}  // namespace tutti
