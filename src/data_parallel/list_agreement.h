// Cross-rank agreement on lists of descriptions (parameter lists, reducer
// options, optimiser-state lists), with an error that names the first
// difference on every rank.
//
// Protocol (collective over `comm`, host tensors only), a fixed number of
// small collectives whatever the world size W, so its cost per rank is that
// of the host all-reduce and broadcast (O(log W) rounds), never a gather of
// every rank's data:
//  1. every rank hashes each of its lists (FNV-1a over length-prefixed
//     items); one all-reduce MAX of (h, ~h) per list (16 bytes each, plus
//     the byte length of rank 0's list): max(h) == ~max(~h) exactly when
//     every rank's h is the same, so every rank takes the same branch;
//  2. on a difference, for the first differing list only: rank 0 broadcasts
//     its list, each rank compares its own with it, one all-reduce MAX finds
//     the lowest rank that differs (with its list's length), one all-reduce
//     SUM counts the ranks that differ, and that rank broadcasts its list;
//     every rank builds the same message from the two lists: the first rank
//     whose list differs from rank 0's and the first differing item.
// No rank can wait for a peer that already failed: all ranks run the same
// collectives in both branches.
#pragma once

#include <string>
#include <vector>

#include "tutti/comm.h"

namespace tutti {
namespace dp {

struct NamedList {
  const char* noun;                // "parameter", "option", "state entry"
  std::vector<std::string> items;  // one human-readable description each
};

// Throws Error(kMismatch) on every rank when the ranks' lists differ:
// "<context>: ranks disagree: rank 2's parameter #3 is 'fc.bias'
// float32[10] cpu, but rank 0's is 'fc.bias' float64[10] cpu".
void check_lists_agree(Communicator& comm, const std::string& context,
                       const std::vector<NamedList>& lists);

// 64-bit FNV-1a of the items (each prefixed by its length).
uint64_t hash_items(const std::vector<std::string>& items);

// What this process's agreements cost (check_lists_agree() and
// check_parameters_agree() together, since the last reset): collective calls
// and the bytes this rank put into them.  Read by the scale tests
// (tests/scale/dp.cmake), which assert both stay flat in W (scale_dp_agreement).
struct AgreementCost {
  uint64_t collectives = 0;
  uint64_t bytes = 0;
};
AgreementCost agreement_cost();
void reset_agreement_cost();
// Counts one collective of `bytes` bytes (list_agreement.cc, param_check.cc).
void count_agreement_collective(uint64_t bytes);

}  // namespace dp
}  // namespace tutti
