// PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019): rank-r power
// iteration with error feedback and a warm-started Q.
//
// Per bucket, each slot (a gradient tensor viewed as an m x n matrix, m =
// shape[0]) whose compression rate m*n / (r*(m+n)) reaches the threshold is
// compressed; everything else (1-D tensors, small matrices, gaps between
// slots) is sent uncompressed in the same all-reduce as the P factors:
//   M   = grad + residual                      (per compressed slot)
//   P   = M Q                                  (m x r, Q warm-started)
//   all-reduce [plain | P...] (sum)
//   P   = orthonormalise(P)                    (Gram-Schmidt, per slot)
//   Q   = M^T P                                (n x r)
//   all-reduce [Q...] (average)
//   out = P Q^T;  residual = M - out
// P and Q are identical on every rank after their all-reduces, and
// orthonormalisation and decompression are deterministic, so the average is
// bit-identical everywhere.  Before the start step the bucket is all-reduced
// uncompressed (no error feedback).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compression/common.h"

namespace tutti {
namespace compression {

// CPU references of the two PowerSGD kernels.

// A column whose norm falls below this fraction of its norm before
// projection is treated as linearly dependent on the previous ones.
constexpr double kPowerSgdDependent = 1e-4;

// Orthonormalises the r columns of the row-major m x r matrix p (modified
// Gram-Schmidt with two projection passes, sums in float64).  A column that
// is zero or dependent after projection (e.g. a slot whose gradient was zero
// or has rank below r) is replaced by a deterministic pseudo-random one
// (hash_uniform(seed, stream, row * r + col)) and orthonormalised again, so
// a warm-started Q never gets stuck at zero; if that fails too it is zero.
void powersgd_orthogonalize_cpu(float* p, int64_t m, int64_t r, uint64_t seed,
                                uint64_t stream);

// out = P Q^T (P m x r, Q n x r, sums over r in ascending order from 0),
// residual -= out, grad = dtype(out).  qt_scratch: n * r floats.
void powersgd_decompress_cpu(const float* p, const float* q, int64_t m,
                             int64_t n, int64_t r, float* residual, void* grad,
                             DType dtype, float* qt_scratch);

// The deterministic initial Q of a slot: hash_uniform(seed, stream, i).
void powersgd_initial_q(float* q, int64_t count, uint64_t seed,
                        uint64_t stream);

struct PowerSgdOptions {
  int rank = 4;
  int64_t start_step = 0;
  double min_compression = 2.0;
  uint64_t seed = 0;
};

class PowerSgdCompressor final : public BucketCompressor {
 public:
  PowerSgdCompressor(const PowerSgdOptions& options,
                     const std::string& state_prefix);

  Payload payload(int id, int64_t step) const override;
  // Payload of one compressed step (whatever the start step).
  Payload compressed_payload(int id) const;
  // Elements of bucket `id`'s Q factors (the second all-reduce).
  int64_t q_elements(int id) const;
  // Slots of bucket `id` that are compressed.
  int compressed_slots(int id) const;
  // Seconds the local arithmetic of one compressed step takes on `bucket`
  // (the encode/decode cost auto weighs against the link), measured on
  // scratch copies: the compressor's state is untouched.
  double measure_compute(int id, const Tensor& bucket, void* stream);
  // Frees the scratch measure_compute() allocated for bucket `id`.
  void release_scratch(int id);

 protected:
  void on_setup(const BucketLayout& layout) override;
  void run(int id, const Tensor& bucket, const CompressContext& ctx,
           PhaseClock& clock) override;
  void append_state(int id, StateDict* out) override;
  // Q is a direction (re-orthogonalised every step): only the error scales.
  const DeviceArray* residual(int id) const override;

 private:
  struct Slot {
    int64_t offset = 0;  // in the bucket
    int64_t m = 0, n = 0, r = 0;
    int64_t res_off = 0;  // in residual
    int64_t p_off = 0;    // in pbuf (after the plain part)
    int64_t q_off = 0;    // in q
    uint64_t stream = 0;  // hash stream for Q init / column re-seeding
  };
  struct Range {
    int64_t offset = 0, numel = 0, buf_off = 0;
  };
  struct State {
    std::vector<Slot> slots;
    std::vector<Range> plain;
    int64_t plain_total = 0, res_total = 0, p_total = 0, q_total = 0;
    int64_t max_nr = 0;
    DeviceArray residual;  // float32[res_total]
    DeviceArray q;         // float32[q_total]
    DeviceArray pbuf;      // float32[plain_total + p_total]
    DeviceArray qt;        // CPU: float32[max_nr] decompression scratch
    DeviceArray ortho;     // CUDA: the slots' kernels::PowerSgdOrthoSlot
                           // table, uploaded once in on_setup()
    std::vector<DeviceArray> probe;  // measure_compute()'s copies
  };
  // One compressed step's arithmetic on explicit buffers (run() and
  // measure_compute() share it); comm == nullptr skips the all-reduces.
  void compressed_step(int id, State& s, const Tensor& bucket, float* residual,
                       float* q, float* pbuf, Communicator* comm,
                       const CompressContext* ctx, PhaseClock* clock);

  PowerSgdOptions opt_;
  std::map<int, State> states_;
};

}  // namespace compression
}  // namespace tutti
