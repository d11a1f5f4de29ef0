#include "comm/cpu_work.h"

#include "comm/op_desc.h"

namespace tutti {
namespace comm {

void CpuWork::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool CpuWork::test() {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_ && error_) std::rethrow_exception(error_);
  return done_;
}

uint64_t CpuWork::seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seq_;
}

std::string CpuWork::description() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (request_) return describe(*request_, seq_, group_);
  return description_;
}

void CpuWork::start(uint64_t seq, std::shared_ptr<const OpRequest> request,
                    const std::string& group) {
  std::lock_guard<std::mutex> lock(mu_);
  seq_ = seq;
  request_ = std::move(request);
  group_ = group;
  if (timeline::on()) started_ns_ = timeline::now_ns();
}

// One collective on its group's track: the op as a complete event from
// start to end (args: bytes, kind, dtype, count, seq, group, backend), its
// agreement phase nested inside, and an instant where it was submitted.
void CpuWork::trace(bool failed) const {
  if (!request_ || started_ns_ == 0) return;
  const int64_t end = timeline::now_ns();
  const OpRequest& r = *request_;
  const int track = timeline::group_track(group_);
  const char* kind = collective_kind_name(r.kind);
  std::string name = kind;
  if (!r.options.name.empty()) name += " " + r.options.name;
  timeline::Args a;
  a.s("op", kind).s("name", r.options.name).i("bytes", static_cast<int64_t>(payload_bytes(r)))
      .s("dtype", dtype_name(r.input.dtype())).i("count", r.input.numel())
      .i("seq", static_cast<int64_t>(seq_)).s("group", group_).s("backend", "mpi")
      .s("algorithm", "mpi-native");
  if (r.kind == CollectiveKind::kAllreduce) a.s("reduce_op", reduce_op_name(r.op));
  if (enqueued_ns_) a.d("queued_us", static_cast<double>(started_ns_ - enqueued_ns_) / 1e3);
  if (failed) a.s("error", "failed");
  if (enqueued_ns_) {
    timeline::Args e;
    e.i("seq", static_cast<int64_t>(seq_));
    timeline::instant(track, "comm", "enqueue " + name, &e, enqueued_ns_);
  }
  timeline::complete(track, "comm", name, started_ns_, end, &a);
  if (agreed_ns_ >= started_ns_)
    timeline::complete(track, "comm", "agreement", started_ns_, agreed_ns_);
}

void CpuWork::finish(std::exception_ptr error) {
  if (timeline::on()) trace(error != nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = error;
  }
  cv_.notify_all();
}

}  // namespace comm
}  // namespace tutti
