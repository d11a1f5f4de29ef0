// The polled notice sources against a loopback HTTP server in the test
// process: malformed answers never end the process, throttling backs off,
// and a hanging endpoint never delays another source.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "preemption/notice_source.h"
#include "tutti/preemption.h"

namespace tutti {
namespace {

using Clock = std::chrono::steady_clock;

// One request at a time; `answer` maps the request line to a status and a
// body, or to status 0: hold the connection open without answering (a hung
// endpoint) until the server is destroyed.
class LoopbackServer {
 public:
  using Answer = std::function<std::pair<int, std::string>(const std::string& request_line)>;
  explicit LoopbackServer(Answer answer) : answer_(std::move(answer)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd_, 64) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      std::abort();
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~LoopbackServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
    for (int c : held_) ::close(c);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int requests() const { return requests_.load(); }
  std::vector<double> times() {
    std::lock_guard<std::mutex> lock(mu_);
    return times_;
  }

 private:
  void serve() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string req;
      char buf[4096];
      while (req.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(c, buf, sizeof(buf), 0);
        if (n <= 0) break;
        req.append(buf, static_cast<size_t>(n));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        times_.push_back(std::chrono::duration<double>(Clock::now() - t0_).count());
      }
      ++requests_;
      const auto ans = answer_(req.substr(0, req.find("\r\n")));
      if (ans.first == 0) {
        held_.push_back(c);
        continue;
      }
      const std::string resp = "HTTP/1.1 " + std::to_string(ans.first) +
                               " X\r\nContent-Type: text/plain\r\nContent-Length: " +
                               std::to_string(ans.second.size()) +
                               "\r\nConnection: close\r\n\r\n" + ans.second;
      if (::send(c, resp.data(), resp.size(), MSG_NOSIGNAL) < 0) {
      }
      ::close(c);
    }
  }

  Answer answer_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::vector<int> held_;
  std::mutex mu_;
  std::vector<double> times_;
  Clock::time_point t0_ = Clock::now();
  std::thread thread_;
};

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// Waits (bounded) for a condition the test then asserts on.
template <class F>
bool eventually(F cond, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (!cond()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Azure answered `{"Events": [{"EventType": 5}]}` and the process aborted
// (exit 134) before the first step.  Every malformed answer is "no notice";
// a well-formed Preempt after them is still seen.
TEST(PreemptionSources, MalformedAzureAnswersAreNoNotice) {
  const std::vector<std::string> bad = {
      R"({"Events": [{"EventType": 5}]})",
      R"({"Events": [{"EventType": "Preempt", "Resources": [1, null]}]})",
      R"({"Events": {"EventType": "Preempt"}})",
      R"({"Events": [{"EventType": ["Preempt"]}]})",
      R"([1, 2, 3])",
      R"({"Events": [7, "x", null]})",
      "not json",
  };
  std::atomic<int> served{0};
  std::atomic<bool> notice{false};
  LoopbackServer server([&](const std::string& line) -> std::pair<int, std::string> {
    if (contains(line, "compute/name")) return {200, "vm-under-test"};
    if (notice) return {200, R"({"Events": [{"EventType": "Preempt", "Resources": ["vm-under-test"]}]})"};
    const int i = served++;
    return {200, bad[static_cast<size_t>(i) % bad.size()]};
  });
  PreemptionOptions o;
  o.sources = "azure";
  o.poll_ms = 5;
  o.azure_url = server.url();
  PreemptionMonitor m(o);
  ASSERT_TRUE(eventually([&] { return served.load() >= 2 * static_cast<int>(bad.size()); }, 20))
      << "served " << served.load();
  EXPECT_EQ(m.local(), NoticeKind::kNone);
  notice = true;
  EXPECT_TRUE(eventually([&] { return m.local() == NoticeKind::kStop; }, 20));
  EXPECT_EQ(m.notice()->source, "azure");
}

// 429 and 5xx answers back off (doubling from 1 s) instead of polling every
// poll_ms; a good answer resets the pace.
TEST(PreemptionSources, ThrottledAnswersBackOff) {
  LoopbackServer server([&](const std::string& line) -> std::pair<int, std::string> {
    if (contains(line, "compute/name")) return {200, "vm-under-test"};
    return {429, "Too many requests"};
  });
  PreemptionOptions o;
  o.sources = "azure";
  o.poll_ms = 10;
  o.azure_url = server.url();
  PreemptionMonitor m(o);
  ASSERT_TRUE(eventually([&] { return server.requests() >= 4; }, 20));
  const auto t = server.times();
  // Requests: the VM name, then scheduledevents (429) every backoff period.
  ASSERT_GE(t.size(), 4u);
  EXPECT_GE(t[2] - t[1], 0.9) << "no backoff after the first 429";
  EXPECT_GE(t[3] - t[2], 1.8) << "the backoff doubles";
  EXPECT_EQ(m.local(), NoticeKind::kNone);
}

// AWS: the instance-action body is parsed (action and time reach the
// notice); an unreadable body from that endpoint is still a stop notice.
TEST(PreemptionSources, AwsInstanceActionIsParsed) {
  for (const char* body : {R"({"action": "stop", "time": "2026-11-23T22:50:00Z"})",
                           R"({"action": 5})"}) {
    SCOPED_TRACE(body);
    LoopbackServer server([&](const std::string& line) -> std::pair<int, std::string> {
      if (contains(line, "PUT /latest/api/token")) return {200, "token"};
      if (contains(line, "spot/instance-action")) return {200, body};
      return {404, "Not Found"};
    });
    PreemptionOptions o;
    o.sources = "aws";
    o.poll_ms = 10;
    o.aws_url = server.url();
    PreemptionMonitor m(o);
    ASSERT_TRUE(eventually([&] { return m.local() == NoticeKind::kStop; }, 20));
    const std::string detail = m.notice()->detail;
    if (contains(body, "time"))
      EXPECT_EQ(detail, "spot/instance-action: stop at 2026-11-23T22:50:00Z");
    else
      EXPECT_TRUE(contains(detail, "unreadable")) << detail;
  }
}

// The ranks of a node share one poller per endpoint (Azure IMDS allows
// about 5 requests/s per VM): three monitors (three flock holders-to-be,
// like three ranks) reach the endpoint at one poller's pace, and all three
// see its notice.
TEST(PreemptionSources, OnePollerPerNodeIsSharedByItsRanks) {
  char dir[] = "/tmp/tutti-preempt-share-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::atomic<int> events{0};
  std::atomic<bool> notice{false};
  LoopbackServer server([&](const std::string& line) -> std::pair<int, std::string> {
    if (contains(line, "compute/name")) return {200, "vm-under-test"};
    ++events;
    if (notice) return {200, R"({"Events": [{"EventType": "Preempt", "Resources": ["vm-under-test"]}]})"};
    return {200, R"({"DocumentIncarnation": 1, "Events": []})"};
  });
  {  // the monitors stop (and stop writing into dir) before it is removed
    PreemptionOptions o;
    o.sources = "azure";
    o.poll_ms = 50;
    o.azure_url = server.url();
    o.share_dir = dir;
    PreemptionMonitor a(o), b(o), c(o);
    const auto t0 = Clock::now();
    ASSERT_TRUE(eventually([&] { return events.load() >= 20; }, 30));
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    // One poller needs 19 poll intervals (0.95 s) for 20 requests; three
    // independent ones would need about a third of that.
    EXPECT_GE(took, 0.8) << "more than one rank polled the endpoint";
    notice = true;
    for (PreemptionMonitor* m : {&a, &b, &c})
      EXPECT_TRUE(eventually([&] { return m->local() == NoticeKind::kStop; }, 20));
    int followers = 0;
    for (PreemptionMonitor* m : {&a, &b, &c})
      followers += contains(m->notice()->detail, "polled by another rank") ? 1 : 0;
    EXPECT_EQ(followers, 2);
  }
  const std::string rm = std::string("rm -rf ") + dir;
  EXPECT_EQ(std::system(rm.c_str()), 0);
}

// The notice an earlier job's poller published must not stop the next job
// (tutti-run restarts within a second or two, well inside the freshness
// bound): a follower reads only what a poller published after it started.
// The demo's restarted job was stopped again at step 3 by this.
class FixedSource : public preempt::NoticeSource {
 public:
  explicit FixedSource(NoticeKind kind) : kind_(kind) {}
  const char* name() const override { return "aws"; }
  preempt::Observation poll() override {
    preempt::Observation o;
    o.kind = kind_;
    o.detail = kind_ == NoticeKind::kNone ? "" : "terminate";
    return o;
  }

 private:
  NoticeKind kind_;
};

// A source whose poll waits until released (an endpoint answering slowly).
class SlowSource : public preempt::NoticeSource {
 public:
  const char* name() const override { return "aws"; }
  preempt::Observation poll() override {
    entered = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return {};
  }
  std::atomic<bool> entered{false}, release{false};
};

TEST(PreemptionSources, AnEarlierJobsPublishedNoticeIsNotReadByTheNextJob) {
  char dir[] = "/tmp/tutti-preempt-stale-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string url = "http://127.0.0.1:1/";
  {
    // The earlier job: its poller saw the notice and published it.
    auto poller = preempt::make_node_shared(std::make_unique<FixedSource>(NoticeKind::kStop),
                                            dir, url, 50);
    ASSERT_EQ(poller->poll().kind, NoticeKind::kStop);
  }  // that job exits: its flock goes, its state file stays
  // The restarted job, where the notice is gone.  Its poller holds the
  // flock and is still waiting for the endpoint's first answer when a
  // follower reads: the leftover must not count as a notice.
  auto slow = std::make_unique<SlowSource>();
  SlowSource* inner = slow.get();
  auto leader = preempt::make_node_shared(std::move(slow), dir, url, 50);
  auto follower = preempt::make_node_shared(std::make_unique<FixedSource>(NoticeKind::kNone),
                                            dir, url, 50);
  std::thread first([&] { leader->poll(); });
  while (!inner->entered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(follower->poll().kind, NoticeKind::kNone) << "an earlier job's notice was read";
  inner->release = true;
  first.join();
  EXPECT_EQ(follower->poll().kind, NoticeKind::kNone);
  const std::string rm = std::string("rm -rf ") + dir;
  EXPECT_EQ(std::system(rm.c_str()), 0);
}

// Three endpoints that accept and never answer must not delay the trigger
// file (polled in series they delayed it by three HTTP timeouts per round).
TEST(PreemptionSources, AHangingEndpointNeverDelaysAnotherSource) {
  LoopbackServer hang([](const std::string&) { return std::make_pair(0, std::string()); });
  char path[] = "/tmp/tutti-preempt-concurrent-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  ::unlink(path);
  PreemptionOptions o;
  o.sources = "aws,gcp,azure,file";
  o.poll_ms = 20;
  o.http_timeout_ms = 3000;
  o.aws_url = o.gcp_url = o.azure_url = hang.url();
  o.trigger_file = path;
  PreemptionMonitor m(o);
  ASSERT_TRUE(eventually([&] { return hang.requests() >= 3; }, 10)) << "all three are hanging";
  const auto t0 = Clock::now();
  std::FILE* f = std::fopen(path, "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  ASSERT_TRUE(eventually([&] { return m.local() == NoticeKind::kStop; }, 15));
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(took, 2.0) << "the file waited for the hanging endpoints (timeout 3 s each)";
  EXPECT_EQ(m.notice()->source, "file");
  ::unlink(path);
}

}  // namespace
}  // namespace tutti
