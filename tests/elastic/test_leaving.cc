// The leaving-host record (src/preemption/leaving.cc): which notices say
// "this node is going away", and what a rank writes for tutti-run.  One
// process; the signal cases fork a child that owns a monitor, so that the
// sender of its signal is, or is not, its parent.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "preemption/leaving.h"
#include "tutti/config.h"
#include "tutti/preemption.h"

namespace tutti {
namespace {

std::string host_name() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

struct ElasticDir {
  std::string dir;
  explicit ElasticDir(const std::string& host = "") {
    char tmpl[] = "/tmp/tutti-leaving-XXXXXX";
    dir = ::mkdtemp(tmpl);
    ::setenv("TUTTI_ELASTIC_DIR", dir.c_str(), 1);
    if (host.empty()) ::unsetenv("TUTTI_ELASTIC_HOST");
    else ::setenv("TUTTI_ELASTIC_HOST", host.c_str(), 1);
    config::reload();
  }
  ~ElasticDir() {
    ::unsetenv("TUTTI_ELASTIC_DIR");
    ::unsetenv("TUTTI_ELASTIC_HOST");
    config::reload();
    std::string cmd = "rm -rf '" + dir + "'";
    if (std::system(cmd.c_str()) != 0) ADD_FAILURE() << cmd;
  }
  std::string record_path(const std::string& host) const { return dir + "/leaving/" + host; }
  bool has(const std::string& host) const { return std::ifstream(record_path(host)).good(); }
  nlohmann::json record(const std::string& host) const {
    std::ifstream f(record_path(host));
    std::stringstream ss;
    ss << f.rdbuf();
    return nlohmann::json::parse(ss.str());
  }
};

PreemptionOptions only(const std::string& sources, const std::string& trigger = "") {
  PreemptionOptions o;
  o.sources = sources;
  o.poll_ms = 20;
  o.trigger_file = trigger;
  return o;
}

bool wait_for(const std::function<bool()>& pred, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

TEST(Leaving, WhichNoticesAreNodeLocal) {
  using preempt::notice_is_node_local;
  for (const char* s : {"file", "aws", "gcp", "azure"}) EXPECT_TRUE(notice_is_node_local(s, 0)) << s;
  EXPECT_FALSE(notice_is_node_local("SIGUSR1", static_cast<int>(::getppid())))
      << "mpirun or its daemon forwarding tutti-run's notice to every rank";
  EXPECT_TRUE(notice_is_node_local("SIGTERM", static_cast<int>(::getpid())));
  EXPECT_TRUE(notice_is_node_local("SIGTERM", 0)) << "the kernel, or another pid namespace";
  EXPECT_FALSE(notice_is_node_local("application", 0)) << "notify(): the program's own notice";
}

TEST(Leaving, TheTriggerFileRecordsThisHostOnce) {
  ElasticDir d("node-7");
  const std::string trigger = d.dir + "/trigger";
  PreemptionMonitor m(only("file", trigger));
  std::ofstream(trigger) << "x";
  ASSERT_TRUE(wait_for([&] { return d.has("node-7"); }, 10)) << "no record in " << d.dir;
  const auto rec = d.record("node-7");
  EXPECT_EQ(rec.at("host"), "node-7");
  EXPECT_EQ(rec.at("source"), "file");
  EXPECT_EQ(rec.at("pid"), static_cast<int>(::getpid()));
  const auto names = rec.at("names");
  ASSERT_EQ(names.size(), 2u) << rec.dump();
  EXPECT_EQ(names[1], host_name()) << "gethostname() listed beside TUTTI_ELASTIC_HOST";
  EXPECT_TRUE(rec.at("addresses").is_array());
  EXPECT_EQ(m.local(), NoticeKind::kStop);
}

TEST(Leaving, NothingWithoutAnElasticDirOrForAnApplicationNotice) {
  {
    ElasticDir d;
    PreemptionMonitor m(only("none"));
    m.notify(NoticeKind::kStop, "application", "done");
    EXPECT_FALSE(d.has(host_name()));
  }
  ::unsetenv("TUTTI_ELASTIC_DIR");
  config::reload();
  char tmpl[] = "/tmp/tutti-leaving-XXXXXX";
  const std::string trigger = std::string(::mkdtemp(tmpl)) + "/trigger";
  PreemptionMonitor m(only("file", trigger));
  std::ofstream(trigger) << "x";
  ASSERT_TRUE(wait_for([&] { return m.local() == NoticeKind::kStop; }, 10));
  std::string cmd = "rm -rf '" + trigger.substr(0, trigger.rfind('/')) + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

TEST(Leaving, AnExitRecordNamesHostPidAndStatus) {
  ElasticDir d("node-7");
  ::setenv("TUTTI_RESTART_COUNT", "4", 1);
  config::reload();
  preempt::record_exit(76, "allreduce #3 did not complete within 3 s");
  const std::string path = d.dir + "/exited/node-7-" + std::to_string(::getpid());
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  const auto rec = nlohmann::json::parse(ss.str());
  EXPECT_EQ(rec.at("host"), "node-7");
  EXPECT_EQ(rec.at("pid"), static_cast<int>(::getpid()));
  EXPECT_EQ(rec.at("status"), 76);
  EXPECT_EQ(rec.at("attempt"), 4);  // tutti-run ignores records of earlier jobs
  ::unsetenv("TUTTI_RESTART_COUNT");
  EXPECT_EQ(rec.at("reason"), "allreduce #3 did not complete within 3 s");
  EXPECT_FALSE(d.has("node-7"));  // not a leaving record
  ::unsetenv("TUTTI_ELASTIC_DIR");
  config::reload();
  preempt::record_exit(76, "no directory: nothing written, nothing thrown");
}

// A child owns a monitor with the signals source; `sender` sends it SIGUSR1.
// Returns whether the child recorded its host as leaving.
bool child_records_after_signal(bool from_parent) {
  ElasticDir d("child-host");
  int ready[2];
  if (::pipe(ready) != 0) return false;
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    int code = 3;
    {
      PreemptionMonitor m(only("signals"));
      if (::write(ready[1], "r", 1) != 1) ::_exit(4);
      for (int i = 0; i < 1000 && m.local() == NoticeKind::kNone; ++i) ::usleep(10000);
      code = m.local() == NoticeKind::kStop ? 0 : 5;
    }
    ::_exit(code);
  }
  ::close(ready[1]);
  char c;
  EXPECT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  if (from_parent) {
    ::kill(child, SIGUSR1);
  } else {
    const pid_t other = ::fork();  // a sibling: not the child's parent
    if (other == 0) {
      ::kill(child, SIGUSR1);
      ::_exit(0);
    }
    ::waitpid(other, nullptr, 0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  return d.has("child-host");
}

TEST(Leaving, ASignalFromTheParentIsTheJobsNoticeNotTheNodes) {
  EXPECT_FALSE(child_records_after_signal(true));
  EXPECT_TRUE(child_records_after_signal(false));
}

}  // namespace
}  // namespace tutti
