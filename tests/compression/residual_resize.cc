// Error-feedback state across a change of world size, with real processes:
// `save` at np A writes a checkpoint, `load` at np B reads it and checks.
//
//   residual_resize save DIR     every rank runs two steps of each compressor
//                                (rank-distinct gradients), then overwrites its
//                                residuals with closed-form values
//                                R_r[i] = (r + 1) * c(i), c(i) = (i % 7 - 3) / 4,
//                                dumps its whole state to DIR/ref.rank<r> and
//                                saves checkpoint 1
//   residual_resize load DIR     loads into fresh compressors and checks
//
// What load expects (A = saved world size, B = this one):
//   * A == B: every state tensor of every rank bit-identical to what that
//     rank saved (its own residual, not another rank's);
//   * A != B: every rank's residual is the mean of the saved ones,
//     (A + 1) / 2 * c(i) -- exact in float32 for A = 2 and 3 -- so the
//     error owed to the averaged gradient, (1/W) sum_r R_r, is unchanged;
//     replicated state (step counters, gradient scales, PowerSGD's Q,
//     auto's choice) is rank 0's, and ".../world" (the group the residuals
//     belong to) is B;
//   * topk_tp ran on groups of half the ranks (like data parallelism inside
//     tensor parallelism of 2): at A != B its rows are not one group's, so
//     every rank's residual restarts from zero (with a warning);
//   * in both cases a step with zero gradients of top-k with ratio 1 (it
//     sends everything) returns exactly (A + 1) / 2 * c(i): what the saved
//     job owed its average gradient.
// Prints "OK <what>" lines; any mismatch prints "FAIL ..." and exits 1.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tutti/checkpoint.h"
#include "tutti/compression.h"
#include "tutti/tutti.h"

using namespace tutti;

namespace {

constexpr int64_t kNumel = 12 * 10 + 7 + 5;  // a 12x10 matrix, a vector, a gap
int g_failures = 0;

void fail(const std::string& what) {
  std::printf("FAIL rank %d: %s\n", world()->rank(), what.c_str());
  std::fflush(stdout);
  ++g_failures;
}

double c_of(int64_t i) { return static_cast<double>(i % 7 - 3) / 4.0; }

BucketLayout layout() {
  BucketLayout l;
  l.id = 0;
  l.dtype = DType::kFloat32;
  l.numel = kNumel;
  l.slots = {{"w", 0, Shape{12, 10}}, {"b", 120, Shape{7}}};
  return l;
}

struct Algo {
  std::string component;
  std::shared_ptr<Compressor> c;
};

std::vector<Algo> make_all() {
  CompressorOptions o;
  o.topk_ratio = 0.25;
  o.powersgd_rank = 2;
  o.onebit_chunk = 32;
  o.seed = 5;
  CompressorOptions all = o;
  all.topk_ratio = 1.0;
  std::vector<Algo> out = {{"topk", make_compressor("topk", o)},
                           {"topk1", make_compressor("topk", all)},
                           {"onebit", make_compressor("onebit", o)},
                           {"powersgd", make_compressor("powersgd", o)},
                           {"topk_tp", make_compressor("topk", o)}};
  for (auto& a : out) a.c->setup(layout());
  return out;
}

Components components(std::vector<Algo>& all) {
  Components parts;
  for (auto& a : all) parts.push_back({a.component, a.c.get()});
  return parts;
}

bool is_residual(const std::string& name) {
  return name.size() >= 9 && name.compare(name.size() - 9, 9, "/residual") == 0;
}

std::vector<char> bytes_of(const Tensor& t) {
  const char* p = static_cast<const char*>(t.data());
  return std::vector<char>(p, p + t.nbytes());
}

// `half`: the group topk_tp runs on (when saving), like a data-parallel
// group inside tensor parallelism of 2: ranks of one parity.
void step_all(std::vector<Algo>& all, const std::vector<float>& grad, int64_t step,
              std::vector<float>* out_topk1 = nullptr, Communicator* half = nullptr) {
  for (auto& a : all) {
    std::vector<float> g = grad;
    CompressContext ctx;
    ctx.comm = a.component == "topk_tp" && half ? half : world().get();
    ctx.step = step;
    a.c->allreduce(0, Tensor::of(g), ctx);
    if (out_topk1 && a.component == "topk1") *out_topk1 = g;
  }
}

// The state dump: for each component, each tensor's bytes, in order.
std::string dump_path(const std::string& dir, int rank) {
  return dir + "/ref.rank" + std::to_string(rank);
}

void write_dump(std::vector<Algo>& all, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  for (auto& a : all)
    for (const auto& nt : a.c->state_dict()) {
      const auto b = bytes_of(nt.tensor);
      f.write(b.data(), static_cast<std::streamsize>(b.size()));
    }
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

int run_save(const std::string& dir) {
  const int rank = world()->rank();
  auto all = make_all();
  auto half = world()->split_group(rank % 2, rank, "half");
  for (int64_t s = 0; s < 2; ++s) {
    std::vector<float> g(kNumel);
    for (int64_t i = 0; i < kNumel; ++i)
      g[static_cast<size_t>(i)] = static_cast<float>(((i * 13 + rank * 7 + s * 3) % 17) - 8) / 8.f;
    step_all(all, g, s, nullptr, half.get());
  }
  for (auto& a : all)
    for (const auto& nt : a.c->state_dict()) {
      if (!is_residual(nt.name)) continue;
      float* r = static_cast<float*>(nt.tensor.data());
      for (int64_t i = 0; i < nt.tensor.numel(); ++i)
        r[i] = static_cast<float>((rank + 1) * c_of(i));
    }
  write_dump(all, dump_path(dir, rank));
  CheckpointOptions co;
  co.dir = dir + "/ckpt";
  co.async = false;
  CheckpointManager ckpt(world(), co);
  ckpt.save(1, components(all));
  std::printf("SAVED rank %d of %d\n", rank, world()->size());
  return 0;
}

int run_load(const std::string& dir) {
  const int rank = world()->rank(), W = world()->size();
  auto all = make_all();
  CheckpointOptions co;
  co.dir = dir + "/ckpt";
  CheckpointManager ckpt(world(), co);
  auto r = ckpt.load(components(all));
  if (!r) {
    fail("no checkpoint loaded");
    return 1;
  }
  const int A = r->saved_world_size;
  const std::vector<char> own = read_file(dump_path(dir, rank < A ? rank : 0));
  const std::vector<char> rank0 = read_file(dump_path(dir, 0));
  size_t at = 0;
  for (auto& a : all)
    for (const auto& nt : a.c->state_dict()) {
      const std::vector<char> got = bytes_of(nt.tensor);
      const std::vector<char>& ref = A == W ? own : rank0;
      if (at + got.size() > ref.size()) {
        fail("reference dump too short at " + nt.name);
        return 1;
      }
      if (is_residual(nt.name) && A != W) {
        // topk_tp's rows are of groups smaller than the checkpoint's (when
        // A > 1): no meaningful mean, the residual restarts from zero.
        const bool reset = a.component == "topk_tp" && A > 1;
        const float* v = static_cast<const float*>(nt.tensor.data());
        for (int64_t i = 0; i < nt.tensor.numel(); ++i) {
          const float want = reset ? 0.f : static_cast<float>((A + 1) / 2.0 * c_of(i));
          if (v[i] != want) {
            fail(nt.name + "[" + std::to_string(i) + "] = " + std::to_string(v[i]) +
                 ", expected the mean of the saved residuals " + std::to_string(want));
            break;
          }
        }
      } else if (A != W && nt.name.size() > 6 &&
                 nt.name.compare(nt.name.size() - 6, 6, "/world") == 0) {
        // The group the residuals now belong to: this one, or none (zero).
        const int64_t want = a.component == "topk_tp" && A > 1 ? 0 : W;
        if (*static_cast<const int64_t*>(nt.tensor.data()) != want)
          fail(nt.name + " = " + std::to_string(*static_cast<const int64_t*>(nt.tensor.data())) +
               ", expected " + std::to_string(want));
      } else if (std::memcmp(got.data(), ref.data() + at, got.size()) != 0) {
        fail(nt.name + " differs from " +
             (A == W ? "what this rank saved" : std::string("rank 0's saved value")));
      }
      at += got.size();
    }
  // What the saved job owed its average gradient, paid out by a step that
  // sends everything.
  std::vector<float> out;
  step_all(all, std::vector<float>(kNumel, 0.f), 2, &out);
  for (int64_t i = 0; i < kNumel; ++i) {
    const float want = static_cast<float>((A + 1) / 2.0 * c_of(i));
    if (out[static_cast<size_t>(i)] != want) {
      fail("topk1 average after the load [" + std::to_string(i) + "] = " +
           std::to_string(out[static_cast<size_t>(i)]) + ", expected " +
           std::to_string(want) + " (the error owed by " + std::to_string(A) + " ranks)");
      break;
    }
  }
  if (g_failures == 0) std::printf("OK rank %d: %d -> %d ranks\n", rank, A, W);
  return g_failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: residual_resize save|load DIR\n");
    return 2;
  }
  tutti::init();
  const std::string mode = argv[1], dir = argv[2];
  int rc = 2;
  try {
    rc = mode == "save" ? run_save(dir) : mode == "load" ? run_load(dir) : 2;
  } catch (const std::exception& e) {
    std::printf("FAIL rank %d: %s\n", world()->rank(), e.what());
    rc = 1;
  }
  std::fflush(stdout);
  tutti::shutdown();
  return rc;
}
