// Communicator over MPI for host tensors.
//
// Each operation runs on the progress engine in submission order: validate
// locally -> (checked mode) agree with every rank on a 64-bit fingerprint of
// the op over a private duplicate communicator -> run the MPI call as a
// non-blocking request polled against the TUTTI_TIMEOUT deadline.  A rank
// whose arguments are invalid still takes part in the check, so every rank
// learns of the problem instead of waiting for it.
#pragma once

#include <mpi.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/mpi/join.h"
#include "comm/mpi/log_coll.h"
#include "comm/mpi/mpi_runtime.h"
#include "comm/comm_settings.h"
#include "comm/cpu_work.h"
#include "comm/layered_host.h"
#include "comm/mpi/status_service.h"
#include "comm/op_desc.h"
#include "comm/progress_engine.h"
#include "tutti/comm.h"

namespace tutti {
namespace mpi {

class MpiCommunicator : public Communicator,
                        public comm::LayeredHost,
                        public std::enable_shared_from_this<MpiCommunicator> {
 public:
  // Takes ownership of `comm` (a communicator tutti created).
  MpiCommunicator(MPI_Comm comm, std::string name, uint64_t comm_id);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  std::string name() const override { return name_; }
  WorkPtr submit(const OpRequest& request, bool blocking) override;
  WorkPtr submit_layered(const OpRequest& request, bool blocking,
                         Check also_validate) override;
  std::shared_ptr<Communicator> split(int color, int key,
                                      const std::string& name) override;

  std::shared_ptr<MpiCommunicator> split_mpi(int color, int key,
                                             const std::string& name);
  // Ranks of this communicator sharing a node (MPI_COMM_TYPE_SHARED).
  std::shared_ptr<MpiCommunicator> split_shared(const std::string& name);

  MPI_Comm comm() const { return data_; }
  // A new status-service id for a communicator built over this one (an
  // NCCL communicator), the same on every rank: call it on the engine
  // (run_ordered), where every rank takes the ids in the same order.
  uint64_t derived_id();
  // World ranks of the other members (whom a status query asks).
  std::vector<int> peer_world_ranks() const;
  uint64_t comm_id() const { return comm_id_; }
  int world_rank(int rank) const { return world_ranks_.at(rank); }
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  // Waits for everything submitted so far.
  void drain();
  // Runs what was submitted so far (on every rank alike, so peers that
  // submitted the same ops are not left waiting), then stops the engine,
  // tells the other members that this rank left (StatusService::depart:
  // an op of theirs that this rank never entered fails at once) and frees
  // the MPI communicators (before MPI_Finalize).  Later operations fail
  // with kAborted.  Idempotent.
  void close();
  bool poisoned() const { return poisoned_.load(); }
  // ULFM (ulfm.h): revokes both MPI communicators, so that every member's
  // pending and later ops on them fail (a dead peer was seen).  Any thread.
  void revoke();
  // After a revoke, for tutti::recover(): stops the engine without running
  // what was queued (those ops fail with kAborted), frees the MPI
  // communicators, tells no peer.  Later ops fail with kAborted.
  void abandon();

  // Runs `fn` on the progress engine, in order with the collectives (used by
  // backends that bootstrap over this communicator).
  void run_ordered(const std::function<void()>& fn);

  // Host-side agreement check used by this communicator and by the NCCL
  // communicator built on it: throws kMismatch (all ranks) or kTimeout.
  // `check_comm` must be a communicator private to the caller.
  static void check_agreement(MPI_Comm check_comm, const comm::WireDesc& wire,
                              bool locally_invalid, const comm::OpLabel& desc,
                              const Deadline& deadline,
                              const std::function<void()>& on_timeout,
                              StallWatch* stall = nullptr);

  // Builds the timeout error (asks peers where they are) and poisons this
  // communicator.
  // The stall inspector's warning for op #`seq`, which has waited
  // `waited_s` (asks peers where they are, like fail_timeout(), but only
  // logs).
  void warn_stall(const comm::OpLabel& desc, size_t bytes, uint64_t seq,
                  double waited_s, double period_s, double timeout_s,
                  const char* phase);

  // join() (join.h): the live same-membership splits of this communicator
  // (followers), which a joined rank serves together with it.
  std::vector<std::shared_ptr<MpiCommunicator>> followers();
  // Queues this communicator's serve loop (join.h) on its progress engine,
  // after everything submitted so far; it reports to `session` as loop
  // `slot`.
  void start_join_loop(const std::shared_ptr<JoinSession>& session, size_t slot);
  // TUTTI_CHECK_COLLECTIVES as this communicator reads it.
  bool checks_on() { return settings_.get().check_ops; }
  // join() gave this follower up (a member no longer has it): later ops
  // fail with kAborted, and later joins leave it alone (followers()).
  void give_up() { poisoned_ = true; }

  [[noreturn]] void fail_timeout(const comm::OpLabel& desc, uint64_t seq,
                                 double seconds, const char* phase);

 private:
  // The departure check of op #`seq` (RunningOp's watch; engine thread):
  // throws kCommFailure, breaking the communicator, when a member closed
  // it (shutdown, at exit, or dropped) before entering op #seq.
  void check_departures(const comm::OpLabel& desc, uint64_t seq, const char* phase);
  class RunningOp;
  // An operation as queued: the request plus the settings in force when it
  // was submitted.
  struct Queued {
    OpRequest request;
    bool check = true;
    double stall_warn_s = 0;  // TUTTI_STALL_WARN_S
    Check also_validate;      // submit_layered(): the layered request's check
  };
  void execute(const std::shared_ptr<Queued>& q, comm::CpuWork& work);
  // A split, which is no OpRequest, under execute()'s discipline: numbered
  // like the collectives, agreed (wire kind `kind`: a split against another
  // op is kMismatch on every rank), recorded for peers' status queries and
  // the stall inspector, bounded by TUTTI_TIMEOUT.  Runs on the engine;
  // `body` runs once every rank agreed, with the op's deadline.  `detail`
  // follows the kind and number in the label (" (color 1, key 0)").
  void run_split(uint8_t kind, const std::string& detail,
                 const std::function<void(const comm::OpLabel& desc, uint64_t seq,
                                          const Deadline& deadline)>& body);
  // The serve loop of a joined rank (engine thread, join.cc); returns once
  // every rank joined, or when join() gives this follower up.
  void serve_joined(JoinSession& session, size_t slot);
  // Runs the op of descriptor `op` with the reduction's identity in
  // `scratch` (a broadcast lands there and is dropped).
  void serve_op(const comm::WireDesc& op, std::vector<char>& scratch);
  void run_collective(const OpRequest& r, const Deadline& deadline,
                      const comm::OpLabel& desc, uint64_t seq);
  // `min_yield_us`: mpi::wait_rc's (an op libnbc runs in many rounds).
  void wait_or_fail(MPI_Request* req, const Deadline& deadline,
                    const comm::OpLabel& desc, uint64_t seq,
                    int64_t min_yield_us = 0);
  // TUTTI_MPI_FOLD_BYTES, re-read when the settings generation changes
  // (engine thread only).
  size_t fold_limit();

  MPI_Comm data_ = MPI_COMM_NULL;
  MPI_Comm check_ = MPI_COMM_NULL;
  std::string name_;
  uint64_t comm_id_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;
  comm::ProgressEngine engine_;
  uint64_t next_seq_ = 0;      // collectives; touched only by the engine task
  uint64_t next_p2p_seq_ = 0;  // send/recv, numbered separately
  uint32_t splits_ = 0;
  uint64_t derived_ = 0;  // derived_id()s handed out; engine only
  // The frames of execute()'s checks (engine thread, one at a time).
  mpi::FrameScratch check_scratch_;
  uint64_t fold_generation_ = ~uint64_t{0};  // fold_limit()'s cache
  size_t fold_bytes_ = 0;
  std::shared_ptr<CommProgress> progress_;
  std::atomic<bool> poisoned_{false};
  std::atomic<bool> closed_{false};
  std::mutex close_mu_;
  std::mutex comm_mu_;  // data_/check_ against revoke() from another thread
  void free_comms();
  comm::CommSettings settings_;  // the hot path must not parse the environment
  // The running op's stall watch (engine thread only; null between ops and
  // in a group of one).  Set by RunningOp.
  StallWatch* stall_ = nullptr;
  // check_departures(): StatusService::departures() when last looked at,
  // and the members known to have left (engine thread only).
  uint64_t departures_seen_ = 0;
  std::vector<Departure> departed_;
  // Same-membership splits (weak: they die with their groups).
  std::mutex followers_mu_;
  std::vector<std::weak_ptr<MpiCommunicator>> followers_;
};

}  // namespace mpi
}  // namespace tutti
