#include "comm/local/local_communicator.h"

#include <cstring>

#include "comm/cpu_work.h"
#include "comm/op_desc.h"
#include "core/check.h"

namespace tutti {
namespace comm {

WorkPtr LocalCommunicator::submit(const OpRequest& r, bool blocking) {
  return submit_layered(r, blocking, nullptr);
}

WorkPtr LocalCommunicator::submit_layered(const OpRequest& r, bool,
                                          Check also_validate) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t seq = ++next_seq_;
  const OpLabel desc(r, seq, name_);
  auto work = std::make_shared<CpuWork>(seq, desc.str());
  try {
    if (also_validate) also_validate(desc);
    validate(r, 0, 1, desc);
    if (r.kind != CollectiveKind::kBarrier)
      TUTTI_ARG_CHECK(r.input.device().is_cpu() && r.output.device().is_cpu(),
                      desc, ": the local backend takes host tensors, got ",
                      r.input.str());
    switch (r.kind) {
      case CollectiveKind::kAllreduce:
      case CollectiveKind::kAllgather:
      case CollectiveKind::kAllgatherv:
      case CollectiveKind::kReduceScatter:
      case CollectiveKind::kAlltoall:
        // With one rank each of these is the identity (avg/min/max/prod of
        // a single contribution included).
        if (r.input.data() != r.output.data() && r.output.nbytes())
          std::memmove(r.output.data(), r.input.data(), r.output.nbytes());
        break;
      case CollectiveKind::kBroadcast:
      case CollectiveKind::kBarrier:
        break;
      case CollectiveKind::kSend: {
        const char* p = static_cast<const char*>(r.input.data());
        mailbox_[r.tag].emplace_back(p, p + r.input.nbytes());
        break;
      }
      case CollectiveKind::kRecv: {
        auto& q = mailbox_[r.tag];
        TUTTI_ARG_CHECK(!q.empty(), desc,
                        ": no message from self with this tag (in a world of "
                        "one, send must come before recv)");
        TUTTI_ARG_CHECK(q.front().size() == r.input.nbytes(), desc,
                        ": message has ", q.front().size(),
                        " bytes, the tensor ", r.input.nbytes());
        if (r.input.nbytes())
          std::memcpy(r.input.data(), q.front().data(), r.input.nbytes());
        q.erase(q.begin());
        break;
      }
    }
    work->finish();
  } catch (...) {
    work->finish(std::current_exception());
  }
  return work;
}

std::shared_ptr<Communicator> LocalCommunicator::split(int color, int,
                                                       const std::string& name) {
  if (color < 0) return nullptr;
  return std::make_shared<LocalCommunicator>(name.empty() ? name_ + "/0" : name);
}

}  // namespace comm
}  // namespace tutti
