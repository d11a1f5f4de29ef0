#include "preemption/leaving.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <set>

#include <nlohmann/json.hpp>

#include "checkpoint/dir_lock.h"
#include "checkpoint/file_util.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {
namespace preempt {
namespace {

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

// The node's own non-loopback addresses: tutti-run matches a discovered
// host given as an address (or a name resolving to one) against them.
std::vector<std::string> addresses() {
  std::set<std::string> out;
  struct ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  for (struct ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || (a->ifa_flags & IFF_LOOPBACK)) continue;
    char buf[INET6_ADDRSTRLEN] = {0};
    const int fam = a->ifa_addr->sa_family;
    const void* src = nullptr;
    if (fam == AF_INET)
      src = &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr;
    else if (fam == AF_INET6)
      src = &reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr;
    if (src != nullptr && ::inet_ntop(fam, src, buf, sizeof(buf)) != nullptr) out.insert(buf);
  }
  ::freeifaddrs(list);
  return {out.begin(), out.end()};
}

// One record: `rec` as a line of JSON in dir/name, written atomically
// (0600), `dir` created when missing.  ensure_ascii: a name or detail with
// invalid UTF-8 must not throw.  Throws on failure: each caller says it its
// own way and goes on.
void write_record(const std::string& dir, const std::string& name, const nlohmann::json& rec) {
  ckpt::make_dirs(dir);
  ckpt::write_file_atomic(
      dir, name, rec.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace) + "\n", 0600);
}

}  // namespace

bool notice_is_node_local(const std::string& source, int signal_sender) {
  if (source == "file" || source == "aws" || source == "gcp" || source == "azure") return true;
  if (source.rfind("SIG", 0) == 0) return signal_sender != static_cast<int>(::getppid());
  return false;  // PreemptionMonitor::notify: the application's own notice
}

void record_leaving(const std::string& source, const std::string& reason) {
  const std::string dir = config::get_string("TUTTI_ELASTIC_DIR");
  if (dir.empty()) return;
  const std::string own = host_name();
  std::string host = config::get_string("TUTTI_ELASTIC_HOST");
  if (host.empty()) host = own;
  if (host.empty() || host.find('/') != std::string::npos || host[0] == '.') {
    TUTTI_LOG(kWarn) << "elastic: cannot record this host as leaving: unusable host name '"
                     << host << "' (set TUTTI_ELASTIC_HOST)";
    return;
  }
  nlohmann::json names = nlohmann::json::array({host});
  if (!own.empty() && own != host) names.push_back(own);
  const nlohmann::json rec = {
      {"host", host}, {"names", names}, {"addresses", addresses()}, {"source", source},
      {"reason", reason}, {"time", static_cast<double>(std::time(nullptr))},
      {"job", ckpt::default_job_id()}, {"pid", static_cast<int>(::getpid())}};
  const std::string leaving = dir + "/leaving";
  try {
    write_record(leaving, host, rec);
    TUTTI_LOG(kWarn) << "elastic: recorded " << leaving << "/" << host << " (" << source
                     << "): tutti-run leaves this host out of the next start";
  } catch (const std::exception& e) {
    TUTTI_LOG(kWarn) << "elastic: cannot record this host as leaving in " << leaving << ": "
                     << e.what();
  }
}

void record_exit(int status, const std::string& reason) {
  const std::string dir = config::get_string("TUTTI_ELASTIC_DIR");
  if (dir.empty()) return;
  std::string host = config::get_string("TUTTI_ELASTIC_HOST");
  if (host.empty()) host = host_name();
  if (host.empty() || host.find('/') != std::string::npos || host[0] == '.') host = "unknown";
  const int pid = static_cast<int>(::getpid());
  const nlohmann::json rec = {{"host", host},
                              {"pid", pid},
                              {"status", status},
                              {"attempt", config::get_int("TUTTI_RESTART_COUNT")},
                              {"reason", reason},
                              {"time", static_cast<double>(std::time(nullptr))}};
  const std::string exited = dir + "/exited";
  try {
    write_record(exited, host + "-" + std::to_string(pid), rec);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[tutti] elastic: cannot record this rank's exit in %s: %s\n",
                 exited.c_str(), e.what());
  }
}

void record_run_event(const char* event, int size) {
  const std::string dir = config::get_string("TUTTI_RUN_DIR");
  if (dir.empty()) return;
  const int attempt = config::get_int("TUTTI_RESTART_COUNT");
  const nlohmann::json rec = {{"event", event},
                              {"attempt", attempt},
                              {"host", host_name()},
                              {"pid", static_cast<int>(::getpid())},
                              {"rank", 0},
                              {"size", size},
                              {"time", static_cast<double>(std::time(nullptr))}};
  try {
    write_record(dir, std::string(event) + "-" + std::to_string(attempt), rec);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[tutti] cannot record '%s' in TUTTI_RUN_DIR=%s: %s\n", event,
                 dir.c_str(), e.what());
  }
}

}  // namespace preempt
}  // namespace tutti
