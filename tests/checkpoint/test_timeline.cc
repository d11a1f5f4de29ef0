// Checkpoint timelines and the directory's history on 1-3 ranks: rollback
// on a fixed save grid, a history this job did not write, the manifest's
// own checksum, the directory lock and file permissions.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "checkpoint/catalog.h"
#include "checkpoint/dir_lock.h"
#include "checkpoint/fault_inject.h"
#include "tutti/config.h"
#include "checkpoint/file_util.h"
#include "ckpt_test_util.h"
#include "common/test_util.h"

namespace tutti {
namespace {

using test::Blob;
using test::ScratchDir;

uint64_t seed(int64_t step, int rank) { return static_cast<uint64_t>(step) * 100 + rank; }

CheckpointOptions opts(const std::string& dir, int keep = 2) {
  CheckpointOptions o;
  o.dir = dir;
  o.keep_last = keep;
  o.timeout_s = 20;
  return o;
}

void save_steps(CheckpointManager& m, Blob& a, std::initializer_list<int64_t> steps) {
  const int rank = world()->rank();
  for (int64_t s : steps) {
    a.fill(seed(s, rank));
    m.save(s, {{"a", &a}});
  }
  m.wait();
  world()->barrier();
}

std::string shard(const std::string& dir, int rank) {
  return dir + "/" + "rank-0000" + std::to_string(rank) + ".safetensors";
}

// Saves every 10 steps, keep_last 2.  Step 30 is corrupt, the job resumes
// from 20 and saves 30 again: the abandoned step 30 must neither count
// toward keep_last (which would delete the rollback point 20) nor be loaded
// when the new step 30 fails in turn.
TEST(CheckpointTimeline, RollbackOnAFixedGridNeverReturnsToTheAbandonedTimeline) {
  auto w = world();
  const int rank = w->rank();
  ScratchDir tmp(w);
  Blob a({40});
  {
    CheckpointManager m(w, opts(tmp.path()));
    save_steps(m, a, {10, 20, 30});
  }
  if (rank == 0) test::flip_bit(shard(tmp.sub("step-00000030"), 0), -2);
  w->barrier();
  CheckpointManager m(w, opts(tmp.path()));
  a.fill(0);
  ASSERT_EQ(m.load_latest({{"a", &a}}).value_or(-1), 20);
  EXPECT_TRUE(a.holds(seed(20, rank)));
  w->barrier();
  EXPECT_TRUE(test::exists(tmp.sub("abandoned-step-00000030/manifest.json")))
      << "the abandoned checkpoint is kept for inspection";
  a.fill(seed(31, rank));  // the new timeline's step 30 holds other values
  m.save(30, {{"a", &a}});
  m.wait();
  w->barrier();
  EXPECT_EQ(test::complete_checkpoints(tmp.path()),
            (std::vector<std::string>{"step-00000020", "step-00000030"}))
      << "keep_last counts only this timeline";
  if (rank == 0) test::flip_bit(shard(tmp.sub("step-00000030"), 0), -2);
  w->barrier();
  a.fill(0);
  auto r = m.load({{"a", &a}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->name, "step-00000020") << "fell back along this timeline";
  EXPECT_TRUE(a.holds(seed(20, rank)));
}

// An explicit rollback (LoadOptions::step) abandons the newer checkpoints at
// once: a restart before the first save does not jump forward again.
TEST(CheckpointTimeline, ExplicitRollbackAbandonsNewerCheckpointsAtLoad) {
  auto w = world();
  const int rank = w->rank();
  ScratchDir tmp(w);
  Blob a({8});
  CheckpointManager m(w, opts(tmp.path(), 5));
  save_steps(m, a, {10, 20, 30});
  LoadOptions lo;
  lo.step = 10;
  ASSERT_EQ(m.load({{"a", &a}}, lo)->step, 10);
  w->barrier();
  EXPECT_EQ(test::complete_checkpoints(tmp.path()), (std::vector<std::string>{"step-00000010"}));
  EXPECT_TRUE(test::exists(tmp.sub("abandoned-step-00000020/manifest.json")));
  EXPECT_TRUE(test::exists(tmp.sub("abandoned-step-00000030/manifest.json")));
  a.fill(0);
  EXPECT_EQ(m.load_latest({{"a", &a}}).value_or(-1), 10);
  EXPECT_TRUE(a.holds(seed(10, rank)));
  // A read-only load abandons nothing.
  save_steps(m, a, {20});
  lo.resume = false;
  ASSERT_EQ(m.load({{"a", &a}}, lo)->step, 10);
  w->barrier();
  EXPECT_EQ(test::complete_checkpoints(tmp.path()),
            (std::vector<std::string>{"step-00000010", "step-00000020"}));
  // The same step abandoned twice keeps both copies.
  lo.resume = true;
  ASSERT_EQ(m.load({{"a", &a}}, lo)->step, 10);
  w->barrier();
  EXPECT_TRUE(test::exists(tmp.sub("abandoned-step-00000020-2/manifest.json")));
}

// The manifest carries the RNG state, the data position and optimizer
// hyperparameters: a bit flip that keeps it valid JSON (a digit of the data
// position, a letter of a string) must fail verification like a bad shard.
TEST(CheckpointManifest, AValidJsonBitFlipFallsBackToThePreviousCheckpoint) {
  auto w = world();
  const int rank = w->rank();
  struct Case {
    const char* name;
    const char* needle;  // flip bit 0 of the byte after it
  } cases[] = {{"data position digit", "\"position\": 1"},
               {"rng string", "\"rng\": \"a"},
               {"shard tensor count", "\"tensors\": "}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ScratchDir tmp(w);
    Blob a({16});
    CheckpointManager m(w, opts(tmp.path(), 3));
    for (int64_t s : {1, 2}) {
      a.fill(seed(s, rank));
      m.save(s, {{"a", &a}},
             R"({"rng": "abc", "position": 12345, "lr": 0.001, "step": )" + std::to_string(s) +
                 "}");
    }
    m.wait();
    w->barrier();
    if (rank == 0) {
      const std::string path = tmp.sub("step-00000002/manifest.json");
      std::string text = test::read_text(path);
      const size_t at = text.find(c.needle);
      ASSERT_NE(at, std::string::npos) << text;
      text[at + std::string(c.needle).size()] ^= 0x01;  // '2' -> '3', 'b' -> 'c'
      test::write_text(path, text);
      EXPECT_NE(verify_checkpoint(tmp.sub("step-00000002")), "");
    }
    w->barrier();
    a.fill(0);
    auto r = m.load({{"a", &a}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 1);
    EXPECT_NE(r->metadata_json.find("\"step\":1"), std::string::npos) << r->metadata_json;
    EXPECT_TRUE(a.holds(seed(1, rank)));
  }
}

void set_restart_count(const char* v) {
  if (v) setenv("TUTTI_RESTART_COUNT", v, 1);
  else unsetenv("TUTTI_RESTART_COUNT");
  config::reload();
}

::testing::AssertionResult refuses_fresh_start(CheckpointManager& m, Blob& a,
                                               const std::string& why) {
  try {
    m.load_latest({{"a", &a}});
    return ::testing::AssertionFailure() << "started fresh";
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (e.code() != ErrorCode::kNotFound || msg.find("history was expected") == std::string::npos ||
        msg.find(why) == std::string::npos || msg.find(m.dir()) == std::string::npos)
      return ::testing::AssertionFailure() << msg;
    return ::testing::AssertionSuccess();
  }
}

// An empty directory where a history is expected (a restart whose volume is
// not mounted yet) is an error unless a fresh start is asked for; a first
// launch, or a restart that crashed before its first save, starts fresh.
TEST(CheckpointFreshStart, AnEmptyDirectoryWhereAHistoryIsExpectedIsAnError) {
  auto w = world();
  ScratchDir tmp(w);
  Blob a({5});
  a.fill(7);
  set_restart_count("1");
  {
    CheckpointManager m(w, opts(tmp.sub("unmounted")));
    EXPECT_TRUE(refuses_fresh_start(m, a, "restart 1"));
    EXPECT_TRUE(a.holds(7));
  }
  {
    CheckpointOptions o = opts(tmp.sub("unmounted2"));
    o.fresh_start = FreshStart::kAllow;
    CheckpointManager m(w, o);
    EXPECT_FALSE(m.load_latest({{"a", &a}}).has_value());
  }
  {
    // The first attempt ran here (its lock file is left) and died before
    // its first save: the restart starts fresh.
    { CheckpointManager first(w, opts(tmp.sub("crashed-early"))); }
    CheckpointManager m(w, opts(tmp.sub("crashed-early")));
    EXPECT_FALSE(m.load_latest({{"a", &a}}).has_value());
  }
  set_restart_count(nullptr);
  {
    // A `latest` pointer without checkpoints is a history that vanished.
    if (w->rank() == 0) {
      ckpt::make_dirs(tmp.sub("vanished"));
      test::write_text(tmp.sub("vanished/latest"), "step-00000040\n");
    }
    w->barrier();
    CheckpointManager m(w, opts(tmp.sub("vanished")));
    EXPECT_TRUE(refuses_fresh_start(m, a, "'latest' names step-00000040"));
  }
  {
    CheckpointOptions o = opts(tmp.sub("must-resume"));
    o.fresh_start = FreshStart::kRefuse;
    CheckpointManager m(w, o);
    EXPECT_TRUE(refuses_fresh_start(m, a, "fresh_start is kRefuse"));
  }
  setenv("TUTTI_CKPT_FRESH_START", "refuse", 1);
  config::reload();
  {
    CheckpointManager m(w, opts(tmp.sub("must-resume-env")));
    EXPECT_TRUE(refuses_fresh_start(m, a, "TUTTI_CKPT_FRESH_START"));
  }
  unsetenv("TUTTI_CKPT_FRESH_START");
  config::reload();
}

// The volume is mounted after the job started fresh: its first save must
// neither rename nor remove the history it did not write, and says why.
TEST(CheckpointFreshStart, AHistoryThatAppearsLaterIsNeverTouched) {
  auto w = world();
  const int rank = w->rank();
  ScratchDir tmp(w);
  Blob a({5});
  {
    CheckpointManager old(w, opts(tmp.sub("volume"), 5));
    save_steps(old, a, {100, 200});
  }
  CheckpointManager m(w, opts(tmp.sub("mountpoint"), 1));
  ASSERT_FALSE(m.load_latest({{"a", &a}}).has_value());  // first launch: fresh
  if (rank == 0)
    for (const char* d : {"step-00000100", "step-00000200"})
      ckpt::rename_path(tmp.sub("volume/") + d, tmp.sub("mountpoint/") + d);
  w->barrier();
  a.fill(seed(10, rank));
  try {
    m.save(10, {{"a", &a}});
    m.wait();
    ADD_FAILURE() << "saved beside a history it did not load";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("holds step-00000200"), std::string::npos) << e.what();
  }
  w->barrier();
  EXPECT_EQ(test::complete_checkpoints(tmp.sub("mountpoint")),
            (std::vector<std::string>{"step-00000100", "step-00000200"}));
  a.fill(0);
  EXPECT_EQ(m.load_latest({{"a", &a}}).value_or(-1), 200) << "the history is intact";
  EXPECT_TRUE(a.holds(seed(200, rank)));
}

void set_fault(const std::string& spec) {
  if (!spec.empty()) setenv("TUTTI_FAULT_INJECT", spec.c_str(), 1);
  else unsetenv("TUTTI_FAULT_INJECT");
  fault::reload();
}

// A transient read error (EIO, ESTALE, EMFILE) on one rank is retried, not
// taken for corruption: the newest checkpoint loads.  One that persists is
// Error(kIo) on every rank, and nothing falls back or is set aside.
TEST(CheckpointLoadErrors, TransientReadErrorsAreRetriedOrRaisedNeverAFallback) {
  auto w = world();
  const int rank = w->rank(), victim = w->size() - 1;
  ScratchDir tmp(w);
  Blob a({12});
  CheckpointManager m(w, opts(tmp.path(), 3));
  save_steps(m, a, {1, 2});
  set_fault("load_read:action=fail:rank=" + std::to_string(victim));
  a.fill(0);
  auto r = m.load({{"a", &a}});
  set_fault("");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->step, 2) << "one failed read fell back to an older checkpoint";
  EXPECT_TRUE(a.holds(seed(2, rank)));
  set_fault("load_read:action=fail:times=1000:rank=" + std::to_string(victim));
  bool raised = false;
  try {
    m.load({{"a", &a}});
  } catch (const Error& e) {
    raised = true;
    EXPECT_EQ(e.code(), ErrorCode::kIo) << e.what();
    EXPECT_NE(std::string(e.what()).find("step-00000002"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("injected failure at 'load_read'"), std::string::npos)
        << "every rank names the failure: " << e.what();
  }
  set_fault("");
  EXPECT_TRUE(raised);
  w->barrier();
  EXPECT_EQ(test::complete_checkpoints(tmp.path()),
            (std::vector<std::string>{"step-00000001", "step-00000002"}))
      << "a read error abandons nothing";
}

// Every rank's error names the failing file, not only the rank that found it.
TEST(CheckpointLoadErrors, EveryRankNamesTheFailingFile) {
  auto w = world();
  const int last = w->size() - 1;
  ScratchDir tmp(w);
  Blob a({12});
  CheckpointManager m(w, opts(tmp.path(), 3));
  save_steps(m, a, {1});
  const std::string bad = "rank-0000" + std::to_string(last) + ".safetensors";
  if (w->rank() == 0) test::flip_bit(shard(tmp.sub("step-00000001"), last), -1);
  w->barrier();
  try {
    m.load({{"a", &a}});
    ADD_FAILURE() << "loaded a corrupt checkpoint";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
  set_fault("after_shard_write:action=fail:rank=" + std::to_string(last));
  try {
    a.fill(seed(2, w->rank()));
    m.save(2, {{"a", &a}});
    m.wait();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo) << e.what();
    EXPECT_NE(std::string(e.what()).find("injected failure at 'after_shard_write'"),
              std::string::npos) << e.what();
  }
  set_fault("");
}

unsigned mode_of(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return 0;
  return st.st_mode & 07777;
}

// A symlink planted at the name of a temp file must not make tutti write
// through it; files are 0600 and directories 0700 unless configured.
TEST(CheckpointFiles, TempFilesNeverFollowSymlinksAndModesArePrivate) {
  auto w = world();
  const int rank = w->rank();
  ScratchDir tmp(w);
  const std::string victim = tmp.sub("victim.txt");
  int64_t pid0 = ::getpid();
  {
    std::vector<int64_t> v = {pid0};
    w->broadcast(Tensor::of(v), 0);
    pid0 = v[0];
  }
  Blob a({6});
  {
    CheckpointManager m(w, opts(tmp.sub("ckpt")));
    if (rank == 0) {
      test::write_text(victim, "precious\n");
      // write_file_atomic's temp name for `latest` in rank 0's process.
      const std::string planted = tmp.sub("ckpt/.latest.tmp." + std::to_string(pid0));
      ASSERT_EQ(::symlink(victim.c_str(), planted.c_str()), 0);
    }
    w->barrier();
    save_steps(m, a, {1});
    EXPECT_EQ(test::read_text(tmp.sub("ckpt/latest")), "step-00000001\n");
    if (rank == 0) {
      EXPECT_EQ(test::read_text(victim), "precious\n") << "wrote through a planted symlink";
      EXPECT_EQ(mode_of(tmp.sub("ckpt")), 0700u);
      EXPECT_EQ(mode_of(tmp.sub("ckpt/step-00000001")), 0700u);
      EXPECT_EQ(mode_of(tmp.sub("ckpt/step-00000001/manifest.json")), 0600u);
      EXPECT_EQ(mode_of(shard(tmp.sub("ckpt/step-00000001"), 0)), 0600u);
      EXPECT_EQ(mode_of(tmp.sub("ckpt/latest")), 0600u);
      EXPECT_EQ(mode_of(tmp.sub("ckpt/tutti.lock")), 0600u);
    }
  }
  CheckpointOptions o = opts(tmp.sub("shared"));
  o.file_mode = 0640;
  o.dir_mode = 0750;
  CheckpointManager m(w, o);
  save_steps(m, a, {1});
  if (rank == 0) {
    EXPECT_EQ(mode_of(tmp.sub("shared")), 0750u);
    EXPECT_EQ(mode_of(tmp.sub("shared/step-00000001")), 0750u);
    EXPECT_EQ(mode_of(shard(tmp.sub("shared/step-00000001"), 0)), 0640u);
    EXPECT_EQ(mode_of(tmp.sub("shared/step-00000001/manifest.json")), 0640u);
  }
}

// Runs `fn` in a forked child (file operations only, no MPI) and returns
// what it wrote to the pipe.
template <class Fn>
std::string in_child(Fn fn, pid_t* pid_out = nullptr, bool wait_for_exit = true) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const std::string out = fn();
    if (::write(fds[1], out.data(), out.size()) < 0) _exit(2);
    ::close(fds[1]);
    if (!wait_for_exit) for (;;) ::pause();
    _exit(0);
  }
  ::close(fds[1]);
  std::string got;
  char buf[4096];
  ssize_t n;
  // The child writes once and then exits or pauses: read that one message.
  if ((n = ::read(fds[0], buf, sizeof(buf))) > 0) got.assign(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  if (pid_out) *pid_out = pid;
  if (wait_for_exit) ::waitpid(pid, nullptr, 0);
  return got;
}

// A second job on the same directory refuses, naming the owner; a lock
// whose owner died (SIGKILL) is taken over.
TEST(CheckpointLock, ASecondJobRefusesAndADeadOwnersLockIsTakenOver) {
  auto w = world();
  ScratchDir tmp(w);
  if (w->rank() == 0) {
    const std::string root = tmp.sub("ckpt");
    {
      auto lock = ckpt::DirLock::acquire(root, "job-a");
      EXPECT_FALSE(lock->existed_before());
      const std::string err = in_child([&]() -> std::string {
        try {
          ckpt::DirLock::acquire(root, "job-b");
          return "acquired";
        } catch (const Error& e) {
          return e.what();
        }
      });
      EXPECT_NE(err.find("in use by job 'job-a'"), std::string::npos) << err;
      EXPECT_NE(err.find("pid " + std::to_string(::getpid())), std::string::npos) << err;
      EXPECT_NE(err.find(root), std::string::npos) << err;
      // The same process (another manager of the same job) shares the lock.
      auto again = ckpt::DirLock::acquire(root, "job-a");
      EXPECT_EQ(again.get(), lock.get());
    }
    // The owner is SIGKILLed while holding the lock: the next job takes it.
    pid_t child = 0;
    const std::string held = in_child(
        [&]() -> std::string {
          try {
            static auto keep = ckpt::DirLock::acquire(root, "job-c");
            return "held";
          } catch (const Error& e) {
            return e.what();
          }
        },
        &child, /*wait_for_exit=*/false);
    ASSERT_EQ(held, "held");
    EXPECT_THROW(ckpt::DirLock::acquire(root, "job-d"), Error) << "job-c still runs";
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    auto lock = ckpt::DirLock::acquire(root, "job-d");
    EXPECT_TRUE(lock->existed_before());
    EXPECT_NE(test::read_text(root + "/tutti.lock").find("\"job\": \"job-d\""),
              std::string::npos);
  }
  w->barrier();
}

}  // namespace
}  // namespace tutti
