// The one table of TUTTI_* settings.  Add a setting here (and to
// docs/settings.md; tests/core/test_config.cc checks they agree).
#include "tutti/config.h"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/check.h"

namespace tutti {
namespace config {
namespace {

const std::vector<SettingInfo> kSettings = {
    // ---- core and communication
    {"TUTTI_LOG_LEVEL", "string", "warn",
     "Log level: error, warn, info, debug or trace."},
    {"TUTTI_WORLD", "string", "auto",
     "auto: MPI under a launcher or an application-initialised MPI, else a "
     "world of one without MPI; mpi: always MPI; local: never MPI."},
    {"TUTTI_TIMEOUT", "float", "300",
     "Seconds an operation may take before the watchdog fails it with an "
     "error naming the ranks that never arrived (NCCL: also bounds "
     "communicator init, split and finalize, and aborts the communicator); "
     "0 disables the watchdog."},
    {"TUTTI_CHECK_COLLECTIVES", "bool", "1",
     "Before each collective, check that all ranks agree on its kind, dtype, "
     "element count, reduce op and root (one 16-byte all-reduce; on NCCL it "
     "overlaps with the op, and a mismatch aborts the NCCL communicator)."},
    {"TUTTI_STALL_WARN_S", "float", "60",
     "Stall inspector: when a collective has waited this many seconds for "
     "other ranks, every waiting rank logs a warning naming the op (kind, "
     "name, sequence number, bytes), the ranks that arrived and the ranks "
     "missing, and repeats it every as many seconds until the op completes "
     "or TUTTI_TIMEOUT fails it; NCCL ops log how long they have been in "
     "flight.  0 disables it."},
    {"TUTTI_TIMELINE", "string", "",
     "Record a Chrome/Perfetto trace of every rank from tutti::init() to "
     "shutdown (collectives, buckets, compression, loss-scale skips, "
     "checkpoints, preemption notices, restarts): <path>.rank<R>.json, or "
     "<path>/rank<R>.json when the path is a directory or ends with '/'; "
     "scripts/timeline_merge.py merges the ranks (docs/timeline.md). Empty: "
     "off (the hooks then cost one atomic load)."},
    {"TUTTI_STATUS_GRACE_MS", "int", "2000",
     "After a timeout, how long to wait for peers to report where they are."},
    {"TUTTI_STATUS_FANOUT", "int", "8",
     "Children per member in the status tree that gathers stall and "
     "timeout reports and spreads departure notices (a report costs each "
     "process at most 2 x fanout + 2 messages, depth log_fanout(ranks)). "
     "Must agree across ranks."},
    {"TUTTI_REPORT_MAX_RANKS", "int", "8",
     "Reports and errors list at most this many ranks one by one; longer "
     "lists become ranges of consecutive ranks ('ranks 0-511, 513-1023'), "
     "at most this many ranges and groups of missing ranks, the rest "
     "counted."},
    {"TUTTI_MPI_THREAD_LEVEL", "string", "multiple",
     "Thread level tutti asks MPI_Init_thread for when it initialises MPI. "
     "tutti needs multiple and refuses to start below it (init() raises "
     "naming both levels); the lower values (serialized, funneled, single) "
     "exist to test that refusal."},
    {"TUTTI_MPI_WAIT_SLEEP_US", "int", "1000",
     "Longest sleep in microseconds between two polls of a host wait: a "
     "pending MPI request, and on the NCCL path an enqueue, init or split "
     "settling, a synchronize() waiting for the kernel, and the watchdog's "
     "passes over unchanged ops in flight. A wait spins briefly, yields for "
     "200 us (TUTTI_MPI_WAIT_YIELD_US), then sleeps with exponential backoff (20 us doubling up to "
     "this), so a long wait costs little CPU; a completion is noticed at "
     "most one sleep late. 0: yield between polls for the whole wait (a busy "
     "wait: lowest latency, a core per waiting thread)."},
    {"TUTTI_MPI_WAIT_SPINS", "int", "64",
     "Back-to-back polls a host wait makes before it starts yielding (see "
     "TUTTI_MPI_WAIT_SLEEP_US). Fewer spins and a shorter "
     "TUTTI_MPI_WAIT_YIELD_US cost less CPU per wait (data-parallel buckets "
     "on a CPU-bound machine: bench/RESULTS.md) but add latency to small "
     "collectives, most of all with more ranks than cores."},
    {"TUTTI_MPI_WAIT_YIELD_US", "int", "-1",
     "Microseconds a host wait polls with sched_yield() between polls, after "
     "its spins and before its sleeps (see TUTTI_MPI_WAIT_SPINS). -1: 200, or "
     "2000 when more ranks run on the machine than it has cores (mpirun "
     "--oversubscribe), where a sleeping waiter wakes late behind its busy "
     "peers."},
    {"TUTTI_MPI_FOLD_BYTES", "int", "16384",
     "Host collectives whose data is at most this many bytes (all-reduce, "
     "reduce-scatter, broadcast, all-gather(v); an all-reduce also when it has "
     "fewer elements than ranks) travel inside the agreement check's "
     "recursive-doubling exchange: ceil(log2 W) rounds for check and data "
     "together. Larger ones run the check, then MPI's collective. Must be the "
     "same on every rank (a difference is reported as a mismatch). 0: only "
     "barriers and empty ops fold."},
    {"TUTTI_MPI_LARGE_ALGORITHM", "string", "auto",
     "Open MPI's algorithm for host all-reduces above TUTTI_MPI_FOLD_BYTES "
     "(coll_libnbc_iallreduce_algorithm, set before MPI_Init when tutti "
     "initialises MPI and the variable is unset): ring (2(W-1) rounds, best "
     "at few ranks), rabenseifner (2 log2(W) rounds, the same bytes), auto "
     "(ring up to 8 ranks, else rabenseifner) or mpi (libnbc's own rule)."},
    {"TUTTI_EXIT_ON_COMM_FAILURE", "bool", "0",
     "When a communicator breaks because a peer or the network failed (a "
     "timeout, an NCCL asynchronous error), log the error and end the "
     "process with exit code 76 instead of leaving it to the application, "
     "so that tutti-run restarts the job even if no thread would see the "
     "error (tutti-run sets it to 1 unless it is set).  A rank lost under "
     "ULFM (kRanksLost) ends the process alike, except inside a "
     "RecoveryScope (elastic_run, tutti.torch.elastic.run), which recovers "
     "in-process."},
    {"TUTTI_ULFM", "bool", "1",
     "Use MPI's fault tolerance (ULFM) when the MPI has it and the run turned "
     "it on (Open MPI 5: mpiexec --with-ft ulfm): a dead peer fails the "
     "survivors' operations with kRanksLost (RanksLostError) naming it, and "
     "tutti::recover() / tutti.recover() shrinks the world to the survivors. "
     "0: a dead peer fails operations with kMpi, as without ULFM."},
    {"TUTTI_ULFM_MIN_SIZE", "int", "1",
     "The elastic loops (elastic_run, tutti.torch.elastic.run) recover "
     "in-process from lost ranks only while at least this many ranks "
     "survive; below it the error propagates (under tutti-run the process "
     "exits 76 and tutti-run restarts the job)."},
    {"TUTTI_NCCL", "bool", "1",
     "Use NCCL for CUDA tensors (when built with NCCL)."},
    {"TUTTI_NCCL_CHECK_EVERY", "int", "0",
     "NCCL communicators check that every rank runs the same collective once "
     "per window of this many ops (the windows ramp 1, 1, 2, 4, ... up to it, "
     "by sequence number, the same on every rank): one ceil(log2 W)-message "
     "check per window instead of per op; a difference still names the first "
     "op that differed, at the op that closes its window.  0 (auto): every op "
     "below 64 ranks, 64 from 64 ranks.  Must be the same on every rank."},
    {"TUTTI_DEVICE_TRANSPORT", "string", "auto",
     "Transport for a group's CUDA tensors: nccl; staged (through pinned host "
     "memory over the group's MPI communicator, same checks, timeouts and "
     "results as host tensors); auto: NCCL when every rank of the group has "
     "its own device, staged when two ranks on a host share one (NCCL refuses "
     "that) or the build has no NCCL, decided alike on every rank.  With "
     "TUTTI_NCCL=0 only staged serves CUDA tensors."},
    {"TUTTI_CHECK_DEVICE", "bool", "0",
     "Device discipline check (on in the gpu tests): every kernel launch must "
     "come from a thread inside a cuda::DeviceGuard whose device is current "
     "and owns the launch stream, and cuda::Event() needs a guard; a "
     "violation is an internal error naming the launcher."},
    // ---- data parallel
    {"TUTTI_BUCKET_MB", "float", "25",
     "Gradient bucket cap in MiB for the data-parallel reducer."},
    {"TUTTI_FIRST_BUCKET_MB", "float", "1",
     "Cap of the first bucket (the last layers' gradients), so communication "
     "starts early in the backward pass; 0 uses TUTTI_BUCKET_MB."},
    {"TUTTI_LEARN_BUCKET_ORDER", "bool", "1",
     "After the first reducing step, re-plan the data-parallel buckets in "
     "the order gradients became ready (rank 0's order), so buckets fill "
     "and launch during the backward pass; 0 keeps reverse registration "
     "order. Must agree across ranks."},
    {"TUTTI_DP_LAUNCH_CHANNELS", "int", "4",
     "Host buckets of the flat data-parallel all-reduce are spread over this "
     "many private communicators (bucket b on channel b mod N), each with its "
     "own progress thread, and a complete bucket launches as soon as the "
     "buckets before it on its channel have, not every bucket before it: "
     "ranks whose gradients arrive in different orders stop waiting for each "
     "other's stragglers. 1: one channel, launch in bucket order. Must agree "
     "across ranks."},
    {"TUTTI_CHECK_PARAMETERS", "bool", "1",
     "At the first reducing step of a data-parallel reducer (the C++ Reducer, "
     "DistributedOptimizer, DistributedDataParallel), check that every rank "
     "of its group holds the same parameter bytes (a 64-bit digest per "
     "rank, one small allgather) and raise on every rank naming the first "
     "parameter that differs and the ranks, e.g. after a forgotten "
     "broadcast_parameters(). 0 where the replicas are meant to differ. "
     "Must agree across ranks."},
    {"TUTTI_HIERARCHICAL", "bool", "0",
     "Hierarchical all-reduce: reduce-scatter within the node, all-reduce "
     "across nodes, all-gather within the node (nodes of unequal size: "
     "node all-reduce, leader all-reduce, node broadcast)."},
    // ---- compression
    {"TUTTI_COMPRESSION", "string", "none",
     "Default gradient compressor: none, fp16, bf16, topk, powersgd, onebit, "
     "auto."},
    {"TUTTI_TOPK_RATIO", "float", "0.01",
     "Fraction of elements top-k compression sends."},
    {"TUTTI_POWERSGD_RANK", "int", "4", "PowerSGD approximation rank."},
    {"TUTTI_POWERSGD_START_STEP", "int", "0",
     "Step before which PowerSGD sends uncompressed gradients."},
    {"TUTTI_ONEBIT_CHUNK", "int", "2048",
     "Elements sharing one scale in 1-bit sign compression (a multiple of "
     "32)."},
    {"TUTTI_AUTO_PROBE_STEPS", "int", "5",
     "Steps the auto compressor measures before choosing per bucket."},
    // ---- amp
    {"TUTTI_AMP_VERIFY_AGREEMENT", "bool", "0",
     "Check the claim that a non-finite flag is already identical on every "
     "rank (StepCheckOptions::already_agreed) with one small all-reduce per "
     "step; a disagreement is an error naming the group."},
    // ---- checkpoints
    {"TUTTI_MEM_DIR", "string", "/dev/shm",
     "Memory tier of checkpoints (commits that survive a process restart on the same "
     "host): node-local shared memory where each job keeps its commits, under "
     "<dir>/tutti-<uid>/<job id> (0700; the job id is TUTTI_JOB_ID, which tutti-run sets, "
     "else SLURM_JOB_ID)."},
    {"TUTTI_MEM_BUDGET_MB", "int", "0",
     "Most memory the memory tier may use on a node, in MiB; a commit that would "
     "exceed it is not kept in memory (said once at WARN). 0: half the free space of "
     "TUTTI_MEM_DIR when the job starts."},
    {"TUTTI_COMMIT_MEMORY", "bool", "1",
     "Elastic commits (ElasticState, tutti.torch.elastic) go to the memory tier also where a "
     "checkpoint directory is set (TUTTI_CKPT_DIR): a restart or an in-process recovery "
     "loads the newest commit from RAM, and the directory is the safety net. 0: the "
     "directory only. Without a directory the memory tier is always used."},
    {"TUTTI_COMMIT_DURABLE_EVERY", "int", "1",
     "With a checkpoint directory and the memory tier: every how many elastic commits also "
     "go to the directory (1: every one). A commit the memory tier does not keep (over its "
     "budget) goes to the directory whatever this says."},
    {"TUTTI_MEM_BUDDY_EVERY", "int", "1",
     "On several hosts, every how many memory-tier commits each rank copies its files to "
     "its buddy (the rank with its local index on the next host), so that a restart "
     "after a lost host resumes from memory. 1: every commit; 0: never (a lost host's "
     "commits are lost with it)."},
    {"TUTTI_CKPT_DIR", "string", "",
     "Checkpoint directory a CheckpointManager uses when its options name none."},
    {"TUTTI_CKPT_KEEP", "int", "3",
     "Complete checkpoints to keep (never fewer than 1)."},
    {"TUTTI_CKPT_MAX_HEADER_MB", "int", "100",
     "Largest safetensors JSON header the loader accepts."},
    {"TUTTI_CKPT_TIMEOUT", "float", "0",
     "Seconds a rank waits for the others while agreeing on a checkpoint save "
     "or load (a rank that failed makes every rank raise at once; this bounds "
     "a rank that hangs or died); 0 uses TUTTI_TIMEOUT."},
    {"TUTTI_CKPT_FRESH_START", "string", "auto",
     "What a checkpoint load that finds no complete checkpoint does: auto "
     "(start fresh unless a history is expected: a 'latest' pointer or "
     "abandoned checkpoints in the directory, or a tutti-run restart in a "
     "directory no job used before), allow (always start fresh) or refuse "
     "(an error: the job must resume)."},
    {"TUTTI_CKPT_LAYOUT", "string", "once",
     "Who writes what in a checkpoint save: once (replicated tensors written "
     "once across the job, cut into chunks spread over the ranks; sharded "
     "pieces by one holder; manifest version 3) or per-rank (every rank "
     "writes every tensor it holds: manifest version 2, what older tutti "
     "reads). Must agree across ranks."},
    {"TUTTI_CKPT_CHUNK_MB", "int", "16",
     "Once layout: the smallest chunk (MiB) of replicated state a rank "
     "writes; replicated state of T MiB is spread over min(ranks, T / "
     "chunk) writers (all of it on rank 0 below one chunk). Must agree "
     "across ranks."},
    {"TUTTI_CKPT_LOAD_THREADS", "int", "0",
     "Threads a checkpoint load hashes and copies with (the calling thread "
     "included); 0: the machine's cores shared among the node's ranks, at "
     "most 8."},
    {"TUTTI_CKPT_LOAD_MMAP", "bool", "1",
     "A checkpoint load maps shards that lie on tmpfs (/dev/shm, the memory "
     "tier) and hashes and copies from the mapping instead of reading them "
     "into buffers; 0 reads them with pread, as from disk."},
    {"TUTTI_CKPT_VERIFY_REPLICAS", "string", "sample",
     "Once layout: how a save checks that replicated tensors are identical "
     "on every rank before writing one copy (a tensor that differs is "
     "written by every rank): sample (host tensors hashed whole, CUDA "
     "tensors by their element count and 16 blocks of 64 bytes) or full "
     "(CUDA tensors copied to host and hashed whole)."},
    {"TUTTI_MPIRUN", "string", "mpirun",
     "Read by tutti-run only: the MPI launcher it runs (--mpirun overrides)."},
    {"TUTTI_RESTART_COUNT", "int", "0",
     "Set by tutti-run: how many times it restarted the job (0 on the first "
     "run)."},
    {"TUTTI_CKPT_FILE_MODE", "string", "0600",
     "Octal permissions of the checkpoint files tutti creates (less the "
     "umask), e.g. 0640 to share them with the group."},
    {"TUTTI_CKPT_DIR_MODE", "string", "0700",
     "Octal permissions of the checkpoint directories tutti creates (less "
     "the umask), e.g. 0750."},
    {"TUTTI_JOB_ID", "string", "",
     "The job's name: in a checkpoint directory's lock file (tutti.lock), "
     "which a second job on the directory reports, and the key of the job's "
     "memory-tier directory (TUTTI_MEM_DIR), which must stay the same across "
     "restarts. tutti-run sets it (kept across its restarts) unless it is set; "
     "empty: SLURM_JOB_ID, else <host>:<pid> of rank 0 (no memory tier)."},
    {"TUTTI_FAULT_INJECT", "string", "",
     "Testing only: <point>[:rank=R][:hit=K][:action=kill|fail|stall], "
     "comma-separated; kills this rank with SIGKILL (or fails or stalls it) "
     "at a named checkpoint point, e.g. 'after_shard_write' or "
     "'between_manifest_and_latest:rank=0' (docs/checkpoint.md lists them)."},
    // ---- preemption
    {"TUTTI_PREEMPT_SOURCES", "string", "signals,file",
     "Comma-separated preemption notice sources: signals, file, aws, gcp, "
     "azure (or all)."},
    {"TUTTI_PREEMPT_POLL_MS", "int", "1000",
     "Poll interval of the metadata-endpoint and trigger-file sources."},
    {"TUTTI_PREEMPT_FILE", "string", "/tmp/tutti-preempt",
     "Trigger file: its creation (or a touch) is a preemption notice "
     "(Kubernetes preStop hooks create it); a file left from an earlier run "
     "counts only once touched."},
    {"TUTTI_PREEMPT_STOP_ON_REBALANCE", "bool", "0",
     "Also stop (checkpoint and exit 75) on an AWS rebalance recommendation, "
     "not only on an interruption notice."},
    {"TUTTI_PREEMPT_SHARE_DIR", "string", "/dev/shm",
     "Node-local directory through which the ranks of a node share one poller "
     "per cloud metadata endpoint (an flock elects it; the others read what it "
     "publishes); none: every rank polls."},
    {"TUTTI_AWS_METADATA_URL", "string", "http://169.254.169.254",
     "AWS instance metadata service base URL (IMDSv2)."},
    {"TUTTI_GCP_METADATA_URL", "string", "http://metadata.google.internal",
     "GCP metadata server base URL."},
    {"TUTTI_AZURE_METADATA_URL", "string", "http://169.254.169.254",
     "Azure Instance Metadata Service base URL (Scheduled Events)."},
    {"TUTTI_HTTP_TIMEOUT_MS", "int", "500",
     "Timeout of one metadata-endpoint request."},
    // ---- launcher
    {"TUTTI_MPI", "string", "openmpi5",
     "Read by scripts/install_deps.sh only: the MPI it provides, openmpi5 "
     "(PyPI's Open MPI 5 with ULFM, into .venv, where CMake finds it) or "
     "system (Debian's Open MPI 4.1 only; docs/install.md)."},
    {"TUTTI_MPI_HOME", "string", "",
     "Read by scripts/test.sh and scripts/demo.sh only: passed to CMake as "
     "-DTUTTI_MPI_HOME, the prefix of the MPI to build against (its "
     "bin/mpicc and bin/mpiexec) or system. Empty: .venv's Open MPI 5 when "
     "it is there, else the system's (docs/install.md)."},
    {"TUTTI_MAX_RESTARTS", "int", "3",
     "tutti-run: restarts after failures without progress (a run that "
     "advanced the committed checkpoint step, or a preemption or resize exit, "
     "resets the count)."},
    {"TUTTI_RESTART_BACKOFF_S", "float", "1",
     "tutti-run: delay before a restart, doubled for each further failure "
     "without progress (capped at 60 s)."},
    {"TUTTI_RUN_ULFM", "string", "auto",
     "tutti-run: its --ulfm default (auto, on, off): whether to pass Open MPI "
     "5's --with-ft ulfm to mpirun, so that the elastic loops survive a killed "
     "rank in-process (docs/elastic.md, tutti-run and in-process "
     "recovery)."},
    // ---- elastic mode (set by tutti-run --min-np/--max-np; docs/elastic.md)
    {"TUTTI_ELASTIC", "bool", "0",
     "Set by tutti-run in elastic mode: the job may be restarted at another "
     "world size."},
    {"TUTTI_ELASTIC_DIR", "string", "",
     "Set by tutti-run in elastic mode: its directory every rank can reach. "
     "A rank whose own node received a stop notice (metadata, trigger file, "
     "a signal not forwarded by mpirun) writes leaving/<host> there, and "
     "tutti-run leaves that host out of the next start; empty: no record."},
    {"TUTTI_RUN_DIR", "string", "",
     "Set by tutti-run where it has a directory every rank can reach (<elastic "
     "dir>/run, else <ckpt-dir>/.tutti-run, else a private one for "
     "a job on its own host): world rank 0 writes started-<attempt> there "
     "after init() and finished-<attempt> at shutdown(), so that tutti-run "
     "can tell a completed job from one whose ranks were all killed (Open MPI "
     "5's mpirun exits 0 then under --with-ft ulfm); empty: no record."},
    {"TUTTI_ELASTIC_MIN_NP", "int", "0",
     "Set by tutti-run in elastic mode: its --min-np."},
    {"TUTTI_ELASTIC_MAX_NP", "int", "0",
     "Set by tutti-run in elastic mode: its --max-np."},
    {"TUTTI_ELASTIC_HOST", "string", "",
     "The name this node has in tutti-run's host discovery, written in the "
     "leaving record; empty: gethostname() (the record also lists the node's "
     "addresses, which tutti-run matches against discovered addresses). Set "
     "it in each node's own environment: tutti-run does not export it."},
};

struct Cache {
  std::mutex mu;
  std::unordered_map<std::string, std::string> raw;
  std::atomic<uint64_t> generation{1};
};

Cache& cache() {
  static Cache* c = new Cache();  // leaked: used during static destruction
  return *c;
}

const SettingInfo& find(const char* name) {
  for (const auto& s : kSettings)
    if (std::strcmp(s.name, name) == 0) return s;
  TUTTI_THROW(kInternal, "unknown setting ", name);
}

// The raw string (environment or default), read once per reload().
std::string raw(const char* name, const SettingInfo** info_out) {
  const SettingInfo& info = find(name);
  *info_out = &info;
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.raw.find(name);
  if (it != c.raw.end()) return it->second;
  const char* env = std::getenv(name);
  std::string v = env ? std::string(env) : std::string(info.default_value);
  c.raw.emplace(name, v);
  return v;
}

[[noreturn]] void bad(const SettingInfo& info, const std::string& value,
                      const char* expected) {
  TUTTI_THROW(kInvalidArgument, info.name, "='", value, "' is not ", expected,
              " (default ", info.default_value, ": ", info.help, ")");
}

}  // namespace

const std::vector<SettingInfo>& all_settings() { return kSettings; }

int64_t get_int(const char* name) {
  const SettingInfo* info;
  std::string v = raw(name, &info);
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || errno != 0 || *end != '\0') bad(*info, v, "an integer");
  return x;
}

double get_double(const char* name) {
  const SettingInfo* info;
  std::string v = raw(name, &info);
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || errno != 0 || *end != '\0') bad(*info, v, "a number");
  return x;
}

bool get_bool(const char* name) {
  const SettingInfo* info;
  std::string v = raw(name, &info);
  for (auto& ch : v) ch = static_cast<char>(std::tolower(ch));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  bad(*info, v, "a boolean (1/0, true/false, yes/no, on/off)");
}

std::string get_string(const char* name) {
  const SettingInfo* info;
  return raw(name, &info);
}

void reload() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.raw.clear();
  c.generation.fetch_add(1);
}

uint64_t generation() { return cache().generation.load(std::memory_order_acquire); }

}  // namespace config
}  // namespace tutti
