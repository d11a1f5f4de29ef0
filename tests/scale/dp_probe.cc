// Scale probe for the data-parallel agreements (issue 29, WP4;
// tests/scale/dp.cmake): the bucket-plan / option list agreement
// (dp::check_lists_agree) and the first-step replica check
// (dp::check_parameters_agree) cost a fixed number of small collectives
// whatever W, and the bytes a rank puts into them do not grow with W
// (list_agreement.h, param_check.h), whether the ranks agree or one rank
// differs.  dp::agreement_cost() counts the collectives and the bytes each
// rank contributes; they are all-reduces and broadcasts, so that is also
// what each rank receives.  Before issue 29 both all-gathered every rank's
// hashes and lists: each rank received O(W x list) bytes.  Rank 0 prints
// one JSON line per case for the record (the same at every W but for the
// replica check's one flag byte per rank).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "data_parallel/list_agreement.h"
#include "data_parallel/param_check.h"
#include "tutti/tutti.h"

namespace tutti {
namespace {

constexpr int kItems = 200;

std::vector<std::string> items(int differ_at) {
  std::vector<std::string> v;
  for (int i = 0; i < kItems; ++i)
    v.push_back("layer" + std::to_string(i) + ".weight float32[64, 64] cpu" +
                (i == differ_at ? " (changed)" : ""));
  return v;
}

size_t list_bytes(const std::vector<std::string>& v) {
  size_t n = 0;
  for (const auto& s : v) n += s.size() + 8;
  return n;
}

void report(const char* what, int size) {
  const dp::AgreementCost c = dp::agreement_cost();
  if (world()->rank() == 0)
    std::printf("{\"np\": %d, \"agreement\": \"%s\", \"collectives\": %llu, \"bytes\": %llu}\n",
                size, what, static_cast<unsigned long long>(c.collectives),
                static_cast<unsigned long long>(c.bytes));
}

TEST(ScaleDpAgreement, AgreeingListsCostOneSmallCollective) {
  ProcessGroupPtr w = world();
  dp::reset_agreement_cost();
  const std::vector<std::string> v = items(-1);
  dp::check_lists_agree(*w->cpu_communicator(), "scale probe",
                        {{"parameter", v}, {"option", {"bucket_mb=25"}}});
  report("lists_agree", w->size());
  const dp::AgreementCost c = dp::agreement_cost();
  EXPECT_LE(c.collectives, 2u);
  EXPECT_LE(c.bytes, 256u);  // hashes and lengths, not the lists
}

TEST(ScaleDpAgreement, ADifferingRankCostsAFixedNumberOfCollectives) {
  ProcessGroupPtr w = world();
  if (w->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int odd = w->size() - 1;  // the last rank differs at item 150
  const std::vector<std::string> v = items(w->rank() == odd ? 150 : -1);
  dp::reset_agreement_cost();
  try {
    dp::check_lists_agree(*w->cpu_communicator(), "scale probe", {{"parameter", v}});
    ADD_FAILURE() << "the lists differ on rank " << odd << " but no error was raised";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kMismatch);
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(odd) + "'s parameter #150"),
              std::string::npos) << e.what();
  }
  report("lists_differ", w->size());
  const dp::AgreementCost c = dp::agreement_cost();
  EXPECT_LE(c.collectives, 6u);
  // Two lists broadcast (rank 0's and the differing rank's) plus small
  // reductions: bounded by the list, never by W x the list.
  EXPECT_LE(c.bytes, 2 * list_bytes(v) + 1024);
}

TEST(ScaleDpAgreement, ReplicaCheckBytesGrowWithParametersNotWTimesThem) {
  ProcessGroupPtr w = world();
  constexpr int kParams = 64;
  std::vector<std::vector<float>> data(kParams, std::vector<float>(32, 1.0f));
  if (w->size() > 1 && w->rank() == w->size() - 1) data[7][3] = 2.0f;  // one replica differs
  std::vector<dp::ParamEntry> params;
  for (int i = 0; i < kParams; ++i)
    params.push_back({"p" + std::to_string(i), Tensor::of(data[i])});
  dp::reset_agreement_cost();
  bool raised = false;
  try {
    dp::check_parameters_agree(*w->cpu_communicator(), "scale probe", params, nullptr);
  } catch (const Error& e) {
    raised = true;
    EXPECT_NE(std::string(e.what()).find("p7"), std::string::npos) << e.what();
  }
  EXPECT_EQ(raised, w->size() > 1);
  report("replicas_differ", w->size());
  const dp::AgreementCost c = dp::agreement_cost();
  EXPECT_LE(c.collectives, 6u);
  // Rank 0's digests (8 bytes each), a flag byte per parameter and per
  // rank: O(n + W), where the all-gather it replaced put n x 8 x W.
  EXPECT_LE(c.bytes, 16u * kParams + static_cast<uint64_t>(w->size()) + 256u);
}

}  // namespace
}  // namespace tutti
