// Cross-rank agreement on lists of descriptions (parameter lists, reducer
// options, optimiser-state lists), with an error that names the first
// difference on every rank.
//
// Protocol (collective over `comm`, host tensors only):
//  1. every rank hashes each of its lists (FNV-1a over length-prefixed
//     items) and all-gathers the hashes: one small allgather when all agree;
//  2. if any list's hashes differ (every rank sees the same gathered hashes,
//     so every rank takes this branch), the first such list is exchanged in
//     full (allgather of its byte length, then allgatherv of the bytes) and
//     every rank builds the same message: the first rank whose list differs
//     from rank 0's and the first differing item.
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

}  // namespace dp
}  // namespace tutti
