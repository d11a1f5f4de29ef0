// A host communicator that another transport runs its operations through:
// the staged device transport (comm/staged/) hands the host communicator a
// request over host staging buffers, and with it the check of its own
// request (the device tensors), run where the host communicator validates.
// So a device-side error names the op with the host communicator's sequence
// number and group, and a rank that rejects its arguments still takes part
// in the agreement check, marked invalid: its peers fail at once ("rank 1
// rejected the arguments of this operation") instead of at TUTTI_TIMEOUT.
// Implemented by mpi::MpiCommunicator and comm::LocalCommunicator.
#pragma once

#include <functional>

#include "comm/op_desc.h"
#include "tutti/comm.h"

namespace tutti {
namespace comm {

class LayeredHost {
 public:
  // Throws Error(kInvalidArgument) naming `desc` when the layered request
  // is invalid on this rank.
  using Check = std::function<void(const OpLabel& desc)>;
  virtual ~LayeredHost() = default;
  // submit(), with `also_validate` run before the host communicator's own
  // validation of `request` (for collectives and send/recv alike).
  virtual WorkPtr submit_layered(const OpRequest& request, bool blocking,
                                 Check also_validate) = 0;
};

}  // namespace comm
}  // namespace tutti
