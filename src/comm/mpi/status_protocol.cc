#include "comm/mpi/status_protocol.h"

#include <algorithm>
#include <cstring>

#include "comm/mpi/mpi_runtime.h"
#include "tutti/log.h"

namespace tutti {
namespace mpi {
namespace {

using tree::Span;
using Clock = StatusProtocol::Clock;

enum : uint32_t {
  kAsk = TreeCounts::kAsk,
  kGather = TreeCounts::kGather,
  kReply = TreeCounts::kReply,
  kNotice = TreeCounts::kNotice
};

// Every message: this head, `nruns` member runs (asks, gathers, notices),
// then a reply's aggregate or a notice's `nentries` entries.
struct Head {
  uint64_t comm;       // communicator id
  uint64_t seq;        // the op the report is about (notices: 0)
  uint32_t type;       // kAsk, kGather, kReply, kNotice
  uint32_t budget_ms;  // asks and gathers: how long the answer may take
  int32_t lo, hi;      // gathers and replies: the span
  uint32_t nruns;
  uint32_t nentries;
  uint32_t max_age_ms;  // asks, gathers of the whole tree: how old a kept aggregate may be
  uint32_t reserved;
};
static_assert(sizeof(Head) == 48, "status tree message head: 2 x uint64 + 8 x 32 bits");

struct NoticeEntry {
  int32_t origin;  // the world rank that closed the communicator
  uint32_t shutdown;
  uint64_t last_entered;
};
static_assert(sizeof(NoticeEntry) == 16, "departure entry: 2 x 32 bits + uint64");

// A kept aggregate this recent answers a timeout's ask (and a fallback's
// gather) at once; a stall warning's ask accepts one up to most of a stall
// period old (StatusProtocol::ask).
constexpr auto kFresh = std::chrono::milliseconds(500);
// Below this much time left a silent member's children are not asked.
constexpr auto kMinBudget = std::chrono::milliseconds(30);
constexpr const char* kWhat = "status tree";

uint32_t to_ms(Clock::duration d) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  return static_cast<uint32_t>(std::max<int64_t>(0, std::min<int64_t>(ms, UINT32_MAX)));
}

Clock::duration scaled(Clock::duration d, double f) {
  return std::chrono::duration_cast<Clock::duration>(d * f);
}

Span whole(const std::vector<int>& members) { return {0, static_cast<int>(members.size())}; }

}  // namespace

struct StatusProtocol::Local {
  Clock::duration budget;
  Clock::duration max_age;
  bool done = false;
  bool ok = false;
  tree::Aggregate agg;
};

StatusProtocol::StatusProtocol(MPI_Comm comm, int tag, int fanout, Clock::duration keep,
                               Hooks hooks)
    : comm_(comm), tag_(tag), fanout_(std::max(fanout, 1)), keep_(std::max<Clock::duration>(keep, kFresh)),
      hooks_(std::move(hooks)) {
  TUTTI_MPI_CHECK(MPI_Comm_rank(comm_, &me_), "starting the status tree");
}

StatusProtocol::~StatusProtocol() { reap(true); }

int StatusProtocol::index_of(const std::vector<int>& members) const {
  const auto it = std::lower_bound(members.begin(), members.end(), me_);
  return it != members.end() && *it == me_ ? static_cast<int>(it - members.begin()) : -1;
}

std::vector<uint8_t> StatusProtocol::message(int type, const Key& key, Span span,
                                             Clock::duration budget,
                                             const std::vector<int>* members) const {
  const std::vector<tree::Run> runs =
      members ? tree::encode_members(*members) : std::vector<tree::Run>();
  Head h{};
  h.comm = key.first;
  h.seq = key.second;
  h.type = static_cast<uint32_t>(type);
  h.budget_ms = to_ms(budget);
  h.lo = span.lo;
  h.hi = span.hi;
  h.nruns = static_cast<uint32_t>(runs.size());
  std::vector<uint8_t> out(sizeof(h) + runs.size() * sizeof(tree::Run));
  std::memcpy(out.data(), &h, sizeof(h));
  if (!runs.empty())
    std::memcpy(out.data() + sizeof(h), runs.data(), runs.size() * sizeof(tree::Run));
  return out;
}

void StatusProtocol::send(int to, std::vector<uint8_t> bytes, int type) {
  std::unique_ptr<std::vector<uint8_t>> buf(new std::vector<uint8_t>(std::move(bytes)));
  const int n = static_cast<int>(buf->size());
  std::lock_guard<std::mutex> lock(mu_);
  MPI_Request req = MPI_REQUEST_NULL;
  // A failed send is logged: the peer then reports this rank as silent.
  if (!TUTTI_MPI_WARN(MPI_Isend(buf->data(), n, MPI_BYTE, to, tag_, comm_, &req), kWhat,
                      " (to world rank ", to, ")"))
    return;
  sends_.emplace_back(req, std::move(buf));
  sent_[type].fetch_add(1, std::memory_order_relaxed);
  bytes_sent_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
}

bool StatusProtocol::reap(bool give_up) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < sends_.size();) {
    int done = 0;
    if (MPI_Test(&sends_[i].first, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 1;
    if (!done && give_up) {
      if (sends_[i].first != MPI_REQUEST_NULL) MPI_Request_free(&sends_[i].first);
      (void)sends_[i].second.release();  // MPI may still read it
      done = 1;
    }
    if (done) {
      sends_[i] = std::move(sends_.back());
      sends_.pop_back();
    } else {
      ++i;
    }
  }
  return sends_.empty();
}

bool StatusProtocol::ask(uint64_t comm, uint64_t seq, const std::vector<int>& members,
                         double grace_s, double max_age_s, tree::Aggregate* out) {
  auto local = std::make_shared<Local>();
  local->budget = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::max(grace_s, 0.001)));
  local->max_age = std::min<Clock::duration>(
      keep_, std::max<Clock::duration>(kFresh, std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(max_age_s))));
  const auto deadline = Clock::now() + local->budget;
  std::unique_lock<std::mutex> lock(mu_);
  queue_.push_back({{comm, seq}, {members, local}});
  cv_.notify_all();
  cv_.wait_until(lock, deadline, [&] { return local->done; });
  if (!local->done || !local->ok) return false;
  *out = std::move(local->agg);
  return true;
}

void StatusProtocol::depart(uint64_t comm, const std::vector<int>& members,
                            uint64_t last_entered, bool shutdown) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_.insert(comm);
  }
  if (index_of(members) < 0) return;
  std::vector<uint8_t> m = message(kNotice, {comm, 0}, {}, {}, &members);
  Head h;
  std::memcpy(&h, m.data(), sizeof(h));
  h.nentries = 1;
  std::memcpy(m.data(), &h, sizeof(h));
  const NoticeEntry e{me_, shutdown ? 1u : 0u, last_entered};
  const size_t at = m.size();
  m.resize(at + sizeof(e));
  std::memcpy(m.data() + at, &e, sizeof(e));
  for (int peer : neighbours(members)) send(peer, m, kNotice);
}

std::vector<int> StatusProtocol::neighbours(const std::vector<int>& members) const {
  const tree::Where w = tree::locate(static_cast<int>(members.size()), index_of(members), fanout_);
  std::vector<int> out;
  if (w.parent.hi > 0) out.push_back(members[static_cast<size_t>(w.parent.lo)]);
  for (const Span& c : tree::children(w.self, fanout_))
    out.push_back(members[static_cast<size_t>(c.lo)]);
  return out;
}

void StatusProtocol::idle(int ms) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return !queue_.empty(); });
}

bool StatusProtocol::poll() {
  decltype(queue_) asked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    asked.swap(queue_);
  }
  for (auto& q : asked)
    on_ask(q.first, q.second.first, q.second.second->budget, q.second.second->max_age, -1,
           q.second.second);
  // What arrived (bounded per pass: the deadlines below still run).
  for (int i = 0; i < 256; ++i) {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    if (!TUTTI_MPI_WARN(MPI_Improbe(MPI_ANY_SOURCE, tag_, comm_, &flag, &msg, &st), kWhat) ||
        !flag)
      break;
    int n = 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    std::vector<uint8_t> buf(static_cast<size_t>(std::max(n, 0)));
    if (!TUTTI_MPI_WARN(MPI_Mrecv(buf.data(), n, MPI_BYTE, &msg, MPI_STATUS_IGNORE), kWhat))
      continue;
    handle(st.MPI_SOURCE, buf);
  }
  // Deadlines: silent children, silent parents, asks nobody answered.
  const auto now = Clock::now();
  std::vector<Key> keys;
  for (auto& g : own_) keys.push_back(g.first);
  for (auto& g : fallback_) keys.push_back(g.first);
  for (auto& a : asks_) keys.push_back(a.first);
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  for (const Key& key : keys) {
    auto g = own_.find(key);
    if (g != own_.end()) expire(g->second, key, now);
    g = fallback_.find(key);
    if (g != fallback_.end()) expire(g->second, key, now);
    settle(key);
    auto a = asks_.find(key);
    if (a == asks_.end()) continue;
    if (now >= a->second.end) {  // nothing came back in time
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& l : a->second.locals) l->done = true;
      cv_.notify_all();
      asks_.erase(a);
      fallback_.erase(key);
      continue;
    }
    if (index_of(a->second.members) > 0 && !a->second.fallback && now >= a->second.up_deadline) {
      // The parent sent nothing back: ask the root for the whole tree (its
      // silence adopts its children).
      a->second.fallback = true;
      Gather& fb = fallback_[key];
      fb.members = a->second.members;
      fb.span = whole(fb.members);
      fb.end = a->second.end;
      // An aggregate the root gathered since this ask began will do.
      request(fb, key, fb.span, scaled(a->second.end - now, 0.7), now - a->second.started);
    }
  }
  for (auto it = cache_.begin(); it != cache_.end();)
    it = now - it->second.at > keep_ ? cache_.erase(it) : std::next(it);
  // Notices received this pass, one message per communicator and neighbour.
  for (auto& f : forward_) {
    std::vector<uint8_t> m = message(kNotice, {f.first.first, 0}, {}, {}, &f.second.first);
    Head h;
    std::memcpy(&h, m.data(), sizeof(h));
    h.nentries = static_cast<uint32_t>(f.second.second.size() / sizeof(NoticeEntry));
    std::memcpy(m.data(), &h, sizeof(h));
    m.insert(m.end(), f.second.second.begin(), f.second.second.end());
    send(f.first.second, std::move(m), kNotice);
  }
  forward_.clear();
  reap(false);
  return !own_.empty() || !fallback_.empty() || !asks_.empty();
}

void StatusProtocol::handle(int from, const std::vector<uint8_t>& bytes) {
  Head h;
  if (bytes.size() < sizeof(h)) {
    TUTTI_LOG(kWarn) << kWhat << ": dropped a message of " << bytes.size() << " bytes from world rank " << from;
    return;
  }
  std::memcpy(&h, bytes.data(), sizeof(h));
  size_t at = sizeof(h);
  const size_t rb = static_cast<size_t>(h.nruns) * sizeof(tree::Run);
  if (h.type >= TreeCounts::kTypes || bytes.size() - at < rb) {
    TUTTI_LOG(kWarn) << kWhat << ": dropped a malformed message (type " << h.type << ") from world rank " << from;
    return;
  }
  received_[h.type].fetch_add(1, std::memory_order_relaxed);
  std::vector<tree::Run> runs(h.nruns);
  if (rb) std::memcpy(runs.data(), bytes.data() + at, rb);
  at += rb;
  const std::vector<int> members = tree::decode_members(runs);
  const Key key{h.comm, h.seq};
  const Clock::duration budget = std::chrono::milliseconds(h.budget_ms);
  if (h.type != kReply && (index_of(members) < 0 || !std::is_sorted(members.begin(), members.end()))) {
    TUTTI_LOG(kWarn) << kWhat << ": dropped a message from world rank " << from
                     << " whose member list does not hold this rank";
    return;
  }
  switch (h.type) {
    case kAsk:
      on_ask(key, members, budget, std::chrono::milliseconds(h.max_age_ms), from, nullptr);
      break;
    case kGather:
      on_gather(key, members, {h.lo, h.hi}, budget, std::chrono::milliseconds(h.max_age_ms), from);
      break;
    case kReply: {
      tree::Aggregate agg;
      if (!agg.parse(bytes.data() + at, bytes.size() - at)) {
        TUTTI_LOG(kWarn) << kWhat << ": dropped a malformed reply from world rank " << from;
        return;
      }
      on_reply(key, {h.lo, h.hi}, agg);
      break;
    }
    case kNotice: {
      std::vector<std::pair<int, std::pair<uint64_t, bool>>> entries;
      for (uint32_t i = 0; i < h.nentries && bytes.size() - at >= sizeof(NoticeEntry); ++i) {
        NoticeEntry e;
        std::memcpy(&e, bytes.data() + at, sizeof(e));
        at += sizeof(e);
        entries.push_back({e.origin, {e.last_entered, e.shutdown != 0}});
      }
      on_notice(from, h.comm, members, entries);
      break;
    }
  }
}

void StatusProtocol::on_ask(const Key& key, const std::vector<int>& members,
                            Clock::duration budget, Clock::duration max_age, int from,
                            const std::shared_ptr<Local>& local) {
  const auto now = Clock::now();
  const int idx = index_of(members);
  auto c = cache_.find(key);
  if (c != cache_.end() && now - c->second.at <= max_age) {
    if (local) {
      std::lock_guard<std::mutex> lock(mu_);
      local->agg = c->second.agg;
      local->ok = local->done = true;
      cv_.notify_all();
    } else {
      std::vector<uint8_t> m = message(kReply, key, whole(members), {}, nullptr);
      c->second.agg.serialize(m);
      send(from, std::move(m), kReply);
    }
    return;
  }
  if (idx < 0) {
    if (local) {
      std::lock_guard<std::mutex> lock(mu_);
      local->done = true;
      cv_.notify_all();
    }
    return;
  }
  const bool fresh = asks_.find(key) == asks_.end();
  Ask& a = asks_[key];
  if (local) a.locals.push_back(local);
  if (from >= 0) a.requesters.push_back(from);
  if (!fresh) return;
  a.members = members;
  a.started = now;
  a.end = now + budget;
  // The root's gather takes at most 60% of the time; the answer then goes
  // down the asks' path (a hop per level).
  if (idx == 0) {  // the root: one gather of the whole tree
    if (own_.find(key) == own_.end()) start_gather(key, members, scaled(budget, 0.6));
    settle(key);
    return;
  }
  const tree::Where w = tree::locate(static_cast<int>(members.size()), idx, fanout_);
  std::vector<uint8_t> m = message(kAsk, key, {}, scaled(budget, 0.9), &members);
  Head h;
  std::memcpy(&h, m.data(), sizeof(h));
  h.max_age_ms = to_ms(max_age);
  std::memcpy(m.data(), &h, sizeof(h));
  send(members[static_cast<size_t>(w.parent.lo)], std::move(m), kAsk);
  // The root's answer is due by 60% of this rank's time: past 70% the
  // parent is taken to be gone (dead or stopped) and the root is asked.
  a.up_deadline = now + scaled(budget, 0.7);
}

void StatusProtocol::on_gather(const Key& key, const std::vector<int>& members, Span span,
                               Clock::duration budget, Clock::duration max_age, int from) {
  const int idx = index_of(members);
  const Span mine = tree::locate(static_cast<int>(members.size()), idx, fanout_).self;
  if (!(span == mine)) {
    TUTTI_LOG(kWarn) << kWhat << ": world rank " << from << " asked for members [" << span.lo
                     << ", " << span.hi << ") of communicator " << key.first
                     << " but this rank's subtree is [" << mine.lo << ", " << mine.hi
                     << "): is TUTTI_STATUS_FANOUT the same on every rank?";
    return;
  }
  if (span == whole(members)) {
    auto c = cache_.find(key);
    if (c != cache_.end() && Clock::now() - c->second.at <= std::max<Clock::duration>(kFresh, max_age)) {
      std::vector<uint8_t> m = message(kReply, key, span, {}, nullptr);
      c->second.agg.serialize(m);
      send(from, std::move(m), kReply);
      return;
    }
  }
  auto it = own_.find(key);
  Gather& g = it != own_.end() ? it->second : start_gather(key, members, budget);
  g.reply_to.push_back(from);
  settle(key);
}

StatusProtocol::Gather& StatusProtocol::start_gather(const Key& key,
                                                     const std::vector<int>& members,
                                                     Clock::duration budget) {
  Gather& g = own_[key];
  g.members = members;
  g.span = tree::locate(static_cast<int>(members.size()), index_of(members), fanout_).self;
  g.end = Clock::now() + budget;
  g.agg.add(me_, hooks_.answer(key.first));
  // A leaf is waited for 90% of the time; a child with h levels below it
  // for (h + 1) / (h + 2) of it, leaving the rest for asking its children
  // directly if it stays silent (expire()).
  for (const Span& c : tree::children(g.span, fanout_)) {
    const int h = tree::height(c, fanout_);
    request(g, key, c, scaled(budget, h == 0 ? 0.9 : (h + 1.0) / (h + 2.0)));
  }
  return g;
}

void StatusProtocol::request(Gather& g, const Key& key, Span span, Clock::duration budget,
                             Clock::duration max_age) {
  // The node gets 90% of the time it is waited for, to reply in.
  std::vector<uint8_t> m = message(kGather, key, span, scaled(budget, 0.9), &g.members);
  Head h;
  std::memcpy(&h, m.data(), sizeof(h));
  h.max_age_ms = to_ms(max_age);
  std::memcpy(m.data(), &h, sizeof(h));
  send(g.members[static_cast<size_t>(span.lo)], std::move(m), kGather);
  g.waits.push_back({span, Clock::now() + budget});
}

void StatusProtocol::expire(Gather& g, const Key& key, Clock::time_point now) {
  std::vector<Wait> late;
  for (size_t i = 0; i < g.waits.size();) {
    if (g.waits[i].deadline > now) {
      ++i;
      continue;
    }
    late.push_back(g.waits[i]);
    g.waits.erase(g.waits.begin() + static_cast<std::ptrdiff_t>(i));
  }
  for (const Wait& w : late) {
    g.agg.add(g.members[static_cast<size_t>(w.span.lo)], tree::Answer{});  // did not answer
    const auto left = g.end - now;
    const std::vector<Span> kids = tree::children(w.span, fanout_);
    if (!kids.empty() && left > kMinBudget) {
      for (const Span& c : kids) request(g, key, c, scaled(left, 0.8));  // adopted
      continue;
    }
    std::vector<int> rest(g.members.begin() + w.span.lo + 1, g.members.begin() + w.span.hi);
    g.agg.add_silent(rest);
  }
}

void StatusProtocol::on_reply(const Key& key, Span span, const tree::Aggregate& agg) {
  for (auto* map : {&own_, &fallback_}) {
    auto it = map->find(key);
    if (it == map->end()) continue;
    auto& waits = it->second.waits;
    for (size_t i = 0; i < waits.size(); ++i) {
      if (!(waits[i].span == span)) continue;
      waits.erase(waits.begin() + static_cast<std::ptrdiff_t>(i));
      it->second.agg.merge(agg);
      break;
    }
  }
  auto a = asks_.find(key);
  if (a != asks_.end() && span == whole(a->second.members)) finish(key, agg);
  settle(key);
}

void StatusProtocol::settle(const Key& key) {
  for (auto* map : {&own_, &fallback_}) {
    auto it = map->find(key);
    if (it == map->end() || !it->second.waits.empty()) continue;
    Gather g = std::move(it->second);
    map->erase(it);
    g.agg.cap(key.second);
    if (g.span == whole(g.members)) finish(key, g.agg);
    for (int to : g.reply_to) {
      std::vector<uint8_t> m = message(kReply, key, g.span, {}, nullptr);
      g.agg.serialize(m);
      send(to, std::move(m), kReply);
    }
  }
}

void StatusProtocol::finish(const Key& key, const tree::Aggregate& result) {
  cache_[key] = {result, Clock::now()};
  fallback_.erase(key);
  auto it = asks_.find(key);
  if (it == asks_.end()) return;
  Ask a = std::move(it->second);
  asks_.erase(it);
  for (int to : a.requesters) {
    std::vector<uint8_t> m = message(kReply, key, whole(a.members), {}, nullptr);
    result.serialize(m);
    send(to, std::move(m), kReply);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& l : a.locals) {
    l->agg = result;
    l->ok = l->done = true;
  }
  cv_.notify_all();
}

void StatusProtocol::on_notice(int from, uint64_t comm, const std::vector<int>& members,
                               const std::vector<std::pair<int, std::pair<uint64_t, bool>>>& entries) {
  bool closed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed = closed_.count(comm) != 0;
  }
  std::vector<int> to = neighbours(members);
  to.erase(std::remove(to.begin(), to.end(), from), to.end());
  for (const auto& e : entries) {
    if (!hooks_.departed(comm, e.first, e.second.first, e.second.second) || closed) continue;
    const NoticeEntry n{e.first, e.second.second ? 1u : 0u, e.second.first};
    for (int peer : to) {
      auto& f = forward_[{comm, peer}];
      if (f.first.empty()) f.first = members;
      const size_t at = f.second.size();
      f.second.resize(at + sizeof(n));
      std::memcpy(f.second.data() + at, &n, sizeof(n));
    }
  }
}

TreeCounts StatusProtocol::counts() const {
  TreeCounts c;
  for (int t = 0; t < TreeCounts::kTypes; ++t) {
    c.sent[t] = sent_[t].load(std::memory_order_relaxed);
    c.received[t] = received_[t].load(std::memory_order_relaxed);
  }
  c.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
  return c;
}

void StatusProtocol::reset_counts() {
  for (int t = 0; t < TreeCounts::kTypes; ++t) {
    sent_[t].store(0, std::memory_order_relaxed);
    received_[t].store(0, std::memory_order_relaxed);
  }
  bytes_sent_.store(0, std::memory_order_relaxed);
}

}  // namespace mpi
}  // namespace tutti
