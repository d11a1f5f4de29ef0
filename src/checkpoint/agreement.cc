#include "checkpoint/agreement.h"

#include "core/check.h"
#include "tutti/config.h"

namespace tutti {
namespace ckpt {

OpOptions Agreement::options(const char* phase) const {
  OpOptions o;
  o.name = what_ + ": " + phase;
  o.timeout_s = timeout_s_;
  return o;
}

int64_t Agreement::broadcast(int64_t value, int root, const char* phase) {
  comm_.broadcast(Tensor::of(&value, 1), root, options(phase));
  return value;
}

std::vector<int64_t> Agreement::allgather(const std::vector<int64_t>& mine,
                                          const char* phase) {
  std::vector<int64_t> in = mine;
  std::vector<int64_t> out(mine.size() * static_cast<size_t>(comm_.size()));
  comm_.allgather(Tensor::of(in), Tensor::of(out), options(phase));
  return out;
}

int64_t Agreement::allreduce_max(int64_t value, const char* phase) {
  comm_.allreduce(Tensor::of(&value, 1), ReduceOp::kMax, options(phase));
  return value;
}

std::string Agreement::broadcast(const std::string& text, int root, const char* phase) {
  int64_t n = static_cast<int64_t>(text.size());
  n = broadcast(n, root, phase);
  if (n == 0) return std::string();
  std::vector<uint8_t> buf(static_cast<size_t>(n));
  if (comm_.rank() == root) buf.assign(text.begin(), text.end());
  comm_.broadcast(Tensor::of(buf), root, options(phase));
  return std::string(buf.begin(), buf.end());
}

std::vector<std::string> Agreement::allgather_text(const std::string& text, const char* phase) {
  const std::vector<int64_t> lens =
      allgather(std::vector<int64_t>{static_cast<int64_t>(text.size())}, phase);
  std::vector<std::string> out(lens.size());
  for (size_t r = 0; r < lens.size(); ++r)
    if (lens[r] > 0) out[r] = broadcast(text, static_cast<int>(r), phase);
  return out;
}

double agreement_timeout(double requested) {
  if (requested > 0) return requested;
  const double ckpt = config::get_double("TUTTI_CKPT_TIMEOUT");
  if (ckpt > 0) return ckpt;
  return config::get_double("TUTTI_TIMEOUT");
}

}  // namespace ckpt
}  // namespace tutti
