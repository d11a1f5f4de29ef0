// Every CUDA kernel path of tutti, through its public layer API, against a
// device-to-device copy of the same traffic measured in the same process:
//
//   amp          fused unscale + non-finite check (float32/16/bf16, one
//                tensor and 211 tensors), the check alone, the casts
//                float32 -> float16/bfloat16 (copy_master_to_model) and
//                float16 -> float32 (model_grads_to_master), grad norm
//   compression  each compressor's allreduce() of a float32 bucket on a
//                one-rank group (cast fp16/bf16, top-k, 1-bit, PowerSGD,
//                and "none": the plain NCCL all-reduce), encode + NCCL +
//                decode
//   comm         NCCL all-reduce, one rank (a copy inside NCCL)
//   dp           one Reducer step on CUDA gradients: copy into the fusion
//                buffer, one-rank all-reduce, the fused unflatten + average
//
//   mpirun -np 1 build/bench/gpu/bench_gpu_kernels [--sizes 1M,16M,64M]
//          [--reps 7] [--iters 20] [--tsv FILE] [--only amp,compression,comm,dp]
//
// Times: median over --reps samples of --iters calls, CUDA events on one
// stream, after 3 warm-up calls.  The amp functions wait for their
// non-finite flag / norm on the host (the API returns it), so their times
// include that round trip, as a training step pays it.  Compressors change
// the bucket in place (it becomes the average, and error-feedback state
// moves), so each call first restores the bucket from a pristine copy; that
// copy's median time (the D2D peer of the bucket) is subtracted.
// Exit 77 without a CUDA device.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/gpu/gpu_bench.h"

namespace {

using namespace tutti;
using gpubench::DeviceBuffer;
using gpubench::Table;

struct Config {
  std::vector<int64_t> sizes{1 << 20, 16 << 20, 64 << 20};
  int reps = 7, iters = 20;
  std::string only = "amp,compression,comm,dp";
  bool wants(const char* s) const { return only.find(s) != std::string::npos; }
};

Tensor dev_tensor(void* p, DType d, int64_t n, int dev) {
  return Tensor(p, d, Shape{n}, Device::cuda(dev));
}

void bench_amp(const Config& c, cudaStream_t s, int dev, Table& t) {
  t.header("amp: fused multi-tensor kernels (one rank)");
  for (int64_t n : c.sizes) {
    for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      const size_t b = static_cast<size_t>(n) * dtype_size(d);
      DeviceBuffer g(b);
      gpubench::fill(g.get(), d, n);
      std::vector<Tensor> list{dev_tensor(g.get(), d, n, dev)};
      int k = 0;  // alternating 1/2 and 2 keeps the values where they are
      const double ms = gpubench::median_ms(s, c.iters, c.reps, [&] {
        amp::unscale_and_check(list, (k++ & 1) ? 2.0f : 0.5f, s);
      });
      t.row(std::string("unscale+check ") + dtype_name(d) + ", in place", n,
            2.0 * b, ms, gpubench::copy_ms(s, b, c.iters, c.reps));
    }
    const size_t b32 = static_cast<size_t>(n) * 4, b16 = static_cast<size_t>(n) * 2;
    DeviceBuffer f32(b32), h16(b16);
    gpubench::fill(f32.get(), DType::kFloat32, n);
    gpubench::fill(h16.get(), DType::kFloat16, n);
    const double peer32 = gpubench::copy_ms(s, b32, c.iters, c.reps);
    const double peer48 = gpubench::copy_ms(s, (b32 + b16) / 2, c.iters, c.reps);
    std::vector<Tensor> l32{dev_tensor(f32.get(), DType::kFloat32, n, dev)};
    // The same elements as 211 tensors of mixed sizes (the multi-tensor
    // chunk table, as a model's gradient list).
    std::vector<Tensor> many;
    for (int64_t off = 0, i = 0; off < n; ++i) {
      const int64_t m = std::min(n - off, std::max<int64_t>(1, (n / 211) * (1 + i % 3) / 2));
      many.push_back(dev_tensor(f32.at(off * 4), DType::kFloat32, m, dev));
      off += m;
    }
    int k = 0;
    t.row("unscale+check float32, " + std::to_string(many.size()) + " tensors", n,
          2.0 * b32, gpubench::median_ms(s, c.iters, c.reps, [&] {
            amp::unscale_and_check(many, (k++ & 1) ? 2.0f : 0.5f, s);
          }), peer32);
    t.row("check only float32 (read)", n, b32,
          gpubench::median_ms(s, c.iters, c.reps, [&] { amp::check_finite(l32, s); }),
          gpubench::copy_ms(s, b32 / 2, c.iters, c.reps));
    amp::ClipOptions co;
    co.stream = s;
    t.row("grad norm float32 (read)", n, b32,
          gpubench::median_ms(s, c.iters, c.reps, [&] { amp::grad_norm(l32, co); }),
          gpubench::copy_ms(s, b32 / 2, c.iters, c.reps));
    for (DType d : {DType::kFloat16, DType::kBFloat16}) {
      std::vector<Tensor> model{dev_tensor(h16.get(), d, n, dev)};
      t.row(std::string("cast float32 -> ") + dtype_name(d) + " (master to model)", n,
            double(b32 + b16), gpubench::median_ms(s, c.iters, c.reps, [&] {
              amp::copy_master_to_model(l32, model, s);
            }), peer48);
    }
    gpubench::fill(h16.get(), DType::kFloat16, n);
    std::vector<Tensor> g16{dev_tensor(h16.get(), DType::kFloat16, n, dev)};
    t.row("cast float16 -> float32, unscaled (grads to master)", n, double(b32 + b16),
          gpubench::median_ms(s, c.iters, c.reps, [&] {
            amp::model_grads_to_master(g16, l32, 0.5f, s);
          }), peer48);
  }
}

void bench_compression(const Config& c, cudaStream_t s, int dev, Table& t,
                       const ProcessGroupPtr& world) {
  t.header("compression: Compressor::allreduce of a float32 bucket (one rank: "
           "encode + NCCL + decode)");
  for (int64_t n : c.sizes) {
    const int64_t cols = 1024, rows = n / cols;  // PowerSGD sees one matrix
    if (rows < 1) continue;
    const int64_t numel = rows * cols;
    const size_t b = static_cast<size_t>(numel) * 4;
    DeviceBuffer pristine(b), bucket(b);
    gpubench::fill(pristine.get(), DType::kFloat32, numel);
    const double peer = gpubench::copy_ms(s, b, c.iters, c.reps);
    for (const char* name : {"none", "fp16", "bf16", "topk", "onebit", "powersgd"}) {
      CompressorOptions o = CompressorOptions::from_env();
      auto comp = make_compressor(name, o);
      BucketLayout layout;
      layout.dtype = DType::kFloat32;
      layout.device = Device::cuda(dev);
      layout.numel = numel;
      layout.slots = {BucketSlot{"w", 0, Shape{rows, cols}}};
      comp->setup(layout);
      CompressContext ctx;
      ctx.comm = world.get();
      ctx.stream = s;
      const Tensor tb = dev_tensor(bucket.get(), DType::kFloat32, numel, dev);
      const double ms = gpubench::median_ms(s, c.iters, c.reps, [&] {
        GB_CUDA(cudaMemcpyAsync(bucket.get(), pristine.get(), b, cudaMemcpyDeviceToDevice, s));
        comp->allreduce(0, tb, ctx);
        ++ctx.step;
      });
      t.row(std::string("compressor ") + name + " (minus the refill copy)", numel, 2.0 * b,
            std::max(ms - peer, 1e-6), peer);
    }
  }
}

void bench_comm(const Config& c, cudaStream_t s, int dev, Table& t,
                const ProcessGroupPtr& world) {
  t.header("comm: NCCL all-reduce, one rank, float32 sum in place");
  for (int64_t n : c.sizes) {
    const size_t b = static_cast<size_t>(n) * 4;
    DeviceBuffer buf(b);
    GB_CUDA(cudaMemset(buf.get(), 0, b));
    OpOptions o;
    o.stream = s;
    o.name = "bench";
    const Tensor x = dev_tensor(buf.get(), DType::kFloat32, n, dev);
    t.row("allreduce (ProcessGroup -> NCCL)", n, 2.0 * b,
          gpubench::median_ms(s, c.iters, c.reps,
                              [&] { world->allreduce(x, ReduceOp::kSum, o); }),
          gpubench::copy_ms(s, b, c.iters, c.reps));
  }
}

void bench_dp(const Config& c, cudaStream_t s, int dev, Table& t,
              const ProcessGroupPtr& world) {
  t.header("dp: Reducer step on CUDA gradients, one rank (peer: two D2D "
           "copies of the gradients, the flatten and the unflatten)");
  for (int64_t n : c.sizes) {
    const int kParams = 64;
    const int64_t per = n / kParams;
    if (per < 1) continue;
    const size_t b = static_cast<size_t>(per) * kParams * 4;
    DeviceBuffer params(b), grads(b);
    gpubench::fill(grads.get(), DType::kFloat32, per * kParams);
    ReducerOptions ro = ReducerOptions::from_env();
    ro.compressor = nullptr;
    Reducer reducer(world, ro);
    for (int i = 0; i < kParams; ++i)
      reducer.add_parameter("p" + std::to_string(i),
                            dev_tensor(params.at(i * per * 4), DType::kFloat32, per, dev),
                            dev_tensor(grads.at(i * per * 4), DType::kFloat32, per, dev));
    reducer.build();
    const double ms = gpubench::median_ms(s, c.iters, c.reps, [&] {
      for (int i = kParams - 1; i >= 0; --i) reducer.grad_ready(i, s);
      reducer.synchronize(s);
    });
    // Traffic: the flatten and the unflatten each read and write b bytes.
    t.row("reducer step (flatten, all-reduce, unflatten+average)", per * kParams,
          4.0 * b, ms, 2 * gpubench::copy_ms(s, b, c.iters, c.reps));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  FILE* tsv = nullptr;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--sizes") c.sizes = gpubench::parse_sizes(v);
    else if (a == "--reps") c.reps = std::stoi(v);
    else if (a == "--iters") c.iters = std::stoi(v);
    else if (a == "--only") c.only = v;
    else if (a == "--tsv") tsv = std::fopen(v.c_str(), "w");
    else { std::fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
  }
  const int rc = gpubench::run("bench_gpu_kernels", [&](int dev, const ProcessGroupPtr& world,
                                                        cudaStream_t s) {
    std::printf("## bench_gpu_kernels: %s (cuda:%d), %d rank(s), median of %d x %d calls\n",
                gpubench::device_name(dev).c_str(), dev, world->size(), c.reps, c.iters);
    Table t(tsv);
    if (c.wants("amp")) bench_amp(c, s, dev, t);
    if (c.wants("compression")) bench_compression(c, s, dev, t, world);
    if (c.wants("comm")) bench_comm(c, s, dev, t, world);
    if (c.wants("dp")) bench_dp(c, s, dev, t, world);
  });
  if (tsv) std::fclose(tsv);
  return rc;
}
