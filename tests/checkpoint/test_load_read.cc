// How a load reads (src/checkpoint/shard_reader.h): the threads it spreads
// hashing and copies over (load_workers.h), the mapping of shards in RAM
// (mapped_file.h), and loads from /dev/shm, the memory tier's medium, with
// tensors large enough to be cut among the threads: exact values, and a
// corrupt byte anywhere still rejected before any tensor is written.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/file_util.h"
#include "checkpoint/load_workers.h"
#include "checkpoint/mapped_file.h"
#include "ckpt_test_util.h"
#include "core/check.h"
#include "tutti/config.h"
#include "tutti/error.h"

namespace tutti {
namespace {

using test::Blob;
using test::ScratchDir;

bool shm_is_tmpfs() {
  struct statfs fs {};
  return ::statfs("/dev/shm", &fs) == 0 && static_cast<unsigned long>(fs.f_type) == TMPFS_MAGIC;
}

TEST(LoadWorkers, RunsEveryTaskOnceInEveryBatch) {
  ckpt::LoadWorkers workers(4);
  EXPECT_EQ(workers.threads(), 4);
  for (int batch = 0; batch < 50; ++batch) {
    const size_t n = 1 + static_cast<size_t>(batch) * 37;
    std::vector<std::atomic<int>> hits(n);
    std::atomic<uint64_t> sum{0};
    workers.run(n, [&](size_t i) {
      hits[i].fetch_add(1);
      sum.fetch_add(i);
    });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "batch " << batch << " task " << i;
    EXPECT_EQ(sum.load(), n * (n - 1) / 2);
  }
}

TEST(LoadWorkers, RethrowsTheLowestFailingTaskAndStaysUsable) {
  ckpt::LoadWorkers workers(3);
  for (int rep = 0; rep < 20; ++rep) {
    try {
      workers.run(100, [&](size_t i) {
        if (i == 93 || i == 41 || i == 7) TUTTI_THROW(kCorrupt, "task ", i);
      });
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
      EXPECT_NE(std::string(e.what()).find("task 7"), std::string::npos) << e.what();
    }
    std::atomic<int> ran{0};
    workers.run(10, [&](size_t) { ran.fetch_add(1); });
    EXPECT_EQ(ran.load(), 10);
  }
  ckpt::LoadWorkers one(1);
  std::vector<size_t> order;
  one.run(5, [&](size_t i) { order.push_back(i); });  // the calling thread, in order
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4}));
}

TEST(LoadWorkers, CountFollowsTheSetting) {
  ::setenv("TUTTI_CKPT_LOAD_THREADS", "3", 1);
  config::reload();
  EXPECT_EQ(ckpt::LoadWorkers::count_for(16), 3);
  ::unsetenv("TUTTI_CKPT_LOAD_THREADS");
  config::reload();
  const int a = ckpt::LoadWorkers::count_for(1);
  EXPECT_GE(a, 1);
  EXPECT_LE(a, ckpt::LoadWorkers::kMaxAuto);
  EXPECT_EQ(ckpt::LoadWorkers::count_for(100000), 1);  // more ranks than cores
}

// A file on tmpfs is mapped with its exact bytes; one on another file
// system, or with TUTTI_CKPT_LOAD_MMAP=0, is not.
TEST(MappedFile, OnlyFilesInRamAreMapped) {
  std::string bytes(100000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 3);
  auto w = world();
  // One file per rank: a file rewritten under another rank's mapping would
  // be SIGBUS there (mapped_file.h).
  auto map_of = [&](const std::string& dir) {
    const std::string p = dir + "/f" + std::to_string(w->rank());
    test::write_text(p, bytes);
    ckpt::File f = ckpt::File::open_read(p);
    return ckpt::MappedFile::map_if_in_ram(f.fd(), f.size());  // outlives the fd
  };
  ScratchDir disk(w);
  struct statfs fs {};
  ASSERT_EQ(::statfs(disk.path().c_str(), &fs), 0);
  if (static_cast<unsigned long>(fs.f_type) != TMPFS_MAGIC) {
    EXPECT_FALSE(map_of(disk.path()).mapped());
  }
  if (!shm_is_tmpfs()) GTEST_SKIP() << "/dev/shm is not tmpfs here";
  ScratchDir shm(w, "/dev/shm");
  const ckpt::MappedFile m = map_of(shm.path());
  ASSERT_TRUE(m.mapped());
  ASSERT_EQ(m.size(), bytes.size());
  EXPECT_EQ(std::memcmp(m.data(), bytes.data(), bytes.size()), 0);
  ::setenv("TUTTI_CKPT_LOAD_MMAP", "0", 1);
  config::reload();
  EXPECT_FALSE(map_of(shm.path()).mapped());
  ::unsetenv("TUTTI_CKPT_LOAD_MMAP");
  config::reload();
}

CheckpointOptions shm_opts(const std::string& dir) {
  CheckpointOptions o;
  o.dir = dir;
  o.async = false;
  o.keep_last = 3;
  return o;
}

// Tensors of 0 elements to 1.1 M (8.8 MB as float64: copies cut among the
// threads) loaded from /dev/shm with their exact values, with 1 and with 4
// threads; a flipped bit in the middle of the newest shard or in its last
// byte makes every rank fall back to the previous checkpoint, exactly.
TEST(LoadFromRam, ExactValuesAndCorruptionFallsBack) {
  if (!shm_is_tmpfs()) GTEST_SKIP() << "/dev/shm is not tmpfs here";
  auto w = world();
  const int last = w->size() - 1;
  const uint64_t s1 = 100 + static_cast<uint64_t>(w->rank()), s2 = s1 + 1000;
  for (const char* threads : {"1", "4"}) {
    SCOPED_TRACE(std::string("threads ") + threads);
    ::setenv("TUTTI_CKPT_LOAD_THREADS", threads, 1);
    config::reload();
    for (int64_t where : {int64_t{0}, int64_t{-1}}) {  // 0: the middle of the file
      ScratchDir tmp(w, "/dev/shm");
      Blob a({0, 7, 1000, 1100000});
      CheckpointManager m(w, shm_opts(tmp.path()));
      a.fill(s1);
      m.save(1, {{"a", &a}});
      a.fill(s2);
      m.save(2, {{"a", &a}});
      a.fill(0);
      auto r = m.load({{"a", &a}}, LoadOptions{2, {}, false});
      ASSERT_TRUE(r);
      EXPECT_EQ(r->step, 2);
      EXPECT_TRUE(a.holds(s2));
      w->barrier();
      if (w->rank() == 0) {
        const std::string f = tmp.sub("step-00000002/rank-0000" + std::to_string(last) +
                                      ".safetensors");
        test::flip_bit(f, where != 0 ? where
                                     : static_cast<int64_t>(ckpt::file_size(f) / 2));
      }
      w->barrier();
      a.fill(0);
      r = m.load({{"a", &a}});
      ASSERT_TRUE(r);
      EXPECT_EQ(r->step, 1);
      EXPECT_TRUE(a.holds(s1));
    }
  }
  ::unsetenv("TUTTI_CKPT_LOAD_THREADS");
  config::reload();
}

}  // namespace
}  // namespace tutti
