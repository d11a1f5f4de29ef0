#include "comm/mpi/ulfm.h"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "comm/mpi/mpi_runtime.h"
#include "comm/rank_list.h"
#include "comm/registry.h"
#include "core/check.h"
#include "core/clock.h"
#include "tutti/config.h"
#include "tutti/log.h"

#if defined(MPIX_ERR_PROC_FAILED) && defined(MPIX_ERR_REVOKED)
#define TUTTI_HAVE_ULFM 1
#else
#define TUTTI_HAVE_ULFM 0
#endif

namespace tutti {
namespace mpi {
namespace ulfm {
namespace {

struct FtState {
  std::once_flag probed;
  bool enabled = false;
  std::mutex mu;
  MPI_Comm base = MPI_COMM_NULL;  // null: MPI_COMM_WORLD
  std::function<void()> on_failure;
  std::atomic<bool> fired{false};
  std::function<void(int)> shrink_hook;  // set_shrink_test_hook
  // failure_note(): when MPI was last asked (steady clock, ns), and what it
  // said then.
  std::atomic<int64_t> asked_ns{0};
  std::string note;
};

FtState& ft() {
  static FtState* s = new FtState();  // outlives static destructors
  return *s;
}

#if TUTTI_HAVE_ULFM
// Open MPI's mpi_ft_enable through MPI_T (a bool; read into zeroed bytes so
// that any integer width reads alike).
bool ft_enabled_in_mpi() {
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return false;
  bool on = false;
  int index = -1;
  if (MPI_T_cvar_get_index("mpi_ft_enable", &index) == MPI_SUCCESS && index >= 0) {
    MPI_T_cvar_handle handle;
    int count = 0;
    if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      unsigned char value[16] = {0};
      if (count == 1 && MPI_T_cvar_read(handle, value) == MPI_SUCCESS) on = value[0] != 0;
      MPI_T_cvar_handle_free(&handle);
    }
  }
  MPI_T_finalize();
  return on;
}

// Ranks of `group` as ranks of base(), sorted.
std::vector<int> to_base(MPI_Group group) {
  int n = 0;
  MPI_Group_size(group, &n);
  std::vector<int> in(n), out(n, MPI_UNDEFINED);
  for (int i = 0; i < n; ++i) in[i] = i;
  MPI_Group base_group;
  MPI_Comm_group(base(), &base_group);
  if (n > 0) MPI_Group_translate_ranks(group, n, in.data(), base_group, out.data());
  MPI_Group_free(&base_group);
  out.erase(std::remove(out.begin(), out.end(), MPI_UNDEFINED), out.end());
  std::sort(out.begin(), out.end());
  return out;
}
#endif

std::string rank_list(const std::vector<int>& ranks) { return comm::join_ranks(ranks, ", "); }

}  // namespace

bool compiled() { return TUTTI_HAVE_ULFM != 0; }

bool enabled() {
  FtState& s = ft();
  std::call_once(s.probed, [&] {
#if TUTTI_HAVE_ULFM
    s.enabled = config::get_bool("TUTTI_ULFM") && ft_enabled_in_mpi();
#endif
  });
  return s.enabled;
}

bool is_failure(int rc) {
#if TUTTI_HAVE_ULFM
  if (rc == MPI_SUCCESS || !enabled()) return false;
  int cls = rc;
  MPI_Error_class(rc, &cls);
  return cls == MPIX_ERR_PROC_FAILED || cls == MPIX_ERR_PROC_FAILED_PENDING ||
         cls == MPIX_ERR_REVOKED;
#else
  (void)rc;
  return false;
#endif
}

MPI_Comm base() {
  FtState& s = ft();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.base == MPI_COMM_NULL ? MPI_COMM_WORLD : s.base;
}

void set_base(MPI_Comm comm) {
  FtState& s = ft();
  std::lock_guard<std::mutex> lock(s.mu);
  // The previous shrunken world has no user left: every communicator over
  // it was closed by the recovery that replaces it.
  if (s.base != MPI_COMM_NULL) TUTTI_MPI_WARN(MPI_Comm_free(&s.base), "recovery");
  s.base = comm;
}

std::vector<int> failed_ranks(double wait_s) {
#if TUTTI_HAVE_ULFM
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(wait_s));
  for (;;) {
    std::vector<int> ranks;
    MPI_Group failed;
    if (MPIX_Comm_get_failed(base(), &failed) == MPI_SUCCESS) {
      ranks = to_base(failed);
      MPI_Group_free(&failed);
    }
    if (!ranks.empty() || std::chrono::steady_clock::now() >= until) return ranks;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
#else
  (void)wait_s;
  return {};
#endif
}

void revoke(MPI_Comm comm) {
#if TUTTI_HAVE_ULFM
  if (!enabled() || comm == MPI_COMM_NULL) return;
  int flag = 0;
  if (MPIX_Comm_is_revoked(comm, &flag) == MPI_SUCCESS && flag) return;
  TUTTI_MPI_WARN(MPIX_Comm_revoke(comm), "revoking a communicator after a lost rank");
#else
  (void)comm;
#endif
}

std::string failure_note() {
#if TUTTI_HAVE_ULFM
  if (!enabled()) return "";
  FtState& s = ft();
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  constexpr int64_t kEveryNs = 50 * 1000 * 1000;
  const bool fired = s.fired.load();
  if (!fired && now - s.asked_ns.load() < kEveryNs) {
    std::lock_guard<std::mutex> lock(s.mu);
    return s.note;
  }
  s.asked_ns = now;
  // A device communicator in a world without MPI (TUTTI_WORLD=local) under
  // `--with-ft ulfm`, or one closing after MPI_Finalize: nothing to ask.
  if (!is_initialized()) return "";
  const std::vector<int> lost = failed_ranks(0);
  std::string note;
  if (!lost.empty())
    note = detail::cat(lost.size() > 1 ? "world ranks " : "world rank ", rank_list(lost),
                       " died (MPI's failure detector)");
  else if (fired)
    note = "a peer died (a kRanksLost was raised in this process)";
  std::lock_guard<std::mutex> lock(s.mu);
  s.note = note;
  return note;
#else
  return "";
#endif
}

void set_shrink_test_hook(std::function<void(int attempt)> fn) {
  FtState& s = ft();
  std::lock_guard<std::mutex> lock(s.mu);
  s.shrink_hook = std::move(fn);
}

void set_on_failure(std::function<void()> fn) {
  FtState& s = ft();
  std::lock_guard<std::mutex> lock(s.mu);
  s.on_failure = std::move(fn);
  s.fired = false;
  s.note.clear();  // a recovery re-arms it: the dead are gone from base()
  s.asked_ns = 0;
}

void throw_ranks_lost(int rc, const char* expr, const std::string& context, const char* file,
                      int line) {
  FtState& s = ft();
  if (!s.fired.exchange(true)) {
    // The first failure this process sees since the last recovery: the
    // start of a recovery in the logs (docs/elastic.md, recovery across
    // hosts).
    TUTTI_LOG(kDebug) << "a rank died: first seen in " << context << " (" << expr << ")";
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      fn = s.on_failure;
    }
    if (fn) fn();
  }
  const std::vector<int> lost = failed_ranks(1.0);
  const std::string who =
      lost.empty() ? std::string("a peer died (which one is not known here yet)")
                   : detail::cat(lost.size() > 1 ? "world ranks " : "world rank ",
                                 rank_list(lost), " died");
  (void)file;
  (void)line;
  const Error error(ErrorCode::kRanksLost,
                    detail::cat(detail::rank_prefix(), context, ": ", who, " (", expr, ": ",
                                error_string(rc),
                                "); every communicator over them is revoked: the survivors "
                                "call tutti::recover() (tutti.recover()) to go on without "
                                "them"));
  // Under tutti-run (TUTTI_EXIT_ON_COMM_FAILURE) outside a RecoveryScope,
  // this ends the process for a restart, as any other peer failure.
  comm::communicator_broke(error);
  throw error;
}

Shrunk shrink(MPI_Comm old, int max_attempts) {
  Shrunk out;
#if TUTTI_HAVE_ULFM
  if (!enabled())
    TUTTI_THROW(kUnsupported, "shrinking a communicator needs ULFM (Open MPI 5 under "
                "`mpiexec --with-ft ulfm`; TUTTI_ULFM=1)");
  MPI_Group old_group;
  TUTTI_MPI_CHECK(MPI_Comm_group(old, &old_group), "recovery");
  MPI_Comm current = old;
  for (;;) {
    ++out.attempts;
    int members = 0, acked = 0;
    MPI_Comm_size(current, &members);
    MPIX_Comm_ack_failed(current, members, &acked);
    MPI_Comm next = MPI_COMM_NULL;
    auto t = std::chrono::steady_clock::now();
    int rc = MPIX_Comm_shrink(current, &next);
    out.shrink_s += seconds_since(t);
    if (rc == MPI_SUCCESS) {
      MPI_Comm_set_errhandler(next, MPI_ERRORS_RETURN);
      std::function<void(int)> hook;
      {
        std::lock_guard<std::mutex> lock(ft().mu);
        hook = ft().shrink_hook;
      }
      if (hook) hook(out.attempts);
      // Every survivor holds the same `next`; a failure since the shrink
      // makes the agreement fail on every member (ULFM's guarantee), and
      // the shrink runs again over `next`.
      int flag = 1;
      t = std::chrono::steady_clock::now();
      rc = MPIX_Comm_agree(next, &flag);
      out.agree_s += seconds_since(t);
      if (current != old) MPI_Comm_free(&current);
      current = next;
      if (rc == MPI_SUCCESS) break;
    }
    if (!is_failure(rc) || out.attempts >= max_attempts) {
      if (current != old) MPI_Comm_free(&current);
      MPI_Group_free(&old_group);
      TUTTI_THROW(kRanksLost, "recovery: shrinking the world failed after ", out.attempts,
                  " attempt(s): ", error_string(rc));
    }
    TUTTI_LOG(kWarn) << "recovery: another rank died while the world shrank; shrinking again";
  }
  out.comm = current;
  // Lost: members of `old` that the new communicator lacks, in `old`'s ranks.
  MPI_Group new_group;
  MPI_Comm_group(current, &new_group);
  int n = 0;
  MPI_Group_size(old_group, &n);
  std::vector<int> in(n), there(n, MPI_UNDEFINED);
  for (int i = 0; i < n; ++i) in[i] = i;
  MPI_Group_translate_ranks(old_group, n, in.data(), new_group, there.data());
  for (int i = 0; i < n; ++i)
    if (there[i] == MPI_UNDEFINED) out.lost.push_back(i);
  MPI_Group_free(&new_group);
  MPI_Group_free(&old_group);
#else
  (void)old;
  (void)max_attempts;
  TUTTI_THROW(kUnsupported, "recovery needs an MPI with ULFM (Open MPI 5 under "
              "`mpiexec --with-ft ulfm`); this tutti was built against one without it");
#endif
  return out;
}

}  // namespace ulfm
}  // namespace mpi
}  // namespace tutti
