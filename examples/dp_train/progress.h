// What dp_train carries from one run of a job to the next through the
// checkpoint's metadata: the data position and the counters that must not
// restart from zero when the job is restarted, possibly at another world
// size (scripts/demo.py --elastic reports them), and the per-rank log of the
// samples each step consumed (--samples-log), from which "no sample repeated
// or skipped" is checked.
#pragma once

#include <cstdint>
#include <string>

namespace demo {

struct Progress {
  // Global index of the next sample: sample i is a pure function of i
  // (Task::batch), so a resize neither repeats nor skips one.
  int64_t position = 0;
  // Samples per step over all ranks (per-rank batch = global_batch / world).
  int64_t global_batch = 0;
  int world = 0;              // the world size that saved
  int64_t runs = 1;           // starts of the job, this one included
  int64_t resizes = 0;        // starts at another world size than the saver's
  uint64_t bytes_sent = 0;    // gradient bytes sent, summed over the ranks
  double train_s = 0;         // time in the steps of the committed timeline
  double ckpt_s = 0;          // time training was blocked by saves
  // Time lost to restarts: for each start from a checkpoint, from that
  // checkpoint's save call to the first step of the new run (the notice's
  // synchronous save, steps done after the checkpoint and discarded,
  // the exit, the relaunch, start-up and the load).
  double lost_s = 0;
  double saved_at = 0;        // wall clock (s since the epoch) of the save call

  // A flat JSON object (the checkpoint's metadata).
  std::string to_json() const;
  // Reads what to_json() wrote; absent keys keep their defaults (older
  // checkpoints).  Returns false when `json` has no "position".
  bool from_json(const std::string& json);
};

// Appends one JSON line per step and rank to a file shared by every rank of
// every run: {"start", "step", "rank", "world", "first", "count"}, the samples
// first .. first + count - 1 that the rank trained on at that step ("start"
// tells the job's starts apart: rank 0's clock at start-up, in us).  Each
// line goes out in one write() on an O_APPEND descriptor, so the lines of
// concurrent ranks do not interleave (a local or NFS-with-one-writer-per-line
// file system; the multi-node test shares the machine's).
class SamplesLog {
 public:
  explicit SamplesLog(const std::string& path);  // empty: disabled
  ~SamplesLog();
  SamplesLog(const SamplesLog&) = delete;
  SamplesLog& operator=(const SamplesLog&) = delete;
  void record(int64_t start, int64_t step, int rank, int world, int64_t first, int64_t count);

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace demo
