// Noticing that the machine is about to be taken away, and stopping every
// rank at the same step.
//
//   tutti::PreemptionMonitor monitor;            // before the training loop
//   for (int64_t step = start + 1; step <= steps; ++step) {
//     train_step();
//     if (monitor.should_stop(*tutti::world())) {  // collective, every step
//       ckpt.save(step, parts, meta);
//       ckpt.wait();                              // committed on every rank
//       tutti::exit_preempted();                  // exit code 75
//     }
//   }
//
// Sources (TUTTI_PREEMPT_SOURCES, comma-separated, or "all"):
//   signals  SIGTERM, SIGUSR1, SIGUSR2 (an async-signal-safe flag; OpenMPI's
//            mpirun forwards USR1/USR2 to every rank, tutti-run turns its own
//            SIGTERM into SIGUSR1)
//   file     TUTTI_PREEMPT_FILE appears or is touched (a Kubernetes preStop
//            hook); a file that already exists when the monitor starts is a
//            leftover and counts only once it is touched again
//   aws      IMDSv2: PUT /latest/api/token, then GET
//            /latest/meta-data/spot/instance-action (a stop) and
//            /latest/meta-data/events/recommendations/rebalance (a
//            rebalance recommendation)
//   gcp      GET /computeMetadata/v1/instance/preempted with
//            Metadata-Flavor: Google answering TRUE
//   azure    GET /metadata/scheduledevents?api-version=2020-07-01 with
//            Metadata: true listing a "Preempt" event for this VM
// The HTTP sources and the file are polled, each on its own thread, every
// TUTTI_PREEMPT_POLL_MS; endpoints come from TUTTI_{AWS,GCP,AZURE}_METADATA_URL.
// See docs/preemption.md for each cloud's notice period and setup.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tutti/export.h"
#include "tutti/process_group.h"

namespace tutti {

// Exit code of a process that stopped on a preemption notice after its
// checkpoint committed (EX_TEMPFAIL: "try again later").  tutti-run
// restarts a job that exits with it; so can any scheduler.
constexpr int kPreemptedExitCode = 75;

// Ordered by urgency: the ranks agree on the maximum.
enum class NoticeKind : int {
  kNone = 0,
  kRebalance = 1,  // AWS rebalance recommendation: risk is elevated
  kStop = 2,       // preemption / termination is coming: stop now
};
TUTTI_API const char* notice_kind_name(NoticeKind kind);

// What every rank does at a step boundary (PreemptionMonitor::decide).
enum class PreemptionAction : int {
  kContinue = 0,
  kSaveNow = 1,  // an early warning (AWS rebalance recommendation): save a
                 // checkpoint at this step and keep training
  kStop = 2,     // save, wait for the commit, exit_preempted()
};

struct PreemptionNotice {
  NoticeKind kind = NoticeKind::kNone;
  std::string source;  // "SIGTERM", "aws", "gcp", "azure", "file", ...
  std::string detail;  // e.g. the instance-action document
  double seconds_since_start = 0;  // when this process saw it
};

struct PreemptionOptions {
  // Empty: TUTTI_PREEMPT_SOURCES.  "none" disables every source (notices
  // can still be raised with notify()).
  std::string sources;
  // <= 0 / empty: the TUTTI_* setting of the same name.
  int poll_ms = 0;                 // TUTTI_PREEMPT_POLL_MS
  std::string trigger_file;        // TUTTI_PREEMPT_FILE
  std::string aws_url;             // TUTTI_AWS_METADATA_URL
  std::string gcp_url;             // TUTTI_GCP_METADATA_URL
  std::string azure_url;           // TUTTI_AZURE_METADATA_URL
  int http_timeout_ms = 0;         // TUTTI_HTTP_TIMEOUT_MS
  // Node-local directory through which the ranks of a node share one
  // poller per metadata endpoint (TUTTI_PREEMPT_SHARE_DIR, /dev/shm);
  // "none": every rank polls.
  std::string share_dir;
  // Also stop on a rebalance recommendation (default:
  // TUTTI_PREEMPT_STOP_ON_REBALANCE).
  std::optional<bool> stop_on_rebalance;
};

class TUTTI_API PreemptionMonitor {
 public:
  // Installs the signal handlers (the previous ones are restored by the
  // destructor) and starts one polling thread per polled source.
  // kInvalidArgument for an unknown source name.  One monitor at a time may
  // own the signals.
  explicit PreemptionMonitor(PreemptionOptions options = {});
  ~PreemptionMonitor();
  PreemptionMonitor(const PreemptionMonitor&) = delete;
  PreemptionMonitor& operator=(const PreemptionMonitor&) = delete;

  // Local, cheap, no communication: the most urgent notice this process
  // has seen.
  NoticeKind local() const;
  std::optional<PreemptionNotice> notice() const;

  // Collective over `group`: the most urgent notice any rank has seen (an
  // all-reduce MAX of one int32), identical on every rank.
  NoticeKind agree(ProcessGroup& group);
  // Collective: agree() >= kStop (or >= kRebalance with stop_on_rebalance).
  // Every rank gets the same answer at the same call, so all stop at the
  // same step.
  bool should_stop(ProcessGroup& group);
  // Collective: the agreed notice as an action, identical on every rank.
  // kStop as should_stop(); kSaveNow at the first call that agrees on a
  // rebalance recommendation (once per monitor; a new recommendation after
  // it is the same risk), else kContinue.
  //   switch (monitor.decide(*world())) {
  //     case PreemptionAction::kStop: ckpt.save(...); ckpt.wait(); exit_preempted();
  //     case PreemptionAction::kSaveNow: ckpt.save(...); break;  // keep training
  //     case PreemptionAction::kContinue: break;
  //   }
  PreemptionAction decide(ProcessGroup& group);

  // Raises a notice from code (a custom source, a test).
  void notify(NoticeKind kind, const std::string& source, const std::string& detail = "");

  // The enabled sources, e.g. {"signals", "file", "aws"}.
  std::vector<std::string> sources() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Shuts tutti down and exits the process with kPreemptedExitCode.  Call it
// after the final checkpoint is committed (CheckpointManager::wait()).
// SIGUSR1 and SIGUSR2 are ignored from here on: a repeated notice cannot
// turn the exit into a death by signal.
[[noreturn]] TUTTI_API void exit_preempted();

}  // namespace tutti
