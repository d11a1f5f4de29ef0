// One save and one load of a data-parallel job's checkpoint, printing what
// they cost each rank as one JSON line ("SCALE {...}"); ckpt_scale.py runs it
// at several rank counts and checks the counts.
//
//   ckpt_scale_probe DIR
//
// The state: a model of kModel float32 replicated on every rank (the same
// values everywhere) and ZeRO-style optimizer state of kOpt float32 split
// flat and evenly over the ranks.  The save is synchronous; the load goes
// into poisoned tensors and is checked element by element.
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "checkpoint/agreement.h"
#include "tutti/tutti.h"

using namespace tutti;

namespace {

constexpr int64_t kModel = 2 << 20;  // 8 MiB
constexpr int64_t kOpt = 1 << 20;    // 4 MiB in all

float model_value(int64_t i) { return static_cast<float>(i % 977) * 0.25f; }
float opt_value(int64_t j) { return static_cast<float>(j) * 0.5f; }

uint64_t file_bytes(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ckpt_scale_probe DIR\n");
    return 2;
  }
  init();
  int rc = 0;
  try {
    auto w = world();
    const int W = w->size(), rank = w->rank();
    const int64_t mine = kOpt / W, first = rank * mine;
    std::vector<float> model(static_cast<size_t>(kModel)), opt(static_cast<size_t>(mine));
    for (int64_t i = 0; i < kModel; ++i) model[static_cast<size_t>(i)] = model_value(i);
    for (int64_t j = 0; j < mine; ++j) opt[static_cast<size_t>(j)] = opt_value(first + j);
    ShardInfo flat;
    flat.global_shape = {kOpt};
    flat.flat = true;
    flat.offset = first;
    flat.group = "dp";
    const StateDict state = {{"model/w", Tensor::of(model), {}},
                             {"opt/m", Tensor::of(opt), flat}};
    CheckpointOptions o;
    o.dir = argv[1];
    o.async = false;
    o.timeout_s = 120;
    CheckpointManager m(w, o);

    w->barrier();
    ckpt::reset_protocol_counts();
    auto t0 = std::chrono::steady_clock::now();
    m.save(1, state);
    const double save_s = since(t0);
    const ckpt::ProtocolCounts save = ckpt::protocol_counts();
    const SaveStats stats = m.last_save_stats();
    char shard[64];
    std::snprintf(shard, sizeof(shard), "/step-00000001/rank-%05d.safetensors", rank);
    const uint64_t shard_bytes = file_bytes(o.dir + shard);

    w->barrier();
    std::fill(model.begin(), model.end(), -1.f);
    std::fill(opt.begin(), opt.end(), -1.f);
    ckpt::reset_protocol_counts();
    t0 = std::chrono::steady_clock::now();
    const auto r = m.load(state);
    const double load_s = since(t0);
    const ckpt::ProtocolCounts load = ckpt::protocol_counts();
    bool ok = r && r->step == 1;
    for (int64_t i = 0; ok && i < kModel; ++i) ok = model[static_cast<size_t>(i)] == model_value(i);
    for (int64_t j = 0; ok && j < mine; ++j) ok = opt[static_cast<size_t>(j)] == opt_value(first + j);

    std::printf(
        "SCALE {\"rank\": %d, \"world\": %d, \"ok\": %s, \"state_bytes\": %llu, "
        "\"written_bytes\": %llu, \"shard_file_bytes\": %llu, \"save_collectives\": %llu, "
        "\"save_sent\": %llu, \"save_received\": %llu, \"load_collectives\": %llu, "
        "\"load_sent\": %llu, \"load_received\": %llu, \"load_data_broadcasts\": %llu, "
        "\"files_opened\": %llu, "
        "\"bytes_read\": %llu, \"save_s\": %.4f, \"load_s\": %.4f}\n",
        rank, W, ok ? "true" : "false", static_cast<unsigned long long>(stats.bytes),
        static_cast<unsigned long long>(stats.written_bytes),
        static_cast<unsigned long long>(shard_bytes),
        static_cast<unsigned long long>(save.collectives),
        static_cast<unsigned long long>(save.messages_sent),
        static_cast<unsigned long long>(save.messages_received),
        static_cast<unsigned long long>(load.collectives),
        static_cast<unsigned long long>(load.messages_sent),
        static_cast<unsigned long long>(load.messages_received),
        static_cast<unsigned long long>(load.data_broadcasts),
        static_cast<unsigned long long>(r ? r->files_opened : 0),
        static_cast<unsigned long long>(r ? r->bytes_read : 0), save_s, load_s);
    std::fflush(stdout);
    if (!ok) rc = 1;
  } catch (const Error& e) {
    std::printf("ERROR %s\n", e.what());
    rc = 3;
  }
  shutdown();
  return rc;
}
