// PowerSGD compressor.  See powersgd.h for the algorithm.
#include "compression/powersgd.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/gemm.h"

#if TUTTI_WITH_CUDA
#include "kernels/compression_powersgd.h"
#endif

namespace tutti {
namespace compression {

namespace {
double column_norm(const float* p, int64_t m, int64_t r, int64_t j) {
  double s = 0;
  for (int64_t row = 0; row < m; ++row)
    s += static_cast<double>(p[row * r + j]) * p[row * r + j];
  return std::sqrt(s);
}
}  // namespace

void powersgd_orthogonalize_cpu(float* p, int64_t m, int64_t r, uint64_t seed,
                                uint64_t stream) {
  for (int64_t j = 0; j < r; ++j) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      const double before = column_norm(p, m, r, j);
      // Two projection passes ("twice is enough"): one pass loses
      // orthogonality when the column is nearly dependent.
      for (int pass = 0; pass < 2; ++pass)
        for (int64_t i = 0; i < j; ++i) {
          double d = 0;
          for (int64_t row = 0; row < m; ++row)
            d += static_cast<double>(p[row * r + i]) * p[row * r + j];
          const float dot = static_cast<float>(d);
          for (int64_t row = 0; row < m; ++row) p[row * r + j] -= dot * p[row * r + i];
        }
      const double norm = column_norm(p, m, r, j);
      // NaN propagates (the loss scaler sees it); a column that (nearly)
      // vanished under projection carries no new direction.
      if (std::isnan(norm) || (norm >= 1e-30 && norm > kPowerSgdDependent * before)) {
        const float fn = static_cast<float>(norm);
        for (int64_t row = 0; row < m; ++row) p[row * r + j] /= fn;
        break;
      }
      // Re-seed it (the same on every rank) and try once more; if that
      // fails too (r exceeds the dimension), the column is zero.
      for (int64_t row = 0; row < m; ++row)
        p[row * r + j] = attempt == 0 ? hash_uniform(seed, stream,
                                                     static_cast<uint64_t>(row * r + j))
                                      : 0.0f;
    }
  }
}

void powersgd_decompress_cpu(const float* p, const float* q, int64_t m,
                             int64_t n, int64_t r, float* residual, void* grad,
                             DType dtype, float* qt) {
  // Q^T (r x n) so the inner loop runs over contiguous memory.
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = 0; k < r; ++k) qt[k * n + j] = q[j * r + k];
  constexpr int64_t kBlock = 1024;
  float row[kBlock];
  const size_t es = dtype_size(dtype);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
      const int64_t w = std::min(kBlock, n - j0);
      for (int64_t j = 0; j < w; ++j) row[j] = 0.0f;
      for (int64_t k = 0; k < r; ++k) {
        const float pk = p[i * r + k];
        const float* qk = qt + k * n + j0;
        for (int64_t j = 0; j < w; ++j) row[j] = row[j] + pk * qk[j];
      }
      float* res = residual + i * n + j0;
      for (int64_t j = 0; j < w; ++j) res[j] = res[j] - row[j];
      cpu::store_f32(row, 1.0f, static_cast<char*>(grad) + (i * n + j0) * es,
                     dtype, w);
    }
  }
}

void powersgd_initial_q(float* q, int64_t count, uint64_t seed,
                        uint64_t stream) {
  for (int64_t i = 0; i < count; ++i)
    q[i] = hash_uniform(seed, stream, static_cast<uint64_t>(i));
}

PowerSgdCompressor::PowerSgdCompressor(const PowerSgdOptions& options,
                                       const std::string& state_prefix)
    : BucketCompressor("powersgd", state_prefix, /*floating_only=*/true),
      opt_(options) {
  TUTTI_ARG_CHECK(opt_.rank >= 1, "powersgd compressor: rank ", opt_.rank,
                  " must be >= 1 (TUTTI_POWERSGD_RANK)");
  TUTTI_ARG_CHECK(opt_.start_step >= 0, "powersgd compressor: start step ",
                  opt_.start_step, " must be >= 0 (TUTTI_POWERSGD_START_STEP)");
  TUTTI_ARG_CHECK(opt_.min_compression > 0, "powersgd compressor: minimum "
                  "compression rate ", opt_.min_compression, " must be > 0");
}

void PowerSgdCompressor::on_setup(const BucketLayout& l) {
  State s;
  int64_t cursor = 0;  // bucket elements accounted for
  auto add_plain = [&](int64_t off, int64_t numel) {
    if (numel <= 0) return;
    if (!s.plain.empty() && s.plain.back().offset + s.plain.back().numel == off) {
      s.plain.back().numel += numel;  // merge with the previous range
    } else {
      s.plain.push_back({off, numel, s.plain_total});
    }
    s.plain_total += numel;
  };
  int slot_index = 0;
  for (const BucketSlot& bs : l.slots) {
    add_plain(cursor, bs.offset - cursor);  // a gap before the slot
    const int64_t numel = bs.shape.numel();
    cursor = bs.offset + numel;
    ++slot_index;
    if (bs.shape.ndim() < 2 || numel == 0) {
      add_plain(bs.offset, numel);
      continue;
    }
    Slot sl;
    sl.offset = bs.offset;
    sl.m = bs.shape[0];
    sl.n = numel / sl.m;
    sl.r = std::min<int64_t>({static_cast<int64_t>(opt_.rank), sl.m, sl.n});
    const double rate = static_cast<double>(sl.m) * static_cast<double>(sl.n) /
                        (static_cast<double>(sl.r) * static_cast<double>(sl.m + sl.n));
    if (rate < opt_.min_compression) {
      add_plain(bs.offset, numel);
      continue;
    }
    sl.res_off = s.res_total;
    sl.p_off = s.p_total;
    sl.q_off = s.q_total;
    sl.stream = (static_cast<uint64_t>(l.id) << 32) | static_cast<uint64_t>(slot_index);
    s.res_total += sl.m * sl.n;
    s.p_total += sl.m * sl.r;
    s.q_total += sl.n * sl.r;
    s.max_nr = std::max(s.max_nr, sl.n * sl.r);
    s.slots.push_back(sl);
  }
  add_plain(cursor, l.numel - cursor);  // after the last slot
  s.residual = DeviceArray(l.device, static_cast<size_t>(s.res_total) * 4);
  s.q = DeviceArray(l.device, static_cast<size_t>(s.q_total) * 4);
  s.pbuf = DeviceArray(l.device, static_cast<size_t>(s.plain_total + s.p_total) * 4);
  if (l.device.is_cpu())
    s.qt = DeviceArray(l.device, static_cast<size_t>(s.max_nr) * 4);
  // The warm start begins from a deterministic Q, the same on every rank.
  std::vector<float> q0(static_cast<size_t>(s.q_total));
  for (const Slot& sl : s.slots)
    powersgd_initial_q(q0.data() + sl.q_off, sl.n * sl.r, opt_.seed, sl.stream);
  if (l.device.is_cpu()) {
    std::copy(q0.begin(), q0.end(), s.q.as<float>());
  } else {
#if TUTTI_WITH_CUDA
    cuda::DeviceGuard g(l.device.index);
    // Landed before it returns: the first encode reads Q on the bucket's
    // (non-blocking) stream.
    cuda::copy_to_device_sync(s.q.data(), q0.data(), q0.size() * 4);
    // The orthonormalisation of every slot runs as one launch (a block per
    // slot) from this table.
    std::vector<kernels::PowerSgdOrthoSlot> table;
    for (const Slot& sl : s.slots)
      table.push_back({sl.p_off, sl.m, sl.r, sl.stream});
    s.ortho = DeviceArray(l.device, table.size() * sizeof(table[0]));
    if (!table.empty())
      cuda::copy_to_device_sync(s.ortho.data(), table.data(), s.ortho.bytes());
#endif
  }
  states_.emplace(l.id, std::move(s));
}

const DeviceArray* PowerSgdCompressor::residual(int id) const {
  return &states_.at(id).residual;
}

void PowerSgdCompressor::append_state(int id, StateDict* out) {
  // The residual is reported by the base class (residual()).
  append_state_tensor(out, state_name(id, "q"), states_.at(id).q.flat(DType::kFloat32));
}

Payload PowerSgdCompressor::compressed_payload(int id) const {
  const State& s = states_.at(id);
  Payload p;
  p.allreduce_bytes =
      static_cast<uint64_t>(s.plain_total + s.p_total + s.q_total) * 4;
  return p;
}

Payload PowerSgdCompressor::payload(int id, int64_t step) const {
  if (step < opt_.start_step) {
    Payload p;
    p.allreduce_bytes = static_cast<uint64_t>(layout(id).numel) *
                        dtype_size(layout(id).dtype);
    return p;
  }
  return compressed_payload(id);
}

int64_t PowerSgdCompressor::q_elements(int id) const {
  return states_.at(id).q_total;
}

int PowerSgdCompressor::compressed_slots(int id) const {
  return static_cast<int>(states_.at(id).slots.size());
}

namespace {

void decompress(Device dev, const float* p, const float* q, int64_t m,
                int64_t n, int64_t r, float* res, void* grad, DType dtype,
                float* qt, void* stream) {
  if (dev.is_cpu())
    return powersgd_decompress_cpu(p, q, m, n, r, res, grad, dtype, qt);
#if TUTTI_WITH_CUDA
  kernels::launch_powersgd_decompress(p, q, m, n, r, res, grad, dtype,
                                      static_cast<cudaStream_t>(stream));
#endif
}

Tensor matrix(float* data, int64_t rows, int64_t cols, Device dev) {
  return Tensor(data, DType::kFloat32, Shape{rows, cols}, dev);
}

}  // namespace

void PowerSgdCompressor::compressed_step(int id, State& s, const Tensor& bucket,
                                         float* residual, float* q,
                                         float* pbuf, Communicator* comm,
                                         const CompressContext* ctx,
                                         PhaseClock* clock) {
  const Device dev = bucket.device();
  void* stream = ctx ? ctx->stream : nullptr;
  const DType dt = bucket.dtype();
  const size_t es = bucket.element_size();
  char* grad = static_cast<char*>(bucket.data());
  const int world = comm ? comm->size() : 1;
  float* p_all = pbuf + s.plain_total;

  for (const Slot& sl : s.slots)
    accumulate_f32(dev, grad + sl.offset * es, dt, residual + sl.res_off,
                   sl.m * sl.n, stream);
  for (const Range& rg : s.plain)
    load_f32(dev, grad + rg.offset * es, dt, pbuf + rg.buf_off, rg.numel, stream);
  for (const Slot& sl : s.slots)
    blas::gemm(matrix(residual + sl.res_off, sl.m, sl.n, dev), false,
               matrix(q + sl.q_off, sl.n, sl.r, dev), false,
               matrix(p_all + sl.p_off, sl.m, sl.r, dev), 1.0f, 0.0f, stream);
  if (clock) clock->encode();
  if (comm && s.plain_total + s.p_total > 0)
    comm->allreduce(Tensor(pbuf, DType::kFloat32, Shape{s.plain_total + s.p_total}, dev),
                    ReduceOp::kSum, op_options(id, "p", *ctx));
  if (clock) clock->comm();
  for (const Range& rg : s.plain)
    store_f32(dev, pbuf + rg.buf_off, static_cast<float>(world),
              grad + rg.offset * es, dt, rg.numel, stream);
  if (s.slots.empty()) {
    if (clock) clock->decode();
    return;
  }
  // Orthonormalise every slot's P (CUDA: one launch, a block per slot),
  // then Q = M^T P per slot.
  if (dev.is_cpu()) {
    for (const Slot& sl : s.slots)
      powersgd_orthogonalize_cpu(p_all + sl.p_off, sl.m, sl.r, opt_.seed,
                                 sl.stream);
  } else {
#if TUTTI_WITH_CUDA
    kernels::launch_powersgd_orthogonalize_slots(
        p_all, s.ortho.as<kernels::PowerSgdOrthoSlot>(),
        static_cast<int64_t>(s.slots.size()), opt_.seed,
        static_cast<cudaStream_t>(stream));
#endif
  }
  for (const Slot& sl : s.slots) {
    blas::gemm(matrix(residual + sl.res_off, sl.m, sl.n, dev), true,
               matrix(p_all + sl.p_off, sl.m, sl.r, dev), false,
               matrix(q + sl.q_off, sl.n, sl.r, dev), 1.0f, 0.0f, stream);
  }
  if (clock) clock->encode();
  if (comm)
    comm->allreduce(Tensor(q, DType::kFloat32, Shape{s.q_total}, dev),
                    ReduceOp::kAvg, op_options(id, "q", *ctx));
  if (clock) clock->comm();
  float* qt = s.qt.as<float>();
  for (const Slot& sl : s.slots)
    decompress(dev, p_all + sl.p_off, q + sl.q_off, sl.m, sl.n, sl.r,
               residual + sl.res_off, grad + sl.offset * es, dt, qt, stream);
  if (clock) clock->decode();
}

void PowerSgdCompressor::run(int id, const Tensor& bucket,
                             const CompressContext& ctx, PhaseClock& clock) {
  if (ctx.step < opt_.start_step) {
    clock.encode();
    ctx.comm->allreduce(bucket, ReduceOp::kAvg, op_options(id, "grad", ctx));
    clock.comm();
    return;
  }
  State& s = states_.at(id);
  compressed_step(id, s, bucket, s.residual.as<float>(), s.q.as<float>(),
                  s.pbuf.as<float>(), ctx.comm, &ctx, &clock);
}

double PowerSgdCompressor::measure_compute(int id, const Tensor& bucket,
                                           void* stream) {
  State& s = states_.at(id);
  const Device dev = bucket.device();
  cuda::OptionalDeviceGuard on_device(dev);
  std::vector<DeviceArray>& p = s.probe;
  p.clear();
  p.emplace_back(dev, bucket.nbytes());                       // grad
  p.emplace_back(dev, static_cast<size_t>(s.res_total) * 4);  // residual
  p.emplace_back(dev, static_cast<size_t>(s.q_total) * 4);    // q
  p.emplace_back(dev, s.pbuf.bytes());                        // pbuf
  copy_bytes(dev, p[0].data(), bucket.data(), bucket.nbytes(), stream);
  copy_bytes(dev, p[2].data(), s.q.data(), s.q.bytes(), stream);
  Tensor g(p[0].data(), bucket.dtype(), bucket.shape(), dev);
  sync_stream(dev, stream);
  const double t0 = now_seconds();
  CompressContext ctx;
  ctx.stream = stream;
  compressed_step(id, s, g, p[1].as<float>(), p[2].as<float>(),
                  p[3].as<float>(), nullptr, &ctx, nullptr);
  sync_stream(dev, stream);
  return now_seconds() - t0;
}

void PowerSgdCompressor::release_scratch(int id) { states_.at(id).probe.clear(); }

}  // namespace compression
}  // namespace tutti
