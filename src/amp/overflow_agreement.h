// Agreement on the skip decision across the ranks of data- and
// model-parallel groups, and the "who overflowed" report for errors.
//
// Why a MAX over each group in turn is enough: on a full data x model grid
// every rank belongs to one group of each kind; after the MAX over the
// data-parallel groups every rank of the victim's data-parallel group holds
// the flag, and every model-parallel group contains one rank of that group,
// so the MAX over the model-parallel groups reaches every rank.
// (Groups that do not tile a grid need their union as one group.)  Every rank calls with the same groups in the same
// order, as for any collective.
#pragma once

#include <string>
#include <vector>

#include "tutti/comm.h"

namespace tutti {
namespace amp {

// Returns the flag agreed over `groups`: the local flag when
// `already_agreed` (checked with one 2-int all-reduce per group when
// TUTTI_AMP_VERIFY_AGREEMENT is set: Error(kMismatch) if ranks differ),
// else the MAX over each group (one 1-int all-reduce per group).
bool agree_flag(bool local, const std::vector<Communicator*>& groups,
                bool already_agreed);

// Collective over `groups`: every rank contributes `local` (what it found,
// empty for nothing) and receives "rank R: <text>; rank S: <text>" for all
// ranks of the groups that found something, by world rank.
std::string gather_overflow_report(const std::string& local,
                                   const std::vector<Communicator*>& groups);

}  // namespace amp
}  // namespace tutti
