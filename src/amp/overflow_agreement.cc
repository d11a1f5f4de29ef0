#include "amp/overflow_agreement.h"

#include <cstdint>
#include <map>
#include <sstream>

#include "core/check.h"
#include "tutti/config.h"
#include "tutti/process_group.h"

namespace tutti {
namespace amp {
namespace {

void check_group(const Communicator* g) {
  TUTTI_ARG_CHECK(g != nullptr, "amp: null group in the agreement groups");
  TUTTI_ARG_CHECK(g->backend() != "nccl" && g->backend() != "staged", "amp: group '",
                  g->name(), "' is ", g->backend() == "nccl" ? "an NCCL" : "a staged",
                  " communicator; the non-finite flag is a host value, pass the "
                  "ProcessGroup (it routes host tensors to MPI)");
}

int world_rank() { return initialized() ? rank() : 0; }

// "R\ttext\n" lines keyed by world rank, so groups that overlap (a rank is
// in both the data- and the model-parallel group) do not repeat entries.
std::string encode(const std::map<int, std::string>& m) {
  std::string out;
  for (const auto& kv : m) out += std::to_string(kv.first) + "\t" + kv.second + "\n";
  return out;
}

void decode(const std::string& s, std::map<int, std::string>* m) {
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    (*m)[std::stoi(line.substr(0, tab))] = line.substr(tab + 1);
  }
}

}  // namespace

bool agree_flag(bool local, const std::vector<Communicator*>& groups,
                bool already_agreed) {
  for (Communicator* g : groups) check_group(g);
  OpOptions o;
  o.name = "amp non-finite flag";
  if (already_agreed) {
    if (!config::get_bool("TUTTI_AMP_VERIFY_AGREEMENT")) return local;
    for (Communicator* g : groups) {
      // MAX of (f, 1 - f) gives the maximum and 1 - the minimum at once.
      int32_t v[2] = {local ? 1 : 0, local ? 0 : 1};
      g->allreduce(Tensor::of(v, 2), ReduceOp::kMax, o);
      if (v[0] != 1 - v[1])
        TUTTI_THROW(kMismatch, "amp: the non-finite flag was declared already "
                    "agreed (StepCheckOptions::already_agreed) but ranks of group '",
                    g->name(), "' differ: this rank found ",
                    local ? "non-finite" : "only finite",
                    " gradients, another rank the opposite.  Gradients that are "
                    "not bit-identical across the group (compressed, sharded, or "
                    "checked before the all-reduce) need already_agreed=false");
    }
    return local;
  }
  int32_t flag = local ? 1 : 0;
  for (Communicator* g : groups) {
    if (g->size() > 1) g->allreduce(Tensor::of(&flag, 1), ReduceOp::kMax, o);
  }
  return flag != 0;
}

std::string gather_overflow_report(const std::string& local,
                                   const std::vector<Communicator*>& groups) {
  std::map<int, std::string> entries;
  if (!local.empty()) {
    std::string clean = local;
    for (char& c : clean)
      if (c == '\n' || c == '\t') c = ' ';
    entries[world_rank()] = clean;
  }
  OpOptions o;
  o.name = "amp overflow report";
  for (Communicator* g : groups) {
    check_group(g);
    if (g->size() <= 1) continue;
    std::string mine = encode(entries);
    int64_t len = static_cast<int64_t>(mine.size());
    std::vector<int64_t> counts(g->size());
    g->allgather(Tensor::of(&len, 1), Tensor::of(counts), o);
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    std::string all(static_cast<size_t>(total), '\0');
    g->allgatherv(Tensor(&mine[0], DType::kUInt8, Shape{len}),
                  Tensor(&all[0], DType::kUInt8, Shape{total}), counts, o);
    decode(all, &entries);
  }
  std::string out;
  for (const auto& kv : entries) {
    if (!out.empty()) out += "; ";
    out += "rank " + std::to_string(kv.first) + ": " + kv.second;
  }
  return out;
}

}  // namespace amp
}  // namespace tutti
