#include "common/test_util.h"

#include <cmath>
#include <sstream>

namespace tutti {
namespace test {

double rank_value(int rank, int64_t i) {
  // In [-8, 24]: sums of up to 4 ranks stay well inside float16's exact
  // integer range and products of 4 stay below 2^19.
  return static_cast<double>((i * 7 + rank * 13) % 17) - 8.0 + rank;
}

::testing::AssertionResult matches(const Buffer& b,
                                   const std::function<double(int64_t)>& expected,
                                   double tol) {
  const std::vector<double> got = b.values();
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double a = got[static_cast<size_t>(i)], e = expected(i);
    const bool both_nan = std::isnan(a) && std::isnan(e);
    const bool ok = both_nan || (tol > 0 ? std::fabs(a - e) <= tol * std::max(1.0, std::fabs(e)) : a == e);
    if (!ok) {
      return ::testing::AssertionFailure()
             << dtype_name(b.dtype) << "[" << b.numel() << "] element " << i
             << " is " << a << ", expected " << e;
    }
  }
  return ::testing::AssertionSuccess();
}

std::string expect_error(const std::function<void()>& op, ErrorCode code) {
  try {
    op();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error was raised";
  return "";
}

void expect_contains(const std::string& s, const std::string& part) {
  EXPECT_NE(s.find(part), std::string::npos) << "'" << part << "' not in: " << s;
}

namespace {
bool& needs_nccl_flag() {
  static bool flag = false;  // set during static initialisation, read in main()
  return flag;
}
std::string& transport_name() {
  static std::string name;
  return name;
}
}  // namespace

bool declare_needs_nccl() {
  needs_nccl_flag() = true;
  return true;
}
bool needs_nccl() { return needs_nccl_flag(); }
const std::string& gpu_transport() { return transport_name(); }
void set_gpu_transport(const std::string& transport) { transport_name() = transport; }

bool all_ranks_ok(bool ok) {
  int32_t v = ok ? 1 : 0;
  world()->allreduce(Tensor::of(&v, 1), ReduceOp::kMin);
  return v == 1;
}

}  // namespace test
}  // namespace tutti
