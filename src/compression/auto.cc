// "auto": measures, then picks none / fp16 / PowerSGD per bucket.
//
// For its first `probe_steps` steps on a bucket, auto all-reduces the bucket
// uncompressed (exact results) and measures: a small probe all-reduce (the
// link's latency; preceded by an untimed one that lines the ranks up), the
// bucket's own all-reduce (its bandwidth), and the local arithmetic of the
// fp16 cast and of a PowerSGD step on scratch copies.  Each measurement keeps
// its minimum over the probe steps (the first step is skipped when there are
// several: it pays connection setup).  After the last probe step the ranks
// all-reduce the measurements with MAX -- every rank then holds the same
// numbers, and the decision is a deterministic function of them
// (cost_model.h), so all ranks pick the same -- and rank 0 logs it.
// Measurements and the decision are state, so a restart neither re-probes
// nor changes its mind.
#include "compression/auto.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "compression/cast.h"
#include "compression/common.h"
#include "compression/cost_model.h"
#include "compression/powersgd.h"
#include "core/check.h"
#include "tutti/log.h"

namespace tutti {
namespace compression {
namespace {

// Lossier candidates must predict at least this fraction less time.
constexpr double kMinGain = 0.10;
constexpr int64_t kProbeElems = 256;  // float32 latency probe (1 KiB)

enum Measure { kSmall = 0, kBig = 1, kCast = 2, kPsgd = 3, kMeasures = 4 };

class AutoCompressor final : public BucketCompressor {
 public:
  explicit AutoCompressor(const CompressorOptions& o)
      : BucketCompressor("auto", "compressor/auto", /*floating_only=*/true),
        probe_steps_(o.auto_probe_steps) {
    TUTTI_ARG_CHECK(probe_steps_ >= 1, "auto compressor: probe steps ",
                    probe_steps_, " must be >= 1 (TUTTI_AUTO_PROBE_STEPS)");
    none_ = make_none_compressor("compressor/auto/none");
    cast_ = make_cast_compressor(DType::kFloat16, "compressor/auto/fp16");
    PowerSgdOptions po;
    po.rank = o.powersgd_rank;
    po.start_step = 0;  // the probe steps are the warm-up
    po.min_compression = o.powersgd_min_compression;
    po.seed = o.seed;
    psgd_ = std::make_shared<PowerSgdCompressor>(po, "compressor/auto/powersgd");
  }

  Payload payload(int id, int64_t step) const override {
    const State& s = states_.at(id);
    switch (static_cast<AutoChoice>(s.choice)) {
      case AutoChoice::kNone: return none_->payload(id, step);
      case AutoChoice::kCast: return cast_->payload(id, step);
      case AutoChoice::kPowerSgd: return psgd_->payload(id, step);
    }
    Payload p = none_->payload(id, step);  // probing: bucket + 2 probes
    p.allreduce_bytes += 2 * kProbeElems * 4;
    return p;
  }

  // The decision for bucket `id`: -1 while probing, else an AutoChoice.
  int64_t choice(int id) const { return states_.at(id).choice; }

 protected:
  struct State {
    int64_t choice = -1;
    double measure[kMeasures];
    DeviceArray probe;    // float32[kProbeElems] on the bucket's device
    DeviceArray scratch;  // cast measurement: 16-bit copy + round trip
  };

  void on_setup(const BucketLayout& l) override {
    none_->setup(l);
    cast_->setup(l);
    psgd_->setup(l);
    State s;
    for (double& m : s.measure) m = -1;  // not measured yet
    s.probe = DeviceArray(l.device, kProbeElems * 4);
    states_.emplace(l.id, std::move(s));
  }

  void append_state(int id, StateDict* out) override {
    State& s = states_.at(id);
    append_state_tensor(out, state_name(id, "choice"), Tensor::of(&s.choice, 1));
    append_state_tensor(out, state_name(id, "measurements"),
                        Tensor::of(s.measure, kMeasures));
    const std::string tag = "/bucket" + std::to_string(id) + "/";
    for (BucketCompressor* inner : {none_.get(), cast_.get(),
                                    static_cast<BucketCompressor*>(psgd_.get())})
      for (NamedTensor& nt : inner->state_dict())
        if (nt.name.find(tag) != std::string::npos) out->push_back(nt);
  }

  void run(int id, const Tensor& bucket, const CompressContext& ctx,
           PhaseClock& clock) override {
    State& s = states_.at(id);
    if (s.choice >= 0) {
      BucketCompressor* inner =
          s.choice == static_cast<int64_t>(AutoChoice::kCast) ? cast_.get()
          : s.choice == static_cast<int64_t>(AutoChoice::kPowerSgd)
              ? static_cast<BucketCompressor*>(psgd_.get())
              : none_.get();
      inner->step(id, bucket, ctx, clock);
      return;
    }
    probe(id, s, bucket, ctx);
    clock.comm();
    if (steps_done(id) + 1 >= probe_steps_) decide_bucket(id, s, bucket, ctx);
  }

 private:
  static void keep_min(double* slot, double v) {
    if (*slot < 0 || v < *slot) *slot = v;
  }

  void probe(int id, State& s, const Tensor& bucket, const CompressContext& ctx) {
    const Device dev = bucket.device();
    void* st = ctx.stream;
    Communicator* comm = ctx.comm;
    const Tensor probe = s.probe.flat(DType::kFloat32);
    comm->allreduce(probe, ReduceOp::kSum, op_options(id, "probe", ctx));
    sync_stream(dev, st);
    double t0 = now_seconds();
    comm->allreduce(probe, ReduceOp::kSum, op_options(id, "probe", ctx));
    sync_stream(dev, st);
    const double t_small = now_seconds() - t0;
    t0 = now_seconds();
    comm->allreduce(bucket, ReduceOp::kAvg, op_options(id, "grad", ctx));
    sync_stream(dev, st);
    const double t_big = now_seconds() - t0;
    // Local costs on scratch: the averaged result above stays untouched.
    const int64_t n = bucket.numel();
    if (s.scratch.bytes() == 0)
      s.scratch = DeviceArray(dev, static_cast<size_t>(n) * 2 + bucket.nbytes());
    void* half = s.scratch.data();
    void* back = s.scratch.as<char>() + n * 2;
    t0 = now_seconds();
    cast_convert(dev, bucket.data(), bucket.dtype(), half, DType::kFloat16, n,
                 static_cast<float>(comm->size()), st);
    cast_convert(dev, half, DType::kFloat16, back, bucket.dtype(), n, 1.0f, st);
    sync_stream(dev, st);
    const double t_cast = now_seconds() - t0;
    const double t_psgd =
        psgd_->compressed_slots(id) > 0 ? psgd_->measure_compute(id, bucket, st) : 0;
    psgd_->release_scratch(id);
    if (probe_steps_ > 1 && steps_done(id) == 0) return;  // warm-up
    keep_min(&s.measure[kSmall], t_small);
    keep_min(&s.measure[kBig], t_big);
    keep_min(&s.measure[kCast], t_cast);
    keep_min(&s.measure[kPsgd], t_psgd);
  }

  void decide_bucket(int id, State& s, const Tensor& bucket,
                     const CompressContext& ctx) {
    const Device dev = bucket.device();
    // Every rank must hold the same numbers: the slowest rank's.
    DeviceArray agreed(dev, sizeof(s.measure));
    copy_from_host(dev, agreed.data(), s.measure, sizeof(s.measure), ctx.stream);
    ctx.comm->allreduce(agreed.flat(DType::kFloat64), ReduceOp::kMax,
                        op_options(id, "measurements", ctx));
    copy_to_host(dev, s.measure, agreed.data(), sizeof(s.measure), ctx.stream);

    const BucketLayout& l = layout(id);
    const LinkModel link = fit_link(kProbeElems * 4.0, s.measure[kSmall],
                                    static_cast<double>(bucket.nbytes()),
                                    s.measure[kBig]);
    AutoCandidates c;
    c.bucket_bytes = static_cast<double>(bucket.nbytes());
    c.cast_possible = dtype_size(l.dtype) > 2;
    c.cast_bytes = static_cast<double>(cast_->payload(id, 0).allreduce_bytes);
    c.cast_compute_s = s.measure[kCast];
    c.psgd_possible = psgd_->compressed_slots(id) > 0;
    const Payload pp = psgd_->compressed_payload(id);
    const double q_bytes = static_cast<double>(psgd_->q_elements(id)) * 4;
    c.psgd_p_bytes = static_cast<double>(pp.allreduce_bytes) - q_bytes;
    c.psgd_q_bytes = q_bytes;
    c.psgd_compute_s = s.measure[kPsgd];
    const AutoDecision d = decide(link, c, kMinGain);
    s.choice = static_cast<int64_t>(d.choice);
    s.scratch = DeviceArray();
    if (ctx.comm->rank() == 0) {
      TUTTI_LOG(kInfo) << "auto compressor: bucket " << id << " ("
                       << dtype_name(l.dtype) << "[" << l.numel << "], "
                       << c.bucket_bytes / 1048576.0 << " MiB): link "
                       << (link.seconds_per_byte > 0 ? 1e-9 / link.seconds_per_byte : 0)
                       << " GB/s + " << link.latency_s * 1e6
                       << " us; predicted ms/step none " << d.t_none * 1e3
                       << ", fp16 " << (c.cast_possible ? d.t_cast * 1e3 : NAN)
                       << ", powersgd " << (c.psgd_possible ? d.t_psgd * 1e3 : NAN)
                       << " -> " << auto_choice_name(d.choice);
    }
  }

  int probe_steps_;
  std::shared_ptr<BucketCompressor> none_, cast_;
  std::shared_ptr<PowerSgdCompressor> psgd_;
  std::map<int, State> states_;
};

}  // namespace

std::shared_ptr<BucketCompressor> make_auto_compressor(
    const CompressorOptions& options) {
  return std::make_shared<AutoCompressor>(options);
}

}  // namespace compression
}  // namespace tutti
