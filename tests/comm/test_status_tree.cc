// The status tree (src/comm/mpi/status_{tree,protocol,report}.cc): stall and
// timeout reports gathered through a tree over the members, departure
// notices spread through it, and the texts.
//  * pure parts at any np: the tree's shape, member runs, the aggregate
//    (merge, caps, wire round trip), rank lists, and describe_report() on
//    synthetic aggregates (word for word the per-peer texts up to
//    TUTTI_REPORT_MAX_RANKS peers, ranges at 1024 ranks);
//  * over MPI (np 3-8; TUTTI_STATUS_FANOUT=2 at np 7 for a deeper tree):
//    each rank publishes a made-up progress under a test communicator id and
//    every on-time rank asks for a report at once: the text names exactly
//    the missing ranks, each process sends at most 2 x fanout + 2 tree
//    messages for it (every process of an all-to-all report would send
//    W - 1), nothing is sent while no op stalls, a stopped (SIGSTOP) inner
//    member is "did not answer" while its children are still reported
//    (adopted), and a departure notice reaches every member once.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi/status_service.h"
#include "comm/rank_list.h"
#include "common/test_util.h"
#include "tutti/config.h"

namespace tutti {
namespace {

using mpi::PeerStatus;
using mpi::StatusService;
using mpi::tree::Aggregate;
using mpi::tree::Answer;
using mpi::tree::Span;

constexpr uint8_t kBarrier = static_cast<uint8_t>(CollectiveKind::kBarrier);
constexpr uint8_t kAllreduce = static_cast<uint8_t>(CollectiveKind::kAllreduce);

// ---- pure parts ------------------------------------------------------------

TEST(StatusTree, EveryMemberHasOneParentAndAtMostFanoutChildren) {
  for (int fanout : {1, 2, 3, 8}) {
    for (int w = 1; w <= 70; ++w) {
      std::vector<int> parents(static_cast<size_t>(w), -1);
      for (int i = 0; i < w; ++i) {
        const mpi::tree::Where at = mpi::tree::locate(w, i, fanout);
        ASSERT_EQ(at.self.lo, i) << "w " << w << " fanout " << fanout;
        const auto kids = mpi::tree::children(at.self, fanout);
        ASSERT_LE(kids.size(), static_cast<size_t>(fanout));
        int covered = at.self.lo + 1;
        for (const Span& c : kids) {
          EXPECT_EQ(c.lo, covered) << "children's spans tile the subtree";
          covered = c.hi;
          parents[static_cast<size_t>(c.lo)] = i;
          EXPECT_TRUE(mpi::tree::locate(w, c.lo, fanout).parent == at.self);
        }
        EXPECT_EQ(covered, at.self.hi);
      }
      EXPECT_EQ(parents[0], -1) << "member 0 is the root";
      for (int i = 1; i < w; ++i) EXPECT_GE(parents[static_cast<size_t>(i)], 0);
      // Depth: a fanout-ary tree is logarithmic (fanout 1: a chain).
      int depth = 0;
      for (int cap = 1, level = 1; cap < w; ++depth) cap += (level *= std::max(fanout, 1));
      if (fanout > 1)
        EXPECT_LE(mpi::tree::height({0, w}, fanout), depth) << "w " << w << " fanout " << fanout;
    }
  }
  EXPECT_EQ(mpi::tree::height({0, 1024}, 8), 4);
}

TEST(StatusTree, MemberRunsRoundTrip) {
  std::vector<int> world(1000), strided, odd = {0, 1, 2, 7, 9, 11, 40};
  for (int i = 0; i < 1000; ++i) world[static_cast<size_t>(i)] = i;
  for (int i = 3; i < 4000; i += 8) strided.push_back(i);
  EXPECT_EQ(mpi::tree::encode_members(world).size(), 1u);
  EXPECT_EQ(mpi::tree::encode_members(strided).size(), 1u);
  for (const auto& m : {world, strided, odd, std::vector<int>{5}})
    EXPECT_EQ(mpi::tree::decode_members(mpi::tree::encode_members(m)), m);
}

Answer at(uint64_t entered, bool finished, uint8_t kind) {
  Answer a;
  a.answered = a.member = true;
  a.entered = entered;
  a.finished = finished;
  a.kind = kind;
  return a;
}

TEST(StatusTree, AggregateMergesCapsAndRoundTrips) {
  Aggregate a, b;
  for (int r = 0; r < 600; ++r) (r < 300 ? a : b).add(r, at(5, false, kAllreduce));  // two subtrees
  a.add(601, at(4, true, kBarrier));
  b.add_silent({700, 701, 702});
  a.merge(b);
  ASSERT_EQ(a.groups().size(), 3u);
  EXPECT_EQ(a.ranks(), 604u);
  EXPECT_TRUE(a.exact());
  EXPECT_EQ(a.groups()[0].ranges, (comm::RankRanges{{0, 599}}));
  a.remove(300);
  EXPECT_EQ(a.groups()[0].ranges, (comm::RankRanges{{0, 299}, {301, 599}}));
  std::vector<uint8_t> wire;
  a.serialize(wire);
  Aggregate c;
  ASSERT_TRUE(c.parse(wire.data(), wire.size()));
  EXPECT_EQ(c.ranks(), a.ranks());
  ASSERT_EQ(c.groups().size(), a.groups().size());
  for (size_t i = 0; i < c.groups().size(); ++i) EXPECT_EQ(c.groups()[i].ranges, a.groups()[i].ranges);
  EXPECT_FALSE(c.parse(wire.data(), wire.size() - 1)) << "a truncated message is refused";
  // Every other rank alike: more ranges than a group keeps; the count stays
  // (the tree merges contiguous subtrees, so this takes a sparse pattern).
  Aggregate f;
  for (int r = 0; r < 1000; r += 2) f.add(r, at(5, false, kAllreduce));
  EXPECT_EQ(f.groups()[0].ranges.size(), mpi::tree::kMaxRanges);
  EXPECT_EQ(f.ranks(), 500u);
  EXPECT_FALSE(f.exact());
  // Every rank at another op: groups folded by class past kMaxGroups.
  Aggregate g;
  for (int r = 0; r < 300; ++r) g.add(r, at(static_cast<uint64_t>(1 + r), true, kBarrier));
  g.cap(1000);
  EXPECT_LE(g.groups().size(), mpi::tree::kMaxGroups);
  EXPECT_EQ(g.ranks(), 300u);
}

TEST(StatusTree, RankListsBecomeRangesPastTheCap) {
  EXPECT_EQ(comm::format_ranks(std::vector<int>{3}, 8), "rank 3");
  EXPECT_EQ(comm::format_ranks(std::vector<int>{5, 1, 3}, 8), "ranks 1, 3, 5");
  std::vector<int> many;
  for (int r = 0; r < 1024; ++r)
    if (r != 512) many.push_back(r);
  EXPECT_EQ(comm::format_ranks(many, 8), "ranks 0-511, 513-1023");
  std::vector<int> sparse;
  for (int r = 0; r < 40; r += 2) sparse.push_back(r);
  EXPECT_EQ(comm::format_ranks(sparse, 3), "ranks 0, 2, 4 and 17 more (20 in all)");
}

TEST(StatusTree, ReportTextsKeepTheirWordsAndScale) {
  // Five peers: the per-peer texts, word for word.
  Aggregate small;
  std::vector<PeerStatus> each;
  for (int r = 0; r < 6; ++r) {
    const Answer a = r == 2 || r == 4 ? at(4, true, kBarrier) : at(7, false, kAllreduce);
    small.add(r, a);
    if (r == 0) continue;
    PeerStatus p;
    p.world_rank = r;
    p.answered = p.member = true;
    p.entered = a.entered;
    p.completed = a.finished ? a.entered : a.entered - 1;
    p.kind = a.kind;
    each.push_back(p);
  }
  const std::vector<int> peers = {1, 2, 3, 4, 5};
  EXPECT_EQ(mpi::describe_report(small, 7, 0, peers, true, 8), mpi::describe_stall(each, 7, 0));
  EXPECT_EQ(mpi::describe_report(small, 7, 0, peers, true, 8),
            "arrived: ranks 0, 1, 3, 5; missing: rank 2 (last entered #4 barrier, finished it); "
            "rank 4 (last entered #4 barrier, finished it)");
  EXPECT_EQ(mpi::describe_report(small, 7, 0, peers, false, 8), mpi::describe_stragglers(each, 7));
  // 1024 ranks, one late, one silent.
  Aggregate big;
  std::vector<int> others;
  for (int r = 0; r < 1024; ++r) {
    if (r) others.push_back(r);
    if (r == 512)
      big.add(r, at(2, true, kBarrier));
    else if (r == 900)
      big.add(r, Answer{});
    else
      big.add(r, at(3, false, kAllreduce));
  }
  EXPECT_EQ(mpi::describe_report(big, 3, 0, others, true, 8),
            "arrived: ranks 0-511, 513-899, 901-1023; missing: rank 512 (last entered #2 barrier, "
            "finished it); rank 900 (did not answer: dead, or stuck outside tutti)");
  EXPECT_EQ(mpi::describe_report(big, 3, 7, others, false, 8),
            "never arrived: rank 512 (last entered #2 barrier, finished it); did not answer (dead, "
            "or stuck outside tutti): rank 900; also arrived: ranks 0-6, 8-511, 513-899, 901-1023");
  // Missing ranks grouped by where they are, at most max_ranks groups.
  Aggregate spread;
  for (int r = 0; r < 64; ++r)
    spread.add(r, r < 32 ? at(9, false, kAllreduce)
                         : at(static_cast<uint64_t>(1 + (r - 32) / 4), true, kBarrier));
  std::vector<int> rest;
  for (int r = 1; r < 64; ++r) rest.push_back(r);
  EXPECT_EQ(mpi::describe_report(spread, 9, 0, rest, true, 2),
            "arrived: ranks 0-31; missing: ranks 32-35 (last entered #1 barrier, finished it); "
            "ranks 36-39 (last entered #2 barrier, finished it); and 24 more ranks in 6 more places");
}

// ---- over MPI --------------------------------------------------------------

class StatusTreeMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    if (w->size() < 2) GTEST_SKIP() << "needs two or more ranks";
    ASSERT_TRUE(StatusService::instance().running());
  }
  // A fresh communicator id on every rank (reports are kept per id and op).
  uint64_t next_id() { return 0x7e57000000000000ull + ++ids_; }
  // Publishes `a` as this rank's progress on `id`.
  std::shared_ptr<mpi::CommProgress> publish(uint64_t id, const Answer& a) {
    auto p = std::make_shared<mpi::CommProgress>();
    p->entered = a.entered;
    p->completed = a.finished ? a.entered : a.entered - 1;
    p->kind = a.kind;
    StatusService::instance().add(id, p);
    return p;
  }
  std::vector<int> peers() const {
    std::vector<int> out;
    for (int r = 0; r < w->size(); ++r)
      if (r != w->rank()) out.push_back(r);
    return out;
  }
  static int fanout() { return static_cast<int>(config::get_int("TUTTI_STATUS_FANOUT")); }
  // MAX over ranks.
  uint64_t max_over_ranks(uint64_t v) {
    int64_t x = static_cast<int64_t>(v);
    w->allreduce(Tensor::of(&x, 1), ReduceOp::kMax);
    return static_cast<uint64_t>(x);
  }
  uint64_t sum_over_ranks(uint64_t v) {
    int64_t x = static_cast<int64_t>(v);
    w->allreduce(Tensor::of(&x, 1), ReduceOp::kSum);
    return static_cast<uint64_t>(x);
  }
  ProcessGroupPtr w = world();
  static uint64_t ids_;
};
uint64_t StatusTreeMpi::ids_ = 0;

// Ranks 1, 5, 9, ... are "late" (last entered #4 barrier, finished it); the
// others wait in #5.
bool late(int r) { return r % 4 == 1; }

// The expected stall line, built independently of the code under test;
// `missing_out`: its missing ranks as a timeout's report names them.
std::string expected_stall(int n, int max_ranks, std::string* missing_out = nullptr) {
  std::vector<int> arrived, missing;
  for (int r = 0; r < n; ++r) (late(r) ? missing : arrived).push_back(r);
  const auto list = [&](const std::vector<int>& v) {
    std::string s = v.size() == 1 ? "rank " : "ranks ";
    if (v.size() <= static_cast<size_t>(max_ranks)) {
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s;
    }
    for (size_t i = 0; i < v.size();) {  // ranges
      size_t j = i;
      while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
      s += (i ? ", " : "") + std::to_string(v[i]) + (j > i ? "-" + std::to_string(v[j]) : "");
      i = j + 1;
    }
    return s;
  };
  const std::string where = " (last entered #4 barrier, finished it)";
  std::string gone;
  if (n - 1 <= max_ranks) {
    for (size_t i = 0; i < missing.size(); ++i)
      gone += (i ? "; " : "") + std::string("rank ") + std::to_string(missing[i]) + where;
  } else {
    gone = list(missing) + where;
  }
  if (missing_out) *missing_out = gone;
  return "arrived: " + list(arrived) + "; missing: " + gone;
}

TEST_F(StatusTreeMpi, EveryWaitingRankGetsTheReportForAFewMessages) {
  const uint64_t id = next_id();
  const int rank = w->rank(), n = w->size();
  auto progress = publish(id, late(rank) ? at(4, true, kBarrier) : at(5, false, kAllreduce));
  StatusService::instance().reset_tree_counts();
  w->barrier();
  std::string report;
  // Every waiting rank asks at once, as at the end of a stall period.
  if (!late(rank)) report = mpi::peer_report(id, peers(), 5, rank, /*stall=*/true, true);
  w->barrier();
  const mpi::TreeCounts c = StatusService::instance().tree_counts();
  if (!late(rank)) EXPECT_EQ(report, expected_stall(n, comm::report_max_ranks()));
  const int k = fanout();
  EXPECT_LE(c.total_sent(), static_cast<uint64_t>(2 * k + 2))
      << "rank " << rank << " sent asks " << c.sent[0] << ", gathers " << c.sent[1] << ", replies "
      << c.sent[2];
  // The root gathers once: n - 1 gathers, n - 1 replies up, at most one ask
  // and one whole reply per non-root member.
  const uint64_t total = sum_over_ranks(c.total_sent());
  EXPECT_LE(total, static_cast<uint64_t>(4 * (n - 1)));
  EXPECT_EQ(sum_over_ranks(c.sent[1]), static_cast<uint64_t>(n - 1)) << "one gather";
  if (rank == 0)
    std::printf("status tree: np %d fanout %d: %llu messages in all, at most %llu per process\n", n,
                k, static_cast<unsigned long long>(total),
                static_cast<unsigned long long>(max_over_ranks(c.total_sent())));
  else
    max_over_ranks(c.total_sent());
  // The timeout's view: the same ranks, other words.
  w->barrier();
  if (rank == 2 % n && !late(rank)) {
    const std::string m = mpi::peer_report(id, peers(), 5, rank, false, true);
    std::string gone;
    expected_stall(n, comm::report_max_ranks(), &gone);
    test::expect_contains(m, "never arrived: " + gone + "; also arrived: ");
  }
  w->barrier();
  StatusService::instance().remove(id);
}

TEST_F(StatusTreeMpi, NothingIsSentWhileNoOpStalls) {
  StatusService::instance().reset_tree_counts();
  w->barrier();
  for (int i = 0; i < 50; ++i) {
    int32_t one = 1;
    w->allreduce(Tensor::of(&one, 1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  w->barrier();
  const mpi::TreeCounts c = StatusService::instance().tree_counts();
  EXPECT_EQ(c.total_sent(), 0u);
  EXPECT_EQ(c.total_received(), 0u);
  w->barrier();
}

TEST_F(StatusTreeMpi, AStoppedInnerMemberIsSilentAndItsChildrenStillAnswer) {
  // Member 1 has children when the fanout is below n - 1 (np 4: fanout 2).
  const int n = w->size();
  if (mpi::tree::children(mpi::tree::locate(n, 1, fanout()).self, fanout()).empty())
    GTEST_SKIP() << "member 1 is a leaf at np " << n << ", fanout " << fanout();
  const uint64_t id = next_id();
  const int rank = w->rank();
  auto progress = publish(id, at(5, false, kAllreduce));
  int32_t pid = static_cast<int32_t>(getpid());
  std::vector<int32_t> pids(static_cast<size_t>(n));
  w->allgather(Tensor::of(&pid, 1), Tensor::of(pids));
  w->barrier();
  if (rank == 1) {
    raise(SIGSTOP);  // until rank 0 sends SIGCONT
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto t0 = std::chrono::steady_clock::now();
    const std::string m = mpi::peer_report(id, peers(), 5, rank, true, true);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<int> arrived;
    for (int r = 0; r < n; ++r)
      if (r != 1) arrived.push_back(r);
    EXPECT_EQ(m, "arrived: " + comm::format_ranks(arrived, comm::report_max_ranks()) +
                     "; missing: rank 1 (did not answer: dead, or stuck outside tutti)")
        << "rank " << rank;
    EXPECT_LT(took, config::get_int("TUTTI_STATUS_GRACE_MS") / 1000.0 + 0.5);
    // Rank 1 is stopped, so no collective tells rank 0 that every asker is
    // done: their asks started together and each ends within the grace
    // period, so rank 0 waits that long (and a margin) before resuming it.
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(
          static_cast<int>(config::get_int("TUTTI_STATUS_GRACE_MS")) + 500));
      kill(pids[1], SIGCONT);
    }
  }
  w->barrier();
  StatusService::instance().remove(id);
}

TEST_F(StatusTreeMpi, ADepartureReachesEveryMemberOnce) {
  const int n = w->size(), rank = w->rank();
  for (int leaver : {n - 1, 0}) {
    const uint64_t id = next_id();
    auto progress = publish(id, at(3, true, kAllreduce));
    StatusService::instance().reset_tree_counts();
    w->barrier();
    if (rank == leaver) {
      StatusService::instance().depart(id, peers(), 3);
    } else {
      std::vector<mpi::Departure> got;
      for (int i = 0; i < 500 && got.empty(); ++i) {
        got = StatusService::instance().departed(id);
        if (got.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ASSERT_EQ(got.size(), 1u) << "rank " << rank << " heard nothing from rank " << leaver;
      EXPECT_EQ(got[0].world_rank, leaver);
      EXPECT_EQ(got[0].last_entered, 3u);
      EXPECT_FALSE(got[0].shutdown);
    }
    w->barrier();
    const mpi::TreeCounts c = StatusService::instance().tree_counts();
    EXPECT_EQ(c.received[mpi::TreeCounts::kNotice], rank == leaver ? 0u : 1u) << "rank " << rank;
    EXPECT_LE(c.sent[mpi::TreeCounts::kNotice], static_cast<uint64_t>(fanout() + 1));
    EXPECT_EQ(sum_over_ranks(c.sent[mpi::TreeCounts::kNotice]), static_cast<uint64_t>(n - 1));
    StatusService::instance().remove(id);
    w->barrier();
  }
}

}  // namespace
}  // namespace tutti
