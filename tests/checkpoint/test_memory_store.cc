// The memory tier's store (src/checkpoint/memory_store.h): per-user and
// per-job directories in node-local memory, their isolation, the hold
// every process of a job keeps on its directory, the sweep of directories
// that no live process holds, and the budget.  One process: a live job is
// played by a second open file description holding the lock (flock locks
// belong to it, so the sweep's exclusive try conflicts as with another
// process); a dead job's leftovers are a directory whose lock nobody holds.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/file_util.h"
#include "checkpoint/memory_store.h"
#include "tutti/error.h"

namespace tutti {
namespace ckpt {
namespace {

class MemoryStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tutti_memstore_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root = tmpl;
    user = root + "/tutti-" + std::to_string(::getuid());
  }
  void TearDown() override { remove_tree(root); }

  MemoryStoreConfig cfg(const std::string& job, uint64_t budget = 0) {
    MemoryStoreConfig c;
    c.root = root;
    c.job = job;
    c.budget_bytes = budget;
    return c;
  }
  static unsigned mode_of(const std::string& p) {
    struct stat st;
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st.st_mode & 0777;
  }
  // A dead job's leftovers: its directory and lock file, nobody holding it.
  void leftovers(const std::string& key, const std::string& file = "shard") {
    make_dirs(user + "/" + key, 0700);
    std::ofstream(user + "/" + key + "/owner.lock").put('\n');
    std::ofstream(user + "/" + key + "/" + file) << "state";
  }

  std::string root, user;
};

TEST_F(MemoryStoreTest, OpenCreatesPrivateDirectoriesAndHoldsThem) {
  auto s = MemoryStore::open(cfg("run-1"));
  EXPECT_EQ(s->dir(), user + "/run-1");
  EXPECT_EQ(s->job(), "run-1");
  EXPECT_EQ(mode_of(user), 0700u);
  EXPECT_EQ(mode_of(s->dir()), 0700u);
  EXPECT_TRUE(path_exists(s->dir() + "/owner.lock"));
  EXPECT_EQ(MemoryStore::open(cfg("run-1")).get(), s.get());  // one hold per process
  // Held: another job's sweep leaves it alone.
  EXPECT_TRUE(sweep_stale(root, "other").empty());
  EXPECT_TRUE(is_directory(s->dir()));
  // Its own job's directory is re-opened after a restart, with its contents.
  std::ofstream(s->dir() + "/step") << "x";
  s.reset();
  auto again = MemoryStore::open(cfg("run-1"));
  EXPECT_TRUE(path_exists(again->dir() + "/step"));
}

TEST_F(MemoryStoreTest, SweepRemovesDirectoriesNoLiveProcessHolds) {
  leftovers("dead-job");
  leftovers("restarting-job");
  // A live job: another open file description holds the lock shared.
  leftovers("live-job");
  const int live = ::open((user + "/live-job/owner.lock").c_str(), O_RDWR);
  ASSERT_GE(live, 0);
  ASSERT_EQ(::flock(live, LOCK_SH), 0);
  const auto removed = sweep_stale(root, "restarting-job");
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0], user + "/dead-job");
  EXPECT_FALSE(path_exists(user + "/dead-job"));
  EXPECT_TRUE(path_exists(user + "/live-job/shard"));
  EXPECT_TRUE(path_exists(user + "/restarting-job/shard"));  // the current job's
  ::close(live);  // the live job ended (killed: the kernel drops the flock)
  EXPECT_EQ(sweep_stale(root, "restarting-job").size(), 1u);
  EXPECT_FALSE(path_exists(user + "/live-job"));
  EXPECT_TRUE(sweep_stale(root, "").size() == 1u && !path_exists(user + "/restarting-job"));
}

TEST_F(MemoryStoreTest, ADirectoryWithoutLockIsRemovedOnlyOnceOld) {
  make_dirs(user + "/half-made", 0700);
  EXPECT_TRUE(sweep_stale(root, "", 60).empty());  // a process may be creating it
  struct timeval old[2] = {{std::time(nullptr) - 600, 0}, {std::time(nullptr) - 600, 0}};
  ASSERT_EQ(::utimes((user + "/half-made").c_str(), old), 0);
  EXPECT_EQ(sweep_stale(root, "", 60).size(), 1u);
  EXPECT_FALSE(path_exists(user + "/half-made"));
}

TEST_F(MemoryStoreTest, PlantedOrForeignUserDirectoriesAreRefusedNotFollowed) {
  const std::string elsewhere = root + "/elsewhere";
  make_dirs(elsewhere, 0700);
  ASSERT_EQ(::symlink(elsewhere.c_str(), user.c_str()), 0);
  try {
    MemoryStore::open(cfg("run-1"));
    FAIL() << "a symlinked per-user directory was used";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("symbolic link"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(list_dir(elsewhere).empty());
  ASSERT_EQ(::unlink(user.c_str()), 0);
  make_dirs(user, 0700);
  ASSERT_EQ(::chmod(user.c_str(), 0777), 0);
  try {
    MemoryStore::open(cfg("run-1"));
    FAIL() << "a per-user directory open to others was used";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("open to other users (mode 0777)"), std::string::npos)
        << e.what();
  }
  if (::getuid() == 0) {  // only root can hand a directory to another user
    ASSERT_EQ(::chmod(user.c_str(), 0700), 0);
    ASSERT_EQ(::chown(user.c_str(), 12345, 12345), 0);
    try {
      MemoryStore::open(cfg("run-1"));
      FAIL() << "another user's directory was used";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("belongs to user 12345"), std::string::npos)
          << e.what();
    }
  }
}

TEST_F(MemoryStoreTest, SweepNeverWorksThroughAPlantedPerUserDirectory) {
  // Another user's link at tutti-<uid> pointing at this user's files: a
  // sweep must not delete what lies behind it (nothing there holds a lock).
  const std::string victim = root + "/victim";
  make_dirs(victim + "/old-project", 0700);
  struct timeval old[2] = {{std::time(nullptr) - 600, 0}, {std::time(nullptr) - 600, 0}};
  ASSERT_EQ(::utimes((victim + "/old-project").c_str(), old), 0);
  ASSERT_EQ(::symlink(victim.c_str(), user.c_str()), 0);
  EXPECT_TRUE(sweep_stale(root, "", 60).empty());
  EXPECT_TRUE(is_directory(victim + "/old-project"));
  // A per-user directory open to others is not swept either.
  ASSERT_EQ(::unlink(user.c_str()), 0);
  make_dirs(user + "/old-job", 0700);
  ASSERT_EQ(::utimes((user + "/old-job").c_str(), old), 0);
  ASSERT_EQ(::chmod(user.c_str(), 0777), 0);
  EXPECT_TRUE(sweep_stale(root, "", 60).empty());
  EXPECT_TRUE(is_directory(user + "/old-job"));
  ASSERT_EQ(::chmod(user.c_str(), 0700), 0);
  EXPECT_EQ(sweep_stale(root, "", 60).size(), 1u);
}

TEST_F(MemoryStoreTest, ARootOthersCanWriteWithoutTheStickyBitIsRefused) {
  ASSERT_EQ(::chmod(root.c_str(), 0777), 0);
  try {
    MemoryStore::open(cfg("run-1"));
    FAIL() << "a world-writable, non-sticky TUTTI_MEM_DIR was used";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sticky"), std::string::npos) << e.what();
  }
  ASSERT_EQ(::chmod(root.c_str(), 01777), 0);
  EXPECT_NO_THROW(MemoryStore::open(cfg("run-1")));
}

TEST_F(MemoryStoreTest, BudgetCountsWhatTheJobHolds) {
  auto s = MemoryStore::open(cfg("run-1", 1000));
  EXPECT_EQ(s->budget(), 1000u);
  std::ofstream(s->dir() + "/a") << std::string(600, 'x');
  EXPECT_EQ(s->used(), 600u + file_size(s->dir() + "/owner.lock"));
  std::string why;
  EXPECT_TRUE(s->fits(300, &why));
  EXPECT_FALSE(s->fits(500, &why));
  EXPECT_NE(why.find("TUTTI_MEM_BUDGET_MB"), std::string::npos) << why;
  // Default: half the free space of the file system.
  auto d = MemoryStore::open(cfg("run-2"));
  EXPECT_GT(d->budget(), 0u);
}

TEST_F(MemoryStoreTest, JobKeysAreSafeDirectoryNames) {
  EXPECT_EQ(memory_job_key("run-1.a_b"), "run-1.a_b");
  for (const std::string& bad : std::vector<std::string>{"a/b", "..", ".", "x y", std::string(65, 'a'), ""}) {
    const std::string k = memory_job_key(bad);
    EXPECT_EQ(k.rfind("job-", 0), 0u) << bad;
    EXPECT_EQ(k.size(), 20u) << bad;
  }
  EXPECT_NE(memory_job_key("a/b"), memory_job_key("a/c"));
  auto s = MemoryStore::open(cfg("../../escape"));
  EXPECT_EQ(s->dir(), user + "/" + memory_job_key("../../escape"));
}

TEST_F(MemoryStoreTest, RemoveDeletesTheJobsDirectory) {
  auto s = MemoryStore::open(cfg("run-1"));
  std::ofstream(s->dir() + "/step") << "x";
  s->remove();
  EXPECT_FALSE(path_exists(s->dir()));
  EXPECT_TRUE(is_directory(user));
}

}  // namespace
}  // namespace ckpt
}  // namespace tutti
