// CheckpointManager end to end, on 1-4 ranks: round trips, async isolation,
// retention, leftovers, corruption fallback, agreed failures, mismatches,
// and unusable directories (kIo from the constructor and from save()).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "checkpoint/catalog.h"
#include "checkpoint/fault_inject.h"
#include "checkpoint/file_util.h"
#include "checkpoint/safetensors.h"
#include "ckpt_test_util.h"
#include "common/test_util.h"

namespace tutti {
namespace {

using test::Blob;
using test::ScratchDir;

uint64_t seed(int64_t step, int rank) { return static_cast<uint64_t>(step) * 100 + rank; }

CheckpointOptions opts(const std::string& dir, bool async = true, int keep = 3) {
  CheckpointOptions o;
  o.dir = dir;
  o.async = async;
  o.keep_last = keep;
  o.timeout_s = 20;
  return o;
}

void set_fault(const char* spec) {
  if (spec) setenv("TUTTI_FAULT_INJECT", spec, 1);
  else unsetenv("TUTTI_FAULT_INJECT");
  fault::reload();
}

class CheckpointTest : public ::testing::TestWithParam<bool> {};

TEST_P(CheckpointTest, RoundTripsEveryDtypeAndSize) {
  auto w = world();
  ScratchDir tmp(w);
  Blob a, b({3, 64});
  CheckpointManager m(w, opts(tmp.path(), GetParam()));
  EXPECT_FALSE(m.latest_step());
  for (int64_t step : {3, 8}) {
    a.fill(seed(step, w->rank()));
    b.fill(seed(step, w->rank()) + 7);
    m.save(step, {{"a", &a}, {"b", &b}}, R"({"rng": "12 34", "epoch": 2, "step": )" +
                                             std::to_string(step) + "}");
  }
  m.wait();
  a.fill(999);
  b.fill(998);
  std::string meta;
  auto step = m.load_latest({{"a", &a}, {"b", &b}}, &meta);
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(*step, 8);
  EXPECT_TRUE(a.holds(seed(8, w->rank())));
  EXPECT_TRUE(b.holds(seed(8, w->rank()) + 7));
  EXPECT_EQ(a.loads, 1);
  EXPECT_NE(meta.find("\"rng\":\"12 34\""), std::string::npos) << meta;
  EXPECT_EQ(*m.latest_step(), 8);
  const std::string dir = tmp.sub("step-00000008");
  EXPECT_TRUE(test::exists(dir + "/manifest.json"));
  for (int r = 0; r < w->size(); ++r)
    EXPECT_TRUE(test::exists(dir + "/" + ckpt::checkpoint_name(8, 0).substr(0, 0) +
                             "rank-0000" + std::to_string(r) + ".safetensors"));
  EXPECT_EQ(test::read_text(tmp.sub("latest")), "step-00000008\n");
  EXPECT_EQ(verify_checkpoint(dir), "");
  const SaveStats st = m.last_save_stats();
  EXPECT_EQ(st.step, 8);
  EXPECT_GT(st.bytes, 0u);
}

TEST_P(CheckpointTest, AsyncSaveSnapshotsBeforeReturning) {
  auto w = world();
  ScratchDir tmp(w);
  Blob a({100000});
  CheckpointManager m(w, opts(tmp.path(), GetParam()));
  a.fill(seed(1, w->rank()));
  m.save(1, {{"a", &a}});
  a.fill(seed(2, w->rank()));  // while the writer may still be persisting
  m.wait();
  EXPECT_FALSE(m.in_flight());
  ASSERT_EQ(m.load_latest({{"a", &a}}).value_or(-1), 1);
  EXPECT_TRUE(a.holds(seed(1, w->rank())));
}

TEST_P(CheckpointTest, RetentionKeepsTheNewest) {
  auto w = world();
  ScratchDir tmp(w);
  Blob a({5});
  CheckpointManager m(w, opts(tmp.path(), GetParam(), 2));
  for (int64_t s = 1; s <= 5; ++s) {
    a.fill(seed(s, w->rank()));
    m.save(s, {{"a", &a}});
  }
  m.wait();
  w->barrier();
  EXPECT_EQ(test::complete_checkpoints(tmp.path()),
            (std::vector<std::string>{"step-00000004", "step-00000005"}));
  EXPECT_EQ(list_checkpoints(tmp.path()).size(), 2u) << "no incomplete leftovers";
}

TEST_P(CheckpointTest, LeftoverPartialDirectoriesAreHarmless) {
  auto w = world();
  ScratchDir tmp(w);
  if (w->rank() == 0) {
    for (const char* d : {"step-00000007", "step-00000099", "step-00000002.3"}) {
      ckpt::make_dirs(tmp.sub(d));
      test::write_text(tmp.sub(d) + "/rank-00000.safetensors", "garbage");
      test::write_text(tmp.sub(d) + "/.rank-00001.safetensors.tmp", "half");
    }
    test::write_text(tmp.sub(".latest.tmp.123"), "step-0000");
  }
  w->barrier();
  Blob a({9});
  CheckpointManager m(w, opts(tmp.path(), GetParam()));
  EXPECT_FALSE(m.load_latest({{"a", &a}}).has_value()) << "partial dirs are not checkpoints";
  a.fill(seed(3, w->rank()));
  m.save(3, {{"a", &a}});
  a.fill(seed(7, w->rank()));
  m.save(7, {{"a", &a}});  // reuses the leftover name step-00000007
  m.wait();
  a.fill(0);
  ASSERT_EQ(m.load_latest({{"a", &a}}).value_or(-1), 7);
  EXPECT_TRUE(a.holds(seed(7, w->rank())));
  w->barrier();
  EXPECT_FALSE(test::exists(tmp.sub("step-00000099"))) << "retention removes leftovers";
  EXPECT_FALSE(test::exists(tmp.sub("step-00000002.3")));
  EXPECT_FALSE(test::exists(tmp.sub(".latest.tmp.123")));
}

TEST_P(CheckpointTest, SavingACommittedStepAgainKeepsBoth) {
  auto w = world();
  ScratchDir tmp(w);
  Blob a({4});
  CheckpointManager m(w, opts(tmp.path(), GetParam()));
  a.fill(seed(5, w->rank()));
  m.save(5, {{"a", &a}});
  a.fill(seed(6, w->rank()));
  m.save(5, {{"a", &a}});
  m.wait();
  EXPECT_EQ(test::complete_checkpoints(tmp.path()),
            (std::vector<std::string>{"step-00000005", "step-00000005.1"}));
  a.fill(0);
  auto r = m.load({{"a", &a}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->name, "step-00000005.1");
  EXPECT_TRUE(a.holds(seed(6, w->rank())));
}

// O_DIRECT and buffered shards hold the same tensors, metadata and data
// bytes; only the header padding differs (data 4 KiB- vs 8-byte aligned).
TEST(CheckpointWrite, DirectAndBufferedShardsAgree) {
  auto w = world();
  ScratchDir tmp(w);
  Blob a({0, 1, 7, 1000, 5000});
  a.fill(seed(4, w->rank()));
  std::string files[2];
  for (int direct = 0; direct < 2; ++direct) {
    CheckpointOptions o = opts(tmp.sub(direct ? "direct" : "buffered"), false);
    o.direct_io = direct == 1;
    CheckpointManager m(w, o);
    m.save(4, {{"a", &a}});
    if (!direct) EXPECT_FALSE(m.last_save_stats().direct_io);
    files[direct] = test::read_text(o.dir + "/step-00000004/rank-0000" +
                                    std::to_string(w->rank()) + ".safetensors");
    Blob b({0, 1, 7, 1000, 5000});
    ASSERT_EQ(m.load_latest({{"a", &b}}).value_or(-1), 4);
    EXPECT_TRUE(b.holds(seed(4, w->rank())));
  }
  const auto hb = ckpt::parse_safetensors(files[0].data(), files[0].size(), 1 << 20, "b");
  const auto hd = ckpt::parse_safetensors(files[1].data(), files[1].size(), 1 << 20, "d");
  EXPECT_EQ(hb.data_start() % 8, 0u);
  EXPECT_EQ(hd.data_start() % 4096, 0u);
  EXPECT_EQ(hb.metadata, hd.metadata);
  ASSERT_EQ(hb.entries.size(), hd.entries.size());
  for (size_t i = 0; i < hb.entries.size(); ++i) {
    EXPECT_EQ(hb.entries[i].name, hd.entries[i].name);
    EXPECT_EQ(hb.entries[i].begin, hd.entries[i].begin);
  }
  EXPECT_EQ(files[0].substr(static_cast<size_t>(hb.data_start())),
            files[1].substr(static_cast<size_t>(hd.data_start())));
}

INSTANTIATE_TEST_SUITE_P(AsyncAndSync, CheckpointTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "async" : "sync"; });

// Each corruption of the newest checkpoint makes every rank fall back to
// the previous one, with its exact values.
TEST(CheckpointCorruption, FallsBackToThePreviousCheckpoint) {
  auto w = world();
  const int last = w->size() - 1;
  struct Case {
    const char* name;
    std::function<void(const std::string& dir)> spoil;
  } cases[] = {
      {"data bit flip", [&](const std::string& d) {
         test::flip_bit(d + "/rank-0000" + std::to_string(last) + ".safetensors", -3);
       }},
      {"header bit flip", [&](const std::string& d) {
         test::flip_bit(d + "/rank-0000" + std::to_string(last) + ".safetensors", 40);
       }},
      {"length prefix", [&](const std::string& d) {
         test::flip_bit(d + "/rank-00000.safetensors", 6);
       }},
      {"truncated shard", [&](const std::string& d) {
         const std::string f = d + "/rank-0000" + std::to_string(last) + ".safetensors";
         test::truncate_file(f, ckpt::file_size(f) - 5);
       }},
      {"missing shard", [&](const std::string& d) {
         ckpt::remove_file(d + "/rank-0000" + std::to_string(last) + ".safetensors");
       }},
      {"garbage manifest", [&](const std::string& d) {
         test::write_text(d + "/manifest.json", "{\"format\": \"tutti-checkpoint\", ");
       }},
      {"manifest lies about size", [&](const std::string& d) {
         std::string m = test::read_text(d + "/manifest.json");
         const size_t p = m.find("\"bytes\": ");
         m.insert(p + 9, "1");
         test::write_text(d + "/manifest.json", m);
       }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ScratchDir tmp(w);
    Blob a({33, 1000});
    CheckpointManager m(w, opts(tmp.path()));
    a.fill(seed(1, w->rank()));
    m.save(1, {{"a", &a}});
    a.fill(seed(2, w->rank()));
    m.save(2, {{"a", &a}});
    m.wait();
    w->barrier();
    if (w->rank() == 0) {
      c.spoil(tmp.sub("step-00000002"));
      EXPECT_NE(verify_checkpoint(tmp.sub("step-00000002")), "");
    }
    w->barrier();
    a.fill(0);
    auto r = m.load({{"a", &a}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 1);
    EXPECT_TRUE(a.holds(seed(1, w->rank())));
  }
}

TEST(CheckpointCorruption, NothingLoadableIsAnErrorOnEveryRank) {
  auto w = world();
  ScratchDir tmp(w);
  Blob a({10});
  CheckpointManager m(w, opts(tmp.path()));
  a.fill(1);
  m.save(1, {{"a", &a}});
  m.wait();
  w->barrier();
  if (w->rank() == 0) test::flip_bit(tmp.sub("step-00000001/rank-00000.safetensors"), -1);
  w->barrier();
  try {
    m.load_latest({{"a", &a}});
    ADD_FAILURE() << "loaded a corrupt checkpoint";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
    EXPECT_NE(std::string(e.what()).find("step-00000001"), std::string::npos) << e.what();
  }
}

TEST(CheckpointLoad, EmptyDirectoryLeavesStateUntouched) {
  auto w = world();
  ScratchDir tmp(w);
  Blob a({10});
  a.fill(42);
  CheckpointManager m(w, opts(tmp.sub("does/not/exist/yet")));
  EXPECT_FALSE(m.load_latest({{"a", &a}}).has_value());
  EXPECT_TRUE(a.holds(42));
  EXPECT_EQ(a.loads, 0);
  LoadOptions lo;
  lo.step = 4;
  try {
    m.load({{"a", &a}}, lo);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();
  }
}

TEST(CheckpointLoad, MismatchRaisesOnEveryRankUnlessOptional) {
  auto w = world();
  ScratchDir tmp(w);
  Blob a({10}), extra({3});
  CheckpointManager m(w, opts(tmp.path()));
  a.fill(seed(1, w->rank()));
  m.save(1, {{"a", &a}});
  m.wait();
  // Rank 0 alone asks for a tensor the checkpoint lacks: all ranks raise.
  Components want = {{"a", &a}};
  if (w->rank() == 0) want.push_back({"extra", &extra});
  try {
    m.load_latest(want);
    ADD_FAILURE() << "mismatch not detected";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kMismatch) << e.what();
    if (w->rank() == 0)
      EXPECT_NE(std::string(e.what()).find("tensor 'extra/t0_float32'"), std::string::npos)
          << e.what();
  }
  LoadOptions lo;
  lo.optional = {"extra/"};
  extra.fill(5);
  a.fill(0);
  auto r = m.load({{"a", &a}, {"extra", &extra}}, lo);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->skipped.size(), 8u);
  EXPECT_TRUE(a.holds(seed(1, w->rank())));
  EXPECT_TRUE(extra.holds(5)) << "optional tensors keep their value";
  Blob wrong({11});
  try {
    m.load_latest({{"a", &wrong}});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kMismatch) << e.what();
    EXPECT_NE(std::string(e.what()).find("global shape [11]"), std::string::npos) << e.what();
  }
}

TEST(CheckpointErrors, NameRankStepAndTensor) {
  auto w = world();
  ScratchDir tmp(w);
  CheckpointManager m(w, opts(tmp.path()));
  std::vector<float> x(4);
  StateDict dup = {{"x", Tensor::of(x), {}}, {"x", Tensor::of(x), {}}};
  try {
    m.save(3, dup);
    ADD_FAILURE();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(msg.find("rank " + std::to_string(w->rank()) + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find("checkpoint step 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor 'x'"), std::string::npos) << msg;
  }
  EXPECT_THROW(m.save(4, StateDict{}, "[1, 2]"), Error) << "metadata must be an object";
  EXPECT_THROW(CheckpointManager(w, CheckpointOptions{}), Error) << "no directory";
}

// A caller's mistake on one rank (invalid state, another step) raises on
// every rank at once instead of leaving the others in the commit.
TEST(CheckpointErrors, OneRanksInvalidStateRaisesEverywhere) {
  auto w = world();
  ScratchDir tmp(w);
  CheckpointManager m(w, opts(tmp.path()));
  std::vector<float> x(4);
  const int victim = w->size() - 1;
  StateDict good = {{"x", Tensor::of(x), {}}};
  StateDict bad = {{"x", Tensor::of(x), {}}, {"x", Tensor::of(x), {}}};
  const auto t0 = std::chrono::steady_clock::now();
  try {
    m.save(1, w->rank() == victim ? bad : good);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    const std::string want = w->rank() == victim ? "appears twice" : "another rank's state";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  if (w->size() > 1) {
    try {
      m.save(w->rank() == 0 ? 5 : 6, good);
      m.wait();
      ADD_FAILURE() << "ranks saving different steps went unnoticed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find("saved another step"), std::string::npos) << e.what();
    }
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  w->barrier();
  EXPECT_TRUE(test::complete_checkpoints(tmp.path()).empty());
  m.save(7, good);
  m.wait();
  EXPECT_EQ(*m.latest_step(), 7) << "the manager stays usable";
}

// A checkpoint directory that cannot be created or written is an I/O error
// (kIo; Python: CheckpointError) on every rank, from the constructor and from
// save() alike, and a file in the way is named as one, not as "File exists".
void expect_io(const std::function<void()>& call, const std::vector<std::string>& want) {
  try {
    call();
    ADD_FAILURE() << "no error; expected kIo naming: " << want.front();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(std::string(error_code_name(e.code())), error_code_name(ErrorCode::kIo)) << msg;
    for (const auto& w : want)
      EXPECT_NE(msg.find(w), std::string::npos) << "expected: " << w << "\nin: " << msg;
    EXPECT_EQ(msg.find("File exists"), std::string::npos) << msg;
  }
}

void expect_constructor_io(const ProcessGroupPtr& w, const std::string& dir,
                           const std::string& cause) {
  SCOPED_TRACE("CheckpointManager(" + dir + ")");
  expect_io([&] { CheckpointManager m(w, opts(dir)); },
            {"the checkpoint directory '" + dir + "' cannot be created or written", cause});
}

// save() after rank 0 moved the manager's directory aside and `put` something
// in its place; then the directory comes back and a save succeeds.
void expect_save_io_when_replaced(const ProcessGroupPtr& w, const ScratchDir& tmp,
                                  const std::function<void(const std::string&)>& put,
                                  const std::string& cause_after_root) {
  const std::string root = tmp.sub("ckpt");
  const std::string moved = tmp.sub("ckpt.moved");
  Blob a({10});
  CheckpointManager m(w, opts(root));
  a.fill(seed(1, w->rank()));
  m.save(1, {{"a", &a}});
  m.wait();
  w->barrier();
  if (w->rank() == 0) {
    EXPECT_EQ(::rename(root.c_str(), moved.c_str()), 0);
    put(root);
  }
  w->barrier();
  expect_io([&] {
    m.save(2, {{"a", &a}});
    m.wait();
  }, {"checkpoint step 2 not saved", "creating directory '" + root + cause_after_root});
  w->barrier();
  if (w->rank() == 0) {
    EXPECT_EQ(::unlink(root.c_str()), 0);
    EXPECT_EQ(::rename(moved.c_str(), root.c_str()), 0);
  }
  w->barrier();
  a.fill(seed(3, w->rank()));
  m.save(3, {{"a", &a}});
  m.wait();
  EXPECT_EQ(*m.latest_step(), 3) << "the manager stays usable";
}

TEST(CheckpointErrors, AFileInTheWayIsAnIoErrorFromTheConstructorAndFromSave) {
  auto w = world();
  ScratchDir tmp(w);
  const std::string file = tmp.sub("file");
  if (w->rank() == 0) test::write_text(file, "not a directory\n");
  w->barrier();
  const std::string not_a_dir = "' failed: it exists and is not a directory (a regular file)";
  expect_constructor_io(w, file, "creating directory '" + file + not_a_dir);
  expect_constructor_io(w, file + "/ckpt", "creating directory '" + file + not_a_dir);
  expect_save_io_when_replaced(
      w, tmp, [](const std::string& root) { test::write_text(root, "x"); }, not_a_dir);
}

TEST(CheckpointErrors, AnUnwritableDirectoryIsAnIoErrorFromTheConstructorAndFromSave) {
  auto w = world();
  ScratchDir tmp(w);
  const std::string ro = test::unwritable_dir(w, tmp);  // collective
  if (ro.empty())
    GTEST_SKIP() << "no directory refuses this process new entries (root without /sys)";
  expect_constructor_io(w, ro, "creating the checkpoint directory lock '" + ro + "/tutti.lock' failed");
  expect_save_io_when_replaced(
      w, tmp,
      [&](const std::string& root) { EXPECT_EQ(::symlink(ro.c_str(), root.c_str()), 0); },
      "/step-00000002' failed");
}

// One rank's failed write raises on every rank, promptly, and publishes
// nothing; the same for fsync failures of a shard and of the manifest.
TEST(CheckpointFailures, OneRankFailingRaisesEverywhere) {
  auto w = world();
  const int victim = w->size() - 1;
  const std::string spec_rank = ":rank=" + std::to_string(victim);
  struct Case {
    std::string spec;
    bool async;
  } cases[] = {{"after_shard_write:action=fail" + spec_rank, false},
               {"before_fsync:action=fail" + spec_rank, true},
               {"mid_shard_write:action=fail" + spec_rank, true},
               {"manifest_fsync:action=fail:rank=0", false},
               {"mid_manifest:action=fail:rank=0", true}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.spec);
    ScratchDir tmp(w);
    Blob a({100});
    CheckpointManager m(w, opts(tmp.path(), c.async));
    a.fill(seed(1, w->rank()));
    m.save(1, {{"a", &a}});
    m.wait();
    set_fault(c.spec.c_str());
    const auto t0 = std::chrono::steady_clock::now();
    bool raised = false;
    try {
      a.fill(seed(2, w->rank()));
      m.save(2, {{"a", &a}});
      m.wait();
    } catch (const Error& e) {
      raised = true;
      EXPECT_EQ(e.code(), ErrorCode::kIo) << e.what();
      EXPECT_NE(std::string(e.what()).find("checkpoint step 2"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("not published"), std::string::npos) << e.what();
    }
    set_fault(nullptr);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(raised);
    EXPECT_LT(secs, 10.0) << "failure must be agreed promptly, not by timeout";
    EXPECT_TRUE(test::all_ranks_ok(raised));
    w->barrier();
    EXPECT_FALSE(test::exists(tmp.sub("step-00000002/manifest.json")));
    EXPECT_EQ(test::read_text(tmp.sub("latest")), "step-00000001\n");
    a.fill(0);
    ASSERT_EQ(m.load_latest({{"a", &a}}).value_or(-1), 1);
    EXPECT_TRUE(a.holds(seed(1, w->rank())));
    // The manager stays usable after a failed save.
    a.fill(seed(3, w->rank()));
    m.save(3, {{"a", &a}});
    m.wait();
    EXPECT_EQ(*m.latest_step(), 3);
  }
}

TEST(CheckpointTimeline, ResumingFromAnOlderStepAbandonsNewerOnes) {
  auto w = world();
  ScratchDir tmp(w);
  Blob a({6});
  CheckpointManager m(w, opts(tmp.path(), true, 5));
  for (int64_t s : {10, 20}) {
    a.fill(seed(s, w->rank()));
    m.save(s, {{"a", &a}});
  }
  LoadOptions lo;
  lo.step = 10;
  ASSERT_EQ(m.load({{"a", &a}}, lo)->step, 10);
  a.fill(seed(15, w->rank()));
  m.save(15, {{"a", &a}});
  m.wait();
  w->barrier();
  EXPECT_TRUE(test::exists(tmp.sub("abandoned-step-00000020/manifest.json")));
  EXPECT_EQ(test::complete_checkpoints(tmp.path()),
            (std::vector<std::string>{"step-00000010", "step-00000015"}));
  a.fill(0);
  EXPECT_EQ(m.load_latest({{"a", &a}}).value_or(-1), 15);
  EXPECT_TRUE(a.holds(seed(15, w->rank())));
}

}  // namespace
}  // namespace tutti
