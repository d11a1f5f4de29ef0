// Test-only fault injection at named points of the checkpoint protocol.
//
// TUTTI_FAULT_INJECT=<point>[:rank=R][:hit=K][:times=N][:action=kill|fail|stall],
// and several specs separated by ','.  When this process (world rank R, or
// any rank without rank=) reaches <point> for the K-th time (default: the
// first), and for the N-1 times after it (default N = 1), the action runs:
//   kill   SIGKILL this process at once (no cleanup, no flush: a power cut
//          or an OOM kill as far as the files are concerned)
//   fail   throw Error(kIo) "injected failure at <point>", handled exactly as
//          the real I/O error of that step would be (fsync failure, ...)
//   stall  sleep until killed (a hung NFS write, a frozen rank)
// The points are listed in docs/checkpoint.md ("Fault injection").  Unset in
// production: fault_point() is then one relaxed atomic load.
#pragma once

#include <string>
#include <vector>

namespace tutti {
namespace fault {

// Every point the checkpoint code declares, in protocol order.
const std::vector<std::string>& known_points();

// Runs the configured action if `point` matches; returns otherwise.
void fault_point(const char* point);

// config::reload(): the next fault_point() re-reads TUTTI_FAULT_INJECT (any
// config::reload() does; tests that change it in-process call this).
void reload();

}  // namespace fault
}  // namespace tutti
