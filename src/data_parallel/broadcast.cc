#include "data_parallel/broadcast.h"

#include <cstring>

#include "core/check.h"
#include "core/cuda_utils.h"

namespace tutti {
namespace dp {

int broadcast_tensors(ProcessGroup& group, const std::vector<Tensor>& tensors,
                      const std::vector<std::string>& names, int root,
                      size_t chunk_bytes, HostBufferPool& pool,
                      const std::string& what, void* stream) {
  TUTTI_CHECK_EQ(tensors.size(), names.size());
  TUTTI_ARG_CHECK(root >= 0 && root < group.size(), what, ": root ", root,
                  " is not a rank of group '", group.name(), "' of size ",
                  group.size());
  const bool is_root = group.rank() == root;
  auto packable = [&](const Tensor& t) {
    return !t.is_cuda() && t.nbytes() < chunk_bytes;
  };
  OpOptions o;
  o.stream = stream;
  int issued = 0;
  size_t i = 0;
  while (i < tensors.size()) {
    const Tensor& first = tensors[i];
    size_t j = i + 1;
    size_t bytes = first.nbytes();
    if (packable(first)) {
      while (j < tensors.size() && packable(tensors[j]) &&
             tensors[j].dtype() == first.dtype() &&
             bytes + tensors[j].nbytes() <= chunk_bytes)
        bytes += tensors[j++].nbytes();
    }
    ++issued;
    if (j == i + 1) {
      o.name = what + " '" + names[i] + "'";
      cuda::OptionalDeviceGuard device(first.device());  // NCCL on its device
      group.broadcast(first, root, o);
      i = j;
      continue;
    }
    o.name = detail::cat(what, " '", names[i], "' .. '", names[j - 1], "' (",
                         j - i, " tensors)");
    HostBuffer staging = pool.acquire(bytes);
    char* p = staging.as<char>();
    if (is_root)
      for (size_t k = i; k < j; p += tensors[k++].nbytes())
        if (tensors[k].nbytes()) std::memcpy(p, tensors[k].data(), tensors[k].nbytes());
    const int64_t numel = static_cast<int64_t>(bytes / dtype_size(first.dtype()));
    group.broadcast(Tensor(staging.data(), first.dtype(), Shape{numel}), root, o);
    p = staging.as<char>();
    if (!is_root)
      for (size_t k = i; k < j; p += tensors[k++].nbytes())
        if (tensors[k].nbytes()) std::memcpy(tensors[k].data(), p, tensors[k].nbytes());
    pool.release(std::move(staging));
    i = j;
  }
  return issued;
}

}  // namespace dp
}  // namespace tutti
