#include "comm/mpi/mpi_runtime.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/backoff.h"
#include "comm/mpi/ulfm.h"
#include "core/cpu_reduce.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {
namespace mpi {

void throw_mpi_error(int code, const char* expr, const std::string& context,
                     const char* file, int line) {
  // A dead peer under ULFM: kRanksLost, which tutti::recover() answers.
  if (ulfm::is_failure(code)) ulfm::throw_ranks_lost(code, expr, context, file, line);
  detail::throw_error(ErrorCode::kMpi, file, line,
                      detail::call_failed(expr, context, error_string(code)));
}

bool mpi_ok(int code, const char* expr, const std::string& context) {
  if (code == MPI_SUCCESS) return true;
  // A dead peer under ULFM: the kRanksLost error that an operation raises
  // says so; the background threads' failures that follow are details.
  if (ulfm::is_failure(code))
    TUTTI_LOG(kInfo) << detail::call_failed(expr, context, error_string(code));
  else
    TUTTI_LOG(kWarn) << detail::call_failed(expr, context, error_string(code));
  return false;
}

std::string error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<size_t>(len));
}

bool launched_by_launcher() {
  static const char* kVars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
                                "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS",
                                "HYDRA_CONTROL_FD"};
  for (const char* v : kVars)
    if (std::getenv(v)) return true;
  return false;
}

bool is_initialized() {
  // Asked on teardown paths too: a failed query (never seen) counts as
  // "not usable" and is logged rather than thrown.
  int init = 0, fin = 0;
  if (!TUTTI_MPI_WARN(MPI_Initialized(&init))) return false;
  if (!TUTTI_MPI_WARN(MPI_Finalized(&fin))) return false;
  return init && !fin;
}

namespace {

// User-defined reductions: one function per (dtype, op), all delegating to
// the CPU reference so every backend rounds the same way.
template <DType D, ReduceOp O>
void user_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_inplace(D, O, in, inout, static_cast<size_t>(*len));
}

struct UserOps {
  // [dtype][op] for the four float dtypes; MPI_OP_NULL where predefined.
  MPI_Op ops[kNumDTypes][5];
  bool created = false;
};

std::mutex g_ops_mu;
UserOps g_ops;

template <DType D, ReduceOp O>
void create_op(MPI_Op* row) {
  TUTTI_MPI_CHECK(MPI_Op_create(&user_fn<D, O>, 1, &row[static_cast<int>(O)]),
                  "creating tutti's ", dtype_name(D), " ", reduce_op_name(O),
                  " reduction");
}

template <DType D>
void create_float_ops(bool half) {
  MPI_Op* row = g_ops.ops[static_cast<int>(D)];
  create_op<D, ReduceOp::kMin>(row);
  create_op<D, ReduceOp::kMax>(row);
  if (half) {
    create_op<D, ReduceOp::kSum>(row);
    row[static_cast<int>(ReduceOp::kAvg)] = row[static_cast<int>(ReduceOp::kSum)];
    create_op<D, ReduceOp::kProd>(row);
  }
}

void ensure_user_ops() {
  std::lock_guard<std::mutex> lock(g_ops_mu);
  if (g_ops.created) return;
  for (auto& row : g_ops.ops)
    for (auto& op : row) op = MPI_OP_NULL;
  create_float_ops<DType::kFloat16>(true);
  create_float_ops<DType::kBFloat16>(true);
  create_float_ops<DType::kFloat32>(false);
  create_float_ops<DType::kFloat64>(false);
  g_ops.created = true;
}

}  // namespace

std::string thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "thread level " + std::to_string(level);
}

int requested_thread_level() {
  const std::string v = config::get_string("TUTTI_MPI_THREAD_LEVEL");
  if (v == "multiple") return MPI_THREAD_MULTIPLE;
  if (v == "serialized") return MPI_THREAD_SERIALIZED;
  if (v == "funneled") return MPI_THREAD_FUNNELED;
  if (v == "single") return MPI_THREAD_SINGLE;
  TUTTI_THROW(kInvalidArgument, "TUTTI_MPI_THREAD_LEVEL='", v,
              "' (expected multiple, serialized, funneled or single)");
}

std::string thread_level_problem(int granted, bool owned) {
  if (granted >= MPI_THREAD_MULTIPLE) return "";
  return detail::cat(
      "MPI granted ", thread_level_name(granted), " but tutti needs ",
      thread_level_name(MPI_THREAD_MULTIPLE),
      " (its progress threads, the NCCL agreement check and watchdog, the "
      "status responder and the data-parallel bucket worker call MPI "
      "alongside the application's thread); ",
      owned ? "this MPI library does not provide it (rebuild or choose an "
              "MPI with thread support; TUTTI_MPI_THREAD_LEVEL must be "
              "'multiple')"
            : "initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, "
              "...) before tutti::init() (mpi4py: leave "
              "mpi4py.rc.thread_level at its default 'multiple' before "
              "`from mpi4py import MPI`)");
}

std::string libnbc_allreduce_algorithm(const std::string& setting, int world_size) {
  if (setting == "ring") return "1";
  if (setting == "rabenseifner") return "3";
  if (setting == "mpi") return "";
  if (setting == "auto") return world_size <= 8 ? "1" : "3";
  TUTTI_THROW(kInvalidArgument, "TUTTI_MPI_LARGE_ALGORITHM='", setting,
              "' (expected auto, ring, rabenseifner or mpi)");
}

namespace {

// The world size a launcher announced, before MPI_Init (1 when none did).
int launcher_world_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"}) {
    const char* s = std::getenv(v);
    if (s && std::atoi(s) > 0) return std::atoi(s);
  }
  return 1;
}

constexpr const char* kLibnbcAllreduceVar = "OMPI_MCA_coll_libnbc_iallreduce_algorithm";

}  // namespace

namespace {

// Open MPI 5's TCP transport writes to sockets whose peer has already
// closed them: in MPI_Finalize (mca_btl_tcp_endpoint_close ->
// mca_btl_tcp_send_blocking, seen on the netns rig about once in 25 2-rank
// runs: the slower rank died of SIGPIPE after its work was done) and,
// under ULFM, after a peer died.  With SIGPIPE at its default the process
// is killed instead of the write failing, so tutti ignores it where the
// program left it at the default (as Python does at start-up); a handler
// or an ignore the program set is kept.
void ignore_default_sigpipe() {
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) != 0) return;
  if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) return;
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  if (sigaction(SIGPIPE, &ign, nullptr) == 0)
    TUTTI_LOG(kDebug) << "SIGPIPE ignored (it was at its default): a socket write to a "
                         "gone peer fails instead of killing the process";
}

}  // namespace

InitState initialize() {
  InitState s;
  ignore_default_sigpipe();
  // Open MPI's non-blocking all-reduce (coll/libnbc, what tutti's large
  // MPI_Iallreduce runs on; small ones fold into the agreement check)
  // picks a binomial tree below 4 ranks and for in-place buffers: reduce to
  // a root, broadcast back, twice a ring's traffic on the root.  Its ring
  // measured 1.2-3.0x MPI_Allreduce's busbw from 1 MB up at 2 ranks
  // (bench/RESULTS.md), but takes 2(W-1) dependent rounds; Rabenseifner's
  // algorithm moves the same bytes in 2 log2(W) rounds.  The variable is
  // process-wide, read per call: TUTTI_MPI_LARGE_ALGORITHM decides it once
  // from the world size (docs/communication.md, "Algorithm").  The user's
  // own setting wins; other MPIs ignore the variable.
  const std::string algorithm = libnbc_allreduce_algorithm(
      config::get_string("TUTTI_MPI_LARGE_ALGORITHM"), launcher_world_size());
  if (is_initialized()) {
    TUTTI_MPI_CHECK(MPI_Query_thread(&s.thread_level),
                    "asking the application's MPI for its thread level");
    s.owned = false;
    if (!algorithm.empty() && !std::getenv(kLibnbcAllreduceVar))
      TUTTI_LOG(kInfo) << "MPI was initialised by the application, so tutti "
                          "could not choose Open MPI's non-blocking all-reduce "
                          "algorithm; export "
                       << kLibnbcAllreduceVar << "=" << algorithm
                       << " before MPI_Init for TUTTI_MPI_LARGE_ALGORITHM's "
                          "choice (docs/communication.md, \"Algorithm\")";
  } else {
    int fin = 0;
    TUTTI_MPI_CHECK(MPI_Finalized(&fin), "initialising MPI");
    if (fin)
      TUTTI_THROW(kUnsupported,
                  "MPI was already finalised in this process; tutti cannot "
                  "initialise it again");
    if (!algorithm.empty())
      setenv(kLibnbcAllreduceVar, algorithm.c_str(), /*overwrite=*/0);
    const int wanted = requested_thread_level();
    TUTTI_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, wanted, &s.thread_level),
                    "initialising MPI (asking for ", thread_level_name(wanted),
                    ")");
    s.owned = true;
  }
  const std::string problem = thread_level_problem(s.thread_level, s.owned);
  if (!problem.empty()) {
    // tutti cannot run; MPI stays initialised (it could not be initialised
    // again in this process) and the process is expected to exit.
    TUTTI_THROW(kUnsupported, problem);
  }
  ensure_user_ops();
  return s;
}

void finalize(const InitState& state) {
  {
    std::lock_guard<std::mutex> lock(g_ops_mu);
    if (g_ops.created && is_initialized()) {
      for (int d = 0; d < kNumDTypes; ++d)
        for (int o = 0; o < 5; ++o) {
          MPI_Op& op = g_ops.ops[d][o];
          // kAvg aliases kSum for the 16-bit types: free each op once.
          if (op != MPI_OP_NULL && o != static_cast<int>(ReduceOp::kAvg))
            TUTTI_MPI_WARN(MPI_Op_free(&op), "shutting down");
          op = MPI_OP_NULL;
        }
    }
    g_ops.created = false;
  }
  if (state.owned && is_initialized())
    TUTTI_MPI_WARN(MPI_Finalize(), "shutting down");
}

MPI_Datatype datatype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kFloat16:
    case DType::kBFloat16: return MPI_UINT16_T;
    case DType::kInt8: return MPI_INT8_T;
    case DType::kUInt8: return MPI_UINT8_T;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
  }
  TUTTI_THROW(kInternal, "no MPI datatype for dtype ", static_cast<int>(dtype));
}

MPI_Op reduce_op(DType dtype, ReduceOp op) {
  const MPI_Op user = g_ops.ops[static_cast<int>(dtype)][static_cast<int>(op)];
  if (user != MPI_OP_NULL) return user;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return MPI_SUM;
    case ReduceOp::kProd: return MPI_PROD;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
  }
  TUTTI_THROW(kInternal, "no MPI op for ", reduce_op_name(op));
}

Deadline::Deadline(double seconds)
    : seconds_(seconds),
      when_(std::chrono::steady_clock::now() +
            std::chrono::microseconds(
                static_cast<int64_t>((seconds > 0 ? seconds : 0) * 1e6))) {}

bool Deadline::expired() const {
  return seconds_ > 0 && std::chrono::steady_clock::now() >= when_;
}

StallWatch::StallWatch(double period_s, std::function<void(double)> report,
                       Clock::time_point start, std::function<void()> check)
    : period_s_(period_s), report_(std::move(report)), check_(std::move(check)),
      start_(start),
      next_(start + std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(period_s > 0 ? period_s : 0))) {}

void StallWatch::poll(Clock::time_point now) {
  if (check_) check_();
  if (period_s_ <= 0 || now < next_) return;
  const auto period = std::max<Clock::duration>(
      std::chrono::milliseconds(1),
      std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(period_s_)));
  while (next_ <= now) next_ += period;
  report_(std::chrono::duration<double>(now - start_).count());
}

bool wait(MPI_Request* request, const Deadline& deadline,
          const comm::OpLabel& desc, MPI_Status* status, StallWatch* stall,
          int64_t min_yield_us) {
  int rc = MPI_SUCCESS;
  const bool done = wait_rc(request, deadline, status, &rc, stall, min_yield_us);
  if (rc != MPI_SUCCESS)
    throw_mpi_error(rc, "MPI_Test", desc.str(), __FILE__, __LINE__);
  return done;
}

bool wait_rc(MPI_Request* request, const Deadline& deadline, MPI_Status* status,
             int* rc, StallWatch* stall, int64_t min_yield_us) {
  // Open MPI's MPI_Wait polls its progress engine in a loop (a core at 100%
  // for as long as the wait lasts; it also cannot honour the deadline), so
  // the blocking wait is built from MPI_Test and comm::Backoff.  Each poll
  // also progresses MPI (non-blocking collectives advance only inside MPI
  // calls).
  int flag = 0;
  *rc = MPI_SUCCESS;
  return poll_until(
      [&](bool*) {
        *rc = MPI_Test(request, &flag, status);
        return *rc != MPI_SUCCESS || flag;
      },
      deadline, stall, min_yield_us);
}

bool poll_until(const std::function<bool(bool* progressed)>& poll,
                const Deadline& deadline, StallWatch* stall, int64_t min_yield_us) {
  // Spin, yield, then sleeps up to TUTTI_MPI_WAIT_SLEEP_US.  The stall
  // inspector (`stall`) is polled where the deadline is checked: never while
  // spinning, so a prompt op does not touch it.
  comm::Backoff backoff = comm::Backoff::from_settings(min_yield_us);
  for (;;) {
    bool progressed = false;
    if (poll(&progressed)) return true;
    if (progressed) backoff.progressed();
    const comm::Backoff::Step step = backoff.next(comm::Backoff::Clock::now());
    if (step.check_clock) {
      if (deadline.expired()) return false;
      if (stall) stall->poll(comm::Backoff::Clock::now());
    }
    comm::Backoff::pause(step);
  }
}

int64_t modelled_us(int64_t rounds, int64_t bytes) {
  return std::min<int64_t>(20000, rounds * 10 + bytes / 1000);
}

}  // namespace mpi
}  // namespace tutti
