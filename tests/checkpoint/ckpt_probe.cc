// A small program the script-driven checkpoint tests run as real processes
// (under mpiexec, killed with real signals, on real files).
//
//   ckpt_probe save --dir D --from A --to B [--keep K] [--sizes 0,1,7]
//                   [--no-bf16] [--sync] [--sleep-ms N] [--replicated]
//       saves steps A..B; each rank's Blob holds seed(step, rank) (with
//       --replicated: seed(step, 0) on every rank, so the once layout
//       writes each tensor once, spread over the ranks); prints
//       "COMMITTED <step>" once each save is committed (wait() returned),
//       "SAVE-FAILED <step> <code>: <message>" and exits 3 on an error.
//   ckpt_probe check --dir D [--sizes ...] [--no-bf16] [--replicated]
//       loads the newest checkpoint, checks every element against
//       seed(step, rank) (seed(step, 0)), then writes the expected state
//       afresh and compares the shard files byte for byte (a rank that
//       wrote none must have none in both); prints "LOADED <step>" or
//       "NONE"; exits 1 on any difference.
//   ckpt_probe inspect FILE
//       parses any safetensors file with tutti's parser and prints one JSON
//       line per tensor (name, dtype, shape, offsets, xxh64 of its bytes).
#include <unistd.h>

#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/file_util.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/untrusted_json.h"
#include "ckpt_test_util.h"
#include "tutti/tutti.h"

using namespace tutti;

namespace {

struct Args {
  std::string cmd, dir, file;
  int64_t from = 1, to = 1;
  int keep = 2;
  bool sync = false, no_bf16 = false, replicated = false;
  int sleep_ms = 0;
  std::vector<int64_t> sizes = {0, 1, 7, 1000};
};

Args parse(int argc, char** argv) {
  Args a;
  a.cmd = argc > 1 ? argv[1] : "";
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (k == "--dir") a.dir = next();
    else if (k == "--from") a.from = std::stoll(next());
    else if (k == "--to") a.to = std::stoll(next());
    else if (k == "--keep") a.keep = std::stoi(next());
    else if (k == "--sync") a.sync = true;
    else if (k == "--no-bf16") a.no_bf16 = true;
    else if (k == "--replicated") a.replicated = true;
    else if (k == "--sleep-ms") a.sleep_ms = std::stoi(next());
    else if (k == "--sizes") {
      a.sizes.clear();
      std::string s = next();
      for (size_t p = 0; p < s.size();) {
        size_t c = s.find(',', p);
        if (c == std::string::npos) c = s.size();
        a.sizes.push_back(std::stoll(s.substr(p, c - p)));
        p = c + 1;
      }
    } else a.file = k;
  }
  return a;
}

uint64_t seed(int64_t step, int rank) { return static_cast<uint64_t>(step) * 100 + rank; }
// The seed rank `rank` fills its Blob with.
uint64_t seed(const Args& a, int64_t step, int rank) { return seed(step, a.replicated ? 0 : rank); }

// The Blob minus its bfloat16 tensors (numpy cannot hold bfloat16).
struct ProbeState : Stateful {
  test::Blob blob;
  bool no_bf16;
  ProbeState(const std::vector<int64_t>& sizes, bool nb) : blob(sizes), no_bf16(nb) {}
  StateDict state_dict() override {
    StateDict out;
    for (auto& t : blob.state_dict())
      if (!no_bf16 || t.tensor.dtype() != DType::kBFloat16) out.push_back(t);
    return out;
  }
};

CheckpointOptions options(const Args& a, const std::string& dir) {
  CheckpointOptions o;
  o.dir = dir;
  o.keep_last = a.keep;
  o.async = !a.sync;
  return o;
}

int do_save(const Args& a) {
  auto w = world();
  ProbeState st(a.sizes, a.no_bf16);
  CheckpointManager m(w, options(a, a.dir));
  std::printf("PID %d %d\n", w->rank(), static_cast<int>(::getpid()));
  std::fflush(stdout);
  for (int64_t s = a.from; s <= a.to; ++s) {
    try {
      st.blob.fill(seed(a, s, w->rank()));
      m.save(s, {{"blob", &st}}, "{\"step\": " + std::to_string(s) + "}");
      m.wait();
    } catch (const Error& e) {
      std::printf("SAVE-FAILED %lld %s: %s\n", static_cast<long long>(s),
                  error_code_name(e.code()), e.what());
      std::fflush(stdout);
      // Peers that fail at about the same time get to report too before
      // mpiexec ends the job on this rank's exit.
      std::this_thread::sleep_for(std::chrono::seconds(2));
      return 3;
    }
    if (w->rank() == 0) std::printf("COMMITTED %lld\n", static_cast<long long>(s));
    std::fflush(stdout);
    if (a.sleep_ms) std::this_thread::sleep_for(std::chrono::milliseconds(a.sleep_ms));
  }
  return 0;
}

int do_check(const Args& a) {
  auto w = world();
  ProbeState st(a.sizes, a.no_bf16);
  st.blob.fill(7777);
  CheckpointManager m(w, options(a, a.dir));
  auto r = m.load({{"blob", &st}});
  int bad = 0;
  if (!r) {
    if (w->rank() == 0) std::printf("NONE\n");
  } else {
    const auto ok = st.blob.holds(seed(a, r->step, w->rank()));
    if (!ok) {
      std::printf("MIXED rank %d step %lld: %s\n", w->rank(),
                  static_cast<long long>(r->step), ok.message());
      bad = 1;
    }
    if (r->metadata_json != "{\"step\":" + std::to_string(r->step) + "}") {
      std::printf("BAD-METADATA rank %d: %s\n", w->rank(), r->metadata_json.c_str());
      bad = 1;
    }
    // Byte-identical: the same state written afresh gives the same shard.
    std::vector<int32_t> pid = {static_cast<int32_t>(::getpid())};
    w->broadcast(Tensor::of(pid), 0);
    const std::string fresh_dir = a.dir + "-fresh-" + std::to_string(pid[0]);
    {
      CheckpointOptions o = options(a, fresh_dir);
      o.async = false;
      CheckpointManager f(w, o);
      f.save(r->step, {{"blob", &st}}, r->metadata_json);
    }
    char shard[64];
    std::snprintf(shard, sizeof(shard), "rank-%05d.safetensors", w->rank());
    const std::string xp = a.dir + "/" + r->name + "/" + shard;
    const std::string yp = fresh_dir + "/step-" + [&] {
      char b[32];
      std::snprintf(b, sizeof(b), "%08lld", static_cast<long long>(r->step));
      return std::string(b);
    }() + "/" + shard;
    const std::string x = test::read_text(xp);
    const std::string y = test::read_text(yp);
    // Rank-distinct data: every rank writes its own copy, so its shard exists.
    const bool expect_shard = !a.replicated;
    if (x != y || test::exists(xp) != test::exists(yp) || (expect_shard && x.empty())) {
      std::printf("NOT-IDENTICAL rank %d step %lld (%zu vs %zu bytes)\n", w->rank(),
                  static_cast<long long>(r->step), x.size(), y.size());
      bad = 1;
    }
    w->barrier();
    if (w->rank() == 0) ckpt::remove_tree(fresh_dir);
    if (w->rank() == 0) std::printf("LOADED %lld\n", static_cast<long long>(r->step));
  }
  std::fflush(stdout);
  int32_t any = bad;
  w->allreduce(Tensor::of(&any, 1), ReduceOp::kMax);
  return any ? 1 : 0;
}

int do_inspect(const Args& a) {
  const std::string bytes = test::read_text(a.file);
  const ckpt::StHeader h = ckpt::parse_safetensors(bytes.data(), bytes.size(),
                                                   ckpt::max_header_bytes(), a.file);
  for (const auto& e : h.entries) {
    nlohmann::json j = {{"name", e.name},
                        {"dtype", dtype_safetensors_name(e.dtype)},
                        {"shape", e.shape},
                        {"data_offsets", {e.begin, e.end}},
                        {"xxh64", ckpt::hex64(XXH64(bytes.data() + h.data_start() + e.begin,
                                                    static_cast<size_t>(e.end - e.begin), 0))}};
    std::printf("%s\n", j.dump().c_str());
  }
  std::printf("%s\n", nlohmann::json({{"__metadata__", h.metadata}}).dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (a.cmd == "inspect") {
    try {
      return do_inspect(a);
    } catch (const Error& e) {
      std::printf("REJECTED %s\n", e.what());
      return 2;
    }
  }
  tutti::init();
  int rc = 2;
  try {
    if (a.cmd == "save") rc = do_save(a);
    else if (a.cmd == "check") rc = do_check(a);
    else std::fprintf(stderr, "usage: ckpt_probe save|check|inspect ...\n");
  } catch (const Error& e) {
    std::printf("ERROR %s\n", e.what());
    std::fflush(stdout);
    rc = 4;
  }
  tutti::shutdown();
  return rc;
}
