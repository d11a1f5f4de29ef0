// Which transport serves a group's CUDA tensors on one device
// (TUTTI_DEVICE_TRANSPORT): NCCL, or the staged transport through host
// memory over the group's MPI communicator (comm/staged/).
//
//  * nccl:   always NCCL (Error(kUnsupported) in a build without it).
//  * staged: always staged.
//  * auto (default): NCCL when every rank of the group has a CUDA device of
//    its own, staged when two ranks on one host would share a device (NCCL
//    refuses two ranks of a communicator on one GPU) or when the build has
//    no NCCL.
//
// With auto the ranks exchange one 32-byte vote each (their device's UUID,
// a hash of their host name, their setting) over the group's host
// communicator, and every rank takes the same decision from the same votes
// (decide_transport).  An explicit setting needs no exchange: ranks whose
// settings differ start different bootstraps (NCCL broadcasts its unique
// id, staged splits the host communicator) and the agreement check fails
// them all with kMismatch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tutti {
namespace mpi {
class MpiCommunicator;
}
namespace comm {

enum class DeviceTransport : uint8_t { kNccl = 1, kStaged = 2 };
enum class TransportSetting : uint8_t { kAuto = 0, kNccl = 1, kStaged = 2 };

const char* transport_name(DeviceTransport t);
const char* setting_name(TransportSetting s);
// TUTTI_DEVICE_TRANSPORT, parsed; Error(kInvalidArgument) naming the value
// and the choices when it is none of auto, nccl, staged.
TransportSetting transport_setting();

// One rank's vote: what the others need to know to decide alike.
struct TransportVote {
  uint8_t uuid[16] = {};   // the device's UUID (cudaDeviceProp::uuid)
  uint64_t host = 0;       // hash of the host name
  uint8_t setting = 0;     // TransportSetting
  uint8_t nccl_built = 0;  // this build has NCCL
  uint8_t pad[6] = {};
};
static_assert(sizeof(TransportVote) == 32, "TransportVote is exchanged as raw bytes");

// This rank's vote for CUDA device `device` (its UUID; all zero in a build
// without CUDA) under `setting`.
TransportVote local_vote(int device, TransportSetting setting);

// The transport every rank of group `group` takes from every rank's vote
// (index = rank).  The same on every rank given the same votes.  Throws
// Error(kInvalidArgument) when the ranks' settings differ (naming them) and
// Error(kUnsupported) for nccl where some rank's build has no NCCL.  With
// auto and a shared device, *why (if given) says which ranks share it.
DeviceTransport decide_transport(const std::vector<TransportVote>& votes,
                                 const std::string& group, std::string* why = nullptr);

// The transport for this group's tensors on `device`.  With auto (and
// NCCL built), collective over `host` (null: a world of one, decided
// alone): one allgather of the votes, in order with the host's ops.
DeviceTransport choose_transport(const std::shared_ptr<mpi::MpiCommunicator>& host,
                                 int device, TransportSetting setting,
                                 const std::string& group);

}  // namespace comm
}  // namespace tutti
