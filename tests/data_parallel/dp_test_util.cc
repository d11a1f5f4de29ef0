#include "data_parallel/dp_test_util.h"

#include <cmath>
#include <cstring>

namespace tutti {
namespace test {

std::vector<TestParam> make_params(const std::vector<ParamDecl>& decls) {
  std::vector<TestParam> out;
  for (const auto& d : decls) out.emplace_back(d);
  return out;
}

void register_all(Reducer& reducer, std::vector<TestParam>& params) {
  for (auto& p : params) reducer.add_parameter(p.name, p.param_tensor(), p.grad_tensor());
}

double stored(DType d, double v) {
  unsigned char b[8];
  store_from_double(b, d, 0, v);
  return load_as_double(b, d, 0);
}

double expected_avg(DType d, double sum, int n) {
  if (!dtype_is_floating(d)) return std::trunc(sum / n);
  if (d == DType::kFloat64) return sum / n;
  return stored(d, static_cast<double>(static_cast<float>(sum) / static_cast<float>(n)));
}

double grad_value(int rank, int param, int64_t i) {
  return rank_value(rank, i + 31 * param);
}

uint64_t world_collective_seq() {
  int32_t v = 0;
  WorkPtr w = world()->allreduce_async(Tensor::of(&v, 1));
  w->wait();
  return w->seq();
}

bool same_on_every_rank(const std::vector<unsigned char>& bytes) {
  auto w = world();
  std::vector<unsigned char> all(bytes.size() * static_cast<size_t>(w->size()));
  const int64_t n = static_cast<int64_t>(bytes.size());
  w->allgather(Tensor(const_cast<unsigned char*>(bytes.data()), DType::kUInt8, Shape{n}),
               Tensor(all.data(), DType::kUInt8, Shape{n * w->size()}));
  for (int r = 1; r < w->size(); ++r)
    if (std::memcmp(all.data(), all.data() + static_cast<size_t>(r) * bytes.size(),
                    bytes.size()) != 0)
      return false;
  return true;
}

}  // namespace test
}  // namespace tutti
