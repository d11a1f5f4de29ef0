// TUTTI_DEVICE_TRANSPORT: the votes, the decision, and its exchange.
#include "comm/device_transport.h"

#include <unistd.h>

#include <cstring>
#include <functional>
#include <map>
#include <utility>

#include "comm/mpi/mpi_communicator.h"
#include "core/check.h"
#include "core/cuda_utils.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {
namespace comm {
namespace {

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string uuid_text(const uint8_t* u) {
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += kHex[u[i] >> 4];
    s += kHex[u[i] & 15];
  }
  return s;
}

}  // namespace

const char* transport_name(DeviceTransport t) {
  return t == DeviceTransport::kNccl ? "nccl" : "staged";
}

const char* setting_name(TransportSetting s) {
  switch (s) {
    case TransportSetting::kAuto: return "auto";
    case TransportSetting::kNccl: return "nccl";
    case TransportSetting::kStaged: return "staged";
  }
  return "invalid";
}

TransportSetting transport_setting() {
  const std::string v = config::get_string("TUTTI_DEVICE_TRANSPORT");
  if (v == "auto") return TransportSetting::kAuto;
  if (v == "nccl") return TransportSetting::kNccl;
  if (v == "staged") return TransportSetting::kStaged;
  TUTTI_THROW(kInvalidArgument, "TUTTI_DEVICE_TRANSPORT='", v,
              "' (expected auto, nccl or staged)");
}

TransportVote local_vote(int device, TransportSetting setting) {
  TransportVote v;
  v.setting = static_cast<uint8_t>(setting);
  v.nccl_built = TUTTI_WITH_NCCL ? 1 : 0;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) name[0] = '\0';
  v.host = std::hash<std::string>()(std::string(name)) | 1;  // never 0
#if TUTTI_WITH_CUDA
  cudaDeviceProp prop;
  TUTTI_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  static_assert(sizeof(prop.uuid.bytes) == sizeof(v.uuid), "a CUDA UUID is 16 bytes");
  std::memcpy(v.uuid, prop.uuid.bytes, sizeof(v.uuid));
#else
  (void)device;
#endif
  return v;
}

DeviceTransport decide_transport(const std::vector<TransportVote>& votes,
                                 const std::string& group, std::string* why) {
  TUTTI_CHECK(!votes.empty(), "decide_transport: no votes for group '", group, "'");
  // Every rank must have asked for the same thing.
  std::map<uint8_t, std::vector<int>> by_setting;
  bool all_nccl = true;
  for (size_t r = 0; r < votes.size(); ++r) {
    by_setting[votes[r].setting].push_back(static_cast<int>(r));
    all_nccl = all_nccl && votes[r].nccl_built;
  }
  if (by_setting.size() > 1) {
    std::string list;
    for (const auto& s : by_setting)
      list += detail::cat(list.empty() ? "" : "; ", ranks_text(s.second), " ",
                          s.second.size() == 1 ? "has " : "have ",
                          setting_name(static_cast<TransportSetting>(s.first)));
    TUTTI_THROW(kInvalidArgument, "TUTTI_DEVICE_TRANSPORT differs across the ranks of group '",
                group, "' (", list, "); every rank must choose the same transport for "
                "CUDA tensors");
  }
  const auto setting = static_cast<TransportSetting>(votes[0].setting);
  switch (setting) {
    case TransportSetting::kStaged:
      return DeviceTransport::kStaged;
    case TransportSetting::kNccl:
      if (!all_nccl)
        TUTTI_THROW(kUnsupported, "TUTTI_DEVICE_TRANSPORT=nccl for group '", group,
                    "', but tutti was built without NCCL on some rank (rebuild with "
                    "-DTUTTI_WITH_NCCL=ON, or use staged or auto)");
      return DeviceTransport::kNccl;
    case TransportSetting::kAuto:
      break;
  }
  if (!all_nccl) {
    if (why) *why = "this build of tutti has no NCCL";
    return DeviceTransport::kStaged;
  }
  // Two ranks on one host with one device: NCCL would refuse them.
  std::map<std::pair<uint64_t, std::string>, int> seen;
  for (size_t r = 0; r < votes.size(); ++r) {
    const std::string u(reinterpret_cast<const char*>(votes[r].uuid), sizeof(votes[r].uuid));
    auto it = seen.emplace(std::make_pair(votes[r].host, u), static_cast<int>(r));
    if (!it.second) {
      if (why)
        *why = detail::cat("ranks ", it.first->second, " and ", r,
                           " of the group share CUDA device ", uuid_text(votes[r].uuid),
                           " on one host, which NCCL refuses");
      return DeviceTransport::kStaged;
    }
  }
  return DeviceTransport::kNccl;
}

DeviceTransport choose_transport(const std::shared_ptr<mpi::MpiCommunicator>& host,
                                 int device, TransportSetting setting,
                                 const std::string& group) {
  // An explicit choice, or auto without NCCL, cannot depend on the peers.
  if (setting == TransportSetting::kNccl) return DeviceTransport::kNccl;
  if (setting == TransportSetting::kStaged) return DeviceTransport::kStaged;
  std::string why;
  DeviceTransport t;
  if (!TUTTI_WITH_NCCL) {
    t = DeviceTransport::kStaged;
    why = "this build of tutti has no NCCL";
  } else {
    const TransportVote mine = local_vote(device, setting);
    std::vector<TransportVote> votes(host ? static_cast<size_t>(host->size()) : 1);
    if (host) {
      OpOptions o;
      o.name = "device transport votes";
      host->allgather(Tensor(const_cast<TransportVote*>(&mine), DType::kUInt8,
                             Shape{static_cast<int64_t>(sizeof(mine))}),
                      Tensor(votes.data(), DType::kUInt8,
                             Shape{static_cast<int64_t>(votes.size() * sizeof(mine))}),
                      o);
    } else {
      votes[0] = mine;
    }
    t = decide_transport(votes, group, &why);
  }
  if (t == DeviceTransport::kStaged)
    TUTTI_LOG(kInfo) << "group '" << group << "': CUDA tensors on cuda:" << device
                     << " go through the staged transport (host memory over MPI): "
                     << why << " (TUTTI_DEVICE_TRANSPORT=auto)";
  return t;
}

}  // namespace comm
}  // namespace tutti
