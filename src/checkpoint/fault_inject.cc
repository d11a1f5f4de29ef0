#include "checkpoint/fault_inject.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "core/check.h"
#include "core/runtime_state.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {
namespace fault {
namespace {

enum class Action { kKill, kFail, kStall };

struct Spec {
  std::string point;
  int rank = -1;  // -1: every rank
  int hit = 1;    // fire on the hit-th time the point is reached
  int times = 1;  // ... and on the times-1 hits after it
  Action action = Action::kKill;
  int seen = 0;
};

struct State {
  std::mutex mu;
  uint64_t generation = 0;  // config::generation() the specs were read at
  std::vector<Spec> specs;
};

State& state() {
  static State* s = new State();
  return *s;
}

std::atomic<int> g_enabled{-1};  // -1 unknown, 0 off, 1 on
// The config::generation() g_enabled describes: a config::reload() makes
// the next fault_point() read TUTTI_FAULT_INJECT again.
std::atomic<uint64_t> g_generation{0};

int parse_int(const std::string& v, const std::string& spec) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  TUTTI_ARG_CHECK(!v.empty() && *end == '\0' && x >= 0,
                  "TUTTI_FAULT_INJECT: '", v, "' in '", spec,
                  "' is not a non-negative integer");
  return static_cast<int>(x);
}

Spec parse_spec(const std::string& text) {
  Spec s;
  size_t pos = 0;
  bool first = true;
  while (pos <= text.size()) {
    size_t colon = text.find(':', pos);
    if (colon == std::string::npos) colon = text.size();
    const std::string part = text.substr(pos, colon - pos);
    pos = colon + 1;
    if (first) {
      s.point = part;
      first = false;
      continue;
    }
    const size_t eq = part.find('=');
    const std::string key = part.substr(0, eq);
    const std::string val = eq == std::string::npos ? "" : part.substr(eq + 1);
    if (key == "rank") {
      s.rank = parse_int(val, text);
    } else if (key == "hit") {
      s.hit = std::max(1, parse_int(val, text));
    } else if (key == "times") {
      s.times = std::max(1, parse_int(val, text));
    } else if (key == "action") {
      if (val == "kill") s.action = Action::kKill;
      else if (val == "fail") s.action = Action::kFail;
      else if (val == "stall") s.action = Action::kStall;
      else TUTTI_THROW(kInvalidArgument, "TUTTI_FAULT_INJECT: action '", val,
                       "' in '", text, "' (expected kill, fail or stall)");
    } else {
      TUTTI_THROW(kInvalidArgument, "TUTTI_FAULT_INJECT: unknown key '", key,
                  "' in '", text, "' (expected rank=, hit=, times=, action=)");
    }
  }
  bool known = false;
  for (const auto& p : known_points()) known = known || p == s.point;
  if (!known) {
    std::string all;
    for (const auto& p : known_points()) all += (all.empty() ? "" : ", ") + p;
    TUTTI_THROW(kInvalidArgument, "TUTTI_FAULT_INJECT: unknown point '",
                s.point, "' (known: ", all, ")");
  }
  return s;
}

void load_locked(State& st) {
  st.specs.clear();
  const std::string v = config::get_string("TUTTI_FAULT_INJECT");
  size_t pos = 0;
  while (pos < v.size()) {
    size_t comma = v.find(',', pos);
    if (comma == std::string::npos) comma = v.size();
    if (comma > pos) st.specs.push_back(parse_spec(v.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  st.generation = config::generation();
  g_enabled.store(st.specs.empty() ? 0 : 1);
  g_generation.store(st.generation);
}

}  // namespace

const std::vector<std::string>& known_points() {
  static const std::vector<std::string> points = {
      "after_election",      // the ranks agreed who writes what (save(),
                             // the caller's thread); nothing copied yet
      "before_shard_write",  // the snapshot is taken, nothing written yet
      "mid_shard_write",     // half of the shard's bytes are in the temp file
      "after_shard_write",   // all bytes written to the temp file, not synced
      "before_fsync",        // immediately before fsync of the temp shard
      "after_fsync",         // the temp shard is durable, not yet renamed
      "after_rename",        // the shard has its final name; ranks not agreed
      "after_agree",         // every shard agreed and reported; no manifest yet
      "mid_manifest",        // manifest temp file written, not renamed
      "manifest_fsync",      // immediately before fsync of the manifest
      "between_manifest_and_latest",  // manifest published, `latest` old
      "after_latest",        // `latest` replaced; retention not yet run
      "during_retention",    // an old checkpoint's manifest was removed,
                             // its shards not yet
      "load_read",           // a load opens a checkpoint on this rank
                             // (action=fail: a read error such as EIO)
  };
  return points;
}

void fault_point(const char* point) {
  if (g_enabled.load(std::memory_order_relaxed) == 0 &&
      g_generation.load(std::memory_order_relaxed) == config::generation())
    return;
  State& st = state();
  Action action;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.generation != config::generation()) load_locked(st);
    if (st.specs.empty()) return;
    const int rank = runtime_world_rank();
    Spec* match = nullptr;
    for (auto& s : st.specs)
      if (s.point == point && (s.rank < 0 || s.rank == rank)) match = &s;
    if (!match) return;
    ++match->seen;
    if (match->seen < match->hit || match->seen >= match->hit + match->times) return;
    action = match->action;
  }
  switch (action) {
    case Action::kKill:
      ::kill(::getpid(), SIGKILL);
      for (;;) ::pause();  // SIGKILL is not deliverable late; never returns
    case Action::kFail:
      TUTTI_THROW(kIo, "injected failure at '", point,
                  "' (TUTTI_FAULT_INJECT)");
    case Action::kStall:
      TUTTI_LOG(kWarn) << "TUTTI_FAULT_INJECT: stalling at '" << point
                       << "' until killed";
      for (;;) ::pause();
  }
}

void reload() { config::reload(); }

}  // namespace fault
}  // namespace tutti
