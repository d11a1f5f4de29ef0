#include "tutti/process_group.h"

#include "comm/device_transport.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/process_group_impl.h"
#include "comm/registry.h"
#include "comm/staged/staged_communicator.h"
#include "core/check.h"
#include "tutti/config.h"

namespace tutti {

ProcessGroup::ProcessGroup(std::unique_ptr<ProcessGroupImpl> impl)
    : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::rank() const { return impl_->host()->rank(); }
int ProcessGroup::size() const { return impl_->host()->size(); }
std::string ProcessGroup::name() const { return impl_->name; }

WorkPtr ProcessGroup::submit(const OpRequest& request, bool blocking) {
  if (request.kind != CollectiveKind::kBarrier && request.input.is_cuda())
    return cuda_communicator(request.input.device().index)
        ->submit(request, blocking);
  if (request.kind != CollectiveKind::kBarrier && request.output.is_cuda())
    TUTTI_THROW(kInvalidArgument, collective_kind_name(request.kind),
                " on group '", impl_->name, "': input ", request.input.str(),
                " is on the host but output ", request.output.str(),
                " is on a CUDA device");
  return impl_->host()->submit(request, blocking);
}

CommunicatorPtr ProcessGroup::cpu_communicator() { return impl_->host(); }

CommunicatorPtr ProcessGroup::cuda_communicator(int device) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->cuda.find(device);
  if (it != impl_->cuda.end()) return it->second;
  if (!cuda_built())  // kUnsupported, as every CUDA-without-CUDA site
    TUTTI_THROW(kUnsupported, "a tensor on cuda:", device, " reached group '",
                impl_->name,
                "', but this build of tutti has no CUDA support (rebuild "
                "with -DTUTTI_WITH_CUDA=ON)");
  const comm::TransportSetting setting = comm::transport_setting();
  TUTTI_ARG_CHECK(setting == comm::TransportSetting::kStaged ||
                      config::get_bool("TUTTI_NCCL"),
                  "a tensor on cuda:", device, " reached group '", impl_->name,
                  "', but TUTTI_NCCL=0 disables the NCCL backend");
  const int visible = cuda_device_count();
  TUTTI_ARG_CHECK(device >= 0 && device < visible, "a tensor on cuda:", device,
                  " reached group '", impl_->name, "', but this process sees ",
                  visible, " CUDA device(s)");
  // NCCL, or staged where ranks share a device (collective with auto).
  const std::string name = impl_->name + "-cuda" + std::to_string(device);
  std::shared_ptr<comm::DeviceCommunicator> c;
  if (comm::choose_transport(impl_->mpi, device, setting, impl_->name) ==
      comm::DeviceTransport::kNccl)
    c = nccl::NcclCommunicator::create(impl_->mpi, device, name);
  else
    c = staged::StagedCommunicator::create(impl_->mpi, device, name);
  comm::register_communicator(c);
  impl_->cuda.emplace(device, c);
  return c;
}

std::shared_ptr<Communicator> ProcessGroup::split(int color, int key,
                                                  const std::string& name) {
  return split_group(color, key, name);
}

std::shared_ptr<ProcessGroup> ProcessGroup::split_group(
    int color, int key, const std::string& name) {
  const std::string child_name =
      name.empty() ? impl_->name + "/" + std::to_string(color) : name;
  if (!impl_->mpi) {
    if (color < 0) return nullptr;
    return std::make_shared<ProcessGroup>(std::make_unique<ProcessGroupImpl>(
        child_name, std::make_shared<comm::LocalCommunicator>(child_name)));
  }
  auto host_child = impl_->mpi->split_mpi(color, key, child_name);
  if (host_child) comm::register_communicator(host_child);
  std::unique_ptr<ProcessGroupImpl> impl;
  if (host_child)
    impl = std::make_unique<ProcessGroupImpl>(child_name, host_child);
  // Split an existing device communicator alongside (NCCL: ncclCommSplit;
  // staged: a split of its host duplicate).  Every rank of the parent must
  // take part, so first agree that every rank has one (a rank that never
  // used CUDA has none; the child then bootstraps lazily).
  std::shared_ptr<comm::DeviceCommunicator> parent_device;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->cuda.size() == 1) parent_device = impl_->cuda.begin()->second;
  }
  int32_t have = parent_device ? 1 : 0;
  impl_->mpi->allreduce(Tensor::of(&have, 1), ReduceOp::kMin,
                        OpOptions{"device split agreement"});
  if (have) {
    auto device_child =
        parent_device->split_device(color, key, host_child, child_name + "-cuda");
    if (device_child && impl) {
      comm::register_communicator(device_child);
      impl->cuda.emplace(device_child->device(), device_child);
    }
  }
  if (!impl) return nullptr;
  return std::make_shared<ProcessGroup>(std::move(impl));
}

std::shared_ptr<ProcessGroup> ProcessGroup::node_group() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->node) return impl_->node;
  if (!impl_->mpi) {
    impl_->node = std::make_shared<ProcessGroup>(std::make_unique<ProcessGroupImpl>(
        impl_->name + "/node", std::make_shared<comm::LocalCommunicator>(impl_->name + "/node")));
    return impl_->node;
  }
  auto c = impl_->mpi->split_shared(impl_->name + "/node");
  comm::register_communicator(c);
  impl_->node = std::make_shared<ProcessGroup>(
      std::make_unique<ProcessGroupImpl>(impl_->name + "/node", c));
  return impl_->node;
}

std::shared_ptr<ProcessGroup> ProcessGroup::cross_node_group() {
  auto node = node_group();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->cross) return impl_->cross;
  }
  auto cross = split_group(node->rank(), rank(), impl_->name + "/cross");
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->cross = cross;
  return cross;
}

int ProcessGroup::world_rank(int group_rank) const {
  TUTTI_ARG_CHECK(group_rank >= 0 && group_rank < size(), "rank ", group_rank,
                  " is not in group '", impl_->name, "' of size ", size());
  return impl_->mpi ? impl_->mpi->world_rank(group_rank) : group_rank;
}

int ProcessGroup::join() {
  if (!impl_->mpi) return 0;  // a world of one: nothing to wait for
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->cuda.empty()) {
      const bool nccl = impl_->cuda.begin()->second->backend() == "nccl";
      TUTTI_THROW(kUnsupported, "join() on group '", impl_->name, "': the group has ",
                  nccl ? "an NCCL communicator" : "a staged communicator for CUDA tensors",
                  " (cuda:", impl_->cuda.begin()->first, "), ",
                  nccl ? "whose agreement check overlaps the operation, so a "
                         "joined rank cannot serve it"
                       : "which a joined rank does not serve",
                  "; join() needs host tensors (the MPI backend) for now");
    }
  }
  return mpi::join(impl_->mpi);
}

void ProcessGroup::synchronize() {
  if (impl_->mpi) impl_->mpi->drain();
  std::lock_guard<std::mutex> lock(impl_->mu);
  // CUDA: completed on the device, not only enqueued (drain()), as on MPI.
  for (auto& c : impl_->cuda) c.second->synchronize();
}

}  // namespace tutti
