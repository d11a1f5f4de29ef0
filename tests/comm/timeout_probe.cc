// Driven by timeout_test.sh: one rank fails to arrive at a collective; the
// others must fail within TUTTI_TIMEOUT with an error naming it.
//   timeout_probe straggler  rank 1 sleeps outside tutti (it still answers
//                            status queries: "never arrived")
//   timeout_probe frozen     rank 1 stops itself with SIGSTOP ("did not
//                            answer")
//   timeout_probe split      as straggler, but the others run a node split
//                            (ProcessGroup::node_group of a fresh group:
//                            init() made the world's) instead of an
//                            allreduce; unchecked and unbounded, it blocked
//                            in MPI_Comm_split_type until mpiexec killed it
//   timeout_probe group_split  as split, with a split_group (MPI_Comm_split)
//                            instead of the node split
//   timeout_probe join       as split, but the others call join() (a joined
//                            rank's wait is bounded too, and names rank 1)
// Each rank that sees the expected error prints "PROBE-OK rank R: <message>".
// The message must name rank 1 alone as missing: with three or more ranks,
// every other waiting rank is listed as "also arrived" (a split that did not
// record its progress made them look absent too).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tutti/tutti.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "straggler";
  tutti::init();
  auto w = tutti::world();
  const bool split = mode == "split" || mode == "group_split" || mode == "join";
  if (split) w = w->split_group(0, w->rank(), "probe");
  const int rank = w->rank();
  std::vector<float> v(1000, 1.0f);
  if (rank == 1) {
    if (mode == "frozen") {
      raise(SIGSTOP);
    } else {
      sleep(30);  // mpirun ends the job when the others exit
    }
    return 0;
  }
  try {
    if (mode == "split")
      w->node_group();
    else if (mode == "group_split")
      w->split_group(0, rank, "probe/child");
    else if (mode == "join")
      w->join();
    else
      w->allreduce(tutti::Tensor::of(v), tutti::ReduceOp::kSum, {"probe"});
    std::printf("PROBE-FAIL rank %d: the %s completed\n", rank, mode.c_str());
  } catch (const tutti::Error& e) {
    const std::string m = e.what();
    const char* want = mode == "frozen" ? "did not answer" : "never arrived: rank 1";
    const bool op_named =
        mode == "split"         ? m.find("node split #") != std::string::npos
        : mode == "group_split" ? m.find("split #") != std::string::npos &&
                                      m.find("(color 0, key ") != std::string::npos
        : mode == "join"        ? m.find("join on group 'probe'") != std::string::npos
                                : m.find("allreduce #") != std::string::npos &&
                                      m.find("'probe'") != std::string::npos;
    // The other waiting ranks (world ranks equal group ranks here).
    std::string others;
    int n_others = 0;
    for (int r = 0; r < w->size(); ++r)
      if (r != 1 && r != rank)
        others += (n_others++ ? ", " : "") + std::to_string(r);
    const std::string also =
        n_others ? (n_others == 1 ? "also arrived: rank " : "also arrived: ranks ") + others
                 : "";
    const bool only_rank1 =
        n_others ? m.find(also) != std::string::npos
                 : m.find("also arrived") == std::string::npos;
    if (e.code() == tutti::ErrorCode::kTimeout && m.find(want) != std::string::npos &&
        op_named && only_rank1)
      std::printf("PROBE-OK rank %d: %s\n", rank, m.c_str());
    else
      std::printf("PROBE-FAIL rank %d: unexpected error: %s\n", rank, m.c_str());
  }
  std::fflush(stdout);
  // A later op on the timed-out communicator fails fast.
  try {
    w->barrier();
    std::printf("PROBE-FAIL rank %d: barrier after timeout succeeded\n", rank);
  } catch (const tutti::Error& e) {
    if (e.code() == tutti::ErrorCode::kAborted)
      std::printf("PROBE-ABORTED-OK rank %d\n", rank);
    else
      std::printf("PROBE-FAIL rank %d: %s\n", rank, e.what());
  }
  std::fflush(stdout);
  // The first rank to exit without MPI_Finalize makes mpiexec kill the
  // rest: give the peers that timed out at about the same time the moment
  // they need to print their verdict.
  sleep(1);
  tutti::shutdown();
  return 0;
}
