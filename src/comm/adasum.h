// Adasum (adaptive summation; Maleki et al., "Scaling Distributed Training
// with Adaptive Summation", MLSys 2021) over a Communicator's point-to-point
// operations.  The public entry point is tutti::adasum_allreduce
// (include/tutti/comm.h); docs/communication.md describes the algorithm.
#pragma once

#include <string>
#include <vector>

#include "tutti/comm.h"
#include "tutti/export.h"

namespace tutti {
namespace comm {

// The point-to-point tag Adasum's exchanges use.
constexpr int kAdasumTag = 0x4144;

// Takes part in the argument agreement of an adasum_allreduce that this rank
// cannot run (its arguments could not even be imported): its peers raise
// Error(kMismatch) naming it at once instead of waiting for it until
// TUTTI_TIMEOUT.  The caller raises its own, precise error afterwards.
TUTTI_API void adasum_reject(Communicator& comm, const OpOptions& options);

// The pairwise combination the tree applies, with the dot products given:
// coefficient of a is 1 - dot / (2 |a|^2) (1 when |a| = 0), likewise for b.
// Exposed for the unit test of the formula.
TUTTI_API void adasum_coefficients(double dot, double a_norm2, double b_norm2,
                                   double* a_coef, double* b_coef);

}  // namespace comm
}  // namespace tutti
