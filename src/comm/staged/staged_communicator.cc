// StagedCommunicator: the engine's side of a staged op (stage, exchange
// through the host communicator, unstage), splits, close.
#include "comm/staged/staged_communicator.h"

#include <atomic>
#include <mutex>
#include <utility>

#include "comm/comm_settings.h"
#include "comm/local/local_communicator.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/op_desc.h"
#include "comm/progress_engine.h"
#include "comm/registry.h"
#include "comm/staged/cuda_copier.h"
#include "comm/staged/staged_op_work.h"
#include "comm/staged/staging.h"
#include "core/check.h"
#include "tutti/log.h"

namespace tutti {
namespace staged {
namespace {

// The device side of a request's validation: what every backend checks,
// plus that the tensors are on the device this communicator serves.  Run
// where the host communicator validates (comm/layered_host.h).
void check_request(const OpRequest& r, const comm::OpLabel& d, Device device, int rank,
                   int size) {
  comm::validate(r, rank, size, d);
  if (r.kind == CollectiveKind::kBarrier) return;
  TUTTI_ARG_CHECK(r.input.device() == device && r.output.device() == device, d,
                  ": this staged communicator serves ", device.str(), ", got ",
                  r.input.str(), " -> ", r.output.str());
}

}  // namespace

class StagedCommunicatorImpl {
 public:
  // Over `host`, private to this communicator (null: a world of one).
  StagedCommunicatorImpl(std::shared_ptr<mpi::MpiCommunicator> host,
                         std::unique_ptr<Copier> c, std::string comm_name)
      : mpi(std::move(host)),
        local(mpi ? nullptr : std::make_shared<comm::LocalCommunicator>(comm_name)),
        copier(std::move(c)),
        pool(std::make_shared<HostBufferPool>(copier->pinned())),
        name(std::move(comm_name)),
        device(copier->device()),
        rank(mpi ? mpi->rank() : 0),
        size(mpi ? mpi->size() : 1),
        engine(name + "-staged") {}
  ~StagedCommunicatorImpl() { close(); }

  comm::LayeredHost& host() {
    if (mpi) return *mpi;
    return *local;
  }

  void execute(const OpRequest& r, const std::shared_ptr<StagedOpWork>& work);
  void close();
  // Marks the communicator unusable (once) and applies the failure policy
  // (comm::communicator_broke: TUTTI_EXIT_ON_COMM_FAILURE).
  void break_with(const Error& e) {
    {
      std::lock_guard<std::mutex> lock(broken_mu);
      if (broken) return;
      cause = e.message();
      broken = true;
    }
    comm::communicator_broke(e);
  }
  void throw_if_broken(const comm::OpLabel& desc) {
    if (!broken) return;
    std::lock_guard<std::mutex> lock(broken_mu);
    TUTTI_THROW(kAborted, desc, ": the staged communicator '", name,
                "' is unusable after an earlier failure: ", cause);
  }
  [[noreturn]] void staging_timeout(const comm::OpLabel& desc, double timeout_s) {
    const Error err(ErrorCode::kTimeout,
                    detail::cat(detail::rank_prefix(), desc, ": copying the input to host "
                                "memory did not complete within ", timeout_s,
                                " s (TUTTI_TIMEOUT): the caller's stream "
                                "(OpOptions::stream) never reached the operation; the "
                                "staged communicator '", name, "' is unusable now"));
    break_with(err);
    throw err;
  }

  std::shared_ptr<mpi::MpiCommunicator> mpi;        // the private duplicate
  std::shared_ptr<comm::LocalCommunicator> local;   // a world of one instead
  std::unique_ptr<Copier> copier;
  std::shared_ptr<HostBufferPool> pool;
  const std::string name;
  const Device device;
  const int rank;
  const int size;
  comm::ProgressEngine engine;
  comm::CommSettings settings;  // the hot path must not parse the environment
  // Numbered as the host duplicate numbers the same ops (its collectives
  // are this communicator's collectives and splits, in the same order), for
  // the errors raised before an op reaches it.  Engine only.
  uint64_t next_seq = 0;
  uint64_t next_p2p_seq = 0;
  std::mutex last_mu;
  std::shared_ptr<StagedOpWork> last_work;  // the newest op (synchronize())
  std::mutex broken_mu;
  std::atomic<bool> broken{false};
  std::string cause;
  std::mutex close_mu;
  std::atomic<bool> closed{false};
};

void StagedCommunicatorImpl::execute(const OpRequest& r,
                                     const std::shared_ptr<StagedOpWork>& work) {
  {
    std::lock_guard<std::mutex> lock(last_mu);
    last_work = work;
  }
  const bool p2p = r.kind == CollectiveKind::kSend || r.kind == CollectiveKind::kRecv;
  const uint64_t seq = p2p ? ++next_p2p_seq : ++next_seq;
  const comm::OpLabel desc(r, seq, name);
  try {
    throw_if_broken(desc);
    // 1. A request this rank rejects is not staged, but still goes to the
    // host communicator, whose check (below) fails it there with the op's
    // number, after telling the peers.
    bool valid = true;
    try {
      check_request(r, desc, device, rank, size);
    } catch (const Error&) {
      valid = false;
    }
    std::unique_ptr<Staging> staging =
        valid ? std::make_unique<Staging>(r, rank, pool) : std::make_unique<Staging>(r);
    // 2. Device -> staging, after the caller's stream.
    OpCopies& copies = work->copies();
    if (valid) {
      try {
        if (staging->copy_in())
          copies.to_host(staging->staging_in(), r.input.data(), r.input.nbytes());
        if (!copies.wait_host(r.options.timeout_s)) staging_timeout(desc, r.options.timeout_s);
      } catch (...) {
        staging->abandon();  // a copy may still write it
        const Error e = detail::error_of(std::current_exception());
        break_with(e);
        throw e;
      }
    }
    // 3. The exchange.  The check runs on the host engine (a send/recv is
    // posted later): it holds copies, not references.
    const Device dev = device;
    const int rk = rank, sz = size;
    comm::LayeredHost::Check check = [r, dev, rk, sz](const comm::OpLabel& d) {
      check_request(r, d, dev, rk, sz);
    };
    if (p2p) {
      WorkPtr posted = host().submit_layered(staging->host_request(), false, std::move(check));
      const bool recv = valid && staging->copy_out();
      work->posted(std::move(posted), std::move(staging), recv ? r.input.data() : nullptr,
                   r.input.nbytes());
      work->started(seq, desc.str());
      return;
    }
    WorkPtr exchange = host().submit_layered(staging->host_request(), true, std::move(check));
    try {
      exchange->wait();
    } catch (...) {
      staging->settle_after(std::current_exception());
      throw;
    }
    // 4. Staging -> device; the buffer goes back to the pool at once (a
    // later holder writes it only after its own wait_host()).
    try {
      if (staging->copy_out())
        copies.to_device(r.output.data(), staging->staging_out(), r.output.nbytes());
      copies.finish();
    } catch (...) {
      staging->abandon();
      const Error e = detail::error_of(std::current_exception());
      break_with(e);
      throw e;
    }
    staging->release();
    work->started(seq, desc.str());
  } catch (...) {
    work->failed(std::current_exception(), seq, desc.str());
  }
}

void StagedCommunicatorImpl::close() {
  std::lock_guard<std::mutex> lock(close_mu);
  if (closed.exchange(true)) return;
  engine.stop();  // every op submitted so far has started or failed
  // Also from destructors and at exit: log, never throw.
  try {
    if (!broken && !copier->quiesce(settings.get().timeout_s))
      TUTTI_LOG(kWarn) << "staged communicator '" << name
                       << "': copies still in flight at close after TUTTI_TIMEOUT";
  } catch (const std::exception& e) {
    TUTTI_LOG(kWarn) << "staged communicator '" << name << "': closing: " << e.what();
  }
  if (mpi) mpi->close();
}

StagedCommunicator::StagedCommunicator(std::shared_ptr<StagedCommunicatorImpl> impl)
    : impl_(std::move(impl)) {}
StagedCommunicator::~StagedCommunicator() { close(); }

std::shared_ptr<StagedCommunicator> StagedCommunicator::create(
    std::shared_ptr<mpi::MpiCommunicator> host, int device, const std::string& name) {
  // The copier first: it creates the stream (the device's context), which
  // the pool's pinned buffers need.
  return create(std::move(host), make_cuda_copier(device), name);
}

std::shared_ptr<StagedCommunicator> StagedCommunicator::create(
    std::shared_ptr<mpi::MpiCommunicator> host, std::unique_ptr<Copier> copier,
    const std::string& name) {
  // A private duplicate: a split of every rank, numbered, agreed and bounded
  // like a collective, in order with the group's host ops.
  std::shared_ptr<mpi::MpiCommunicator> dup;
  if (host) {
    dup = host->split_mpi(0, host->rank(), name);
    comm::register_communicator(dup);
  }
  auto impl = std::make_shared<StagedCommunicatorImpl>(dup, std::move(copier), name);
  TUTTI_LOG(kDebug) << "staged communicator '" << name << "' ready for "
                    << impl->device.str() << " (" << impl->size << " ranks)";
  return std::shared_ptr<StagedCommunicator>(new StagedCommunicator(impl));
}

int StagedCommunicator::rank() const { return impl_->rank; }
int StagedCommunicator::size() const { return impl_->size; }
std::string StagedCommunicator::name() const { return impl_->name; }
int StagedCommunicator::device() const {
  return impl_->device.is_cuda() ? impl_->device.index : -1;
}
void StagedCommunicator::drain() { impl_->engine.drain(); }
void StagedCommunicator::close() { impl_->close(); }
bool StagedCommunicator::broken() const { return impl_->broken; }
size_t StagedCommunicator::staging_allocations() const {
  return impl_->pool->allocations();
}

void StagedCommunicator::synchronize() {
  impl_->engine.drain();
  std::shared_ptr<StagedOpWork> last;
  {
    std::lock_guard<std::mutex> lock(impl_->last_mu);
    last = impl_->last_work;
  }
  // Copies complete in stream order: the newest op's completing means
  // every earlier collective's did.
  if (last) last->synchronize();
}

WorkPtr StagedCommunicator::submit(const OpRequest& request, bool blocking) {
  StagedCommunicatorImpl* impl = impl_.get();
  if (impl->closed)
    TUTTI_THROW(kAborted, collective_kind_name(request.kind), " on staged communicator '",
                impl->name, "': it is closed");
  auto q = std::make_shared<OpRequest>(request);
  if (q->options.timeout_s <= 0) q->options.timeout_s = impl->settings.get().timeout_s;
  std::weak_ptr<StagedCommunicatorImpl> owner = impl_;
  // Marks the caller's stream now: the op reads what was enqueued so far.
  auto work = std::make_shared<StagedOpWork>(
      impl->copier->begin(request.options.stream), [owner](const Error& e) {
        if (auto o = owner.lock()) o->break_with(e);
      });
  // `impl` outlives its engine's tasks: close() drains them first.
  impl->engine.submit([impl, q, work] { impl->execute(*q, work); }, blocking);
  return work;
}

std::shared_ptr<Communicator> StagedCommunicator::split(int, int, const std::string&) {
  TUTTI_THROW(kUnsupported,
              "split a ProcessGroup, not its staged communicator: the host "
              "communicator must split alongside");
}

std::shared_ptr<comm::DeviceCommunicator> StagedCommunicator::split_device(
    int color, int key, std::shared_ptr<mpi::MpiCommunicator>, const std::string& name) {
  StagedCommunicatorImpl* parent = impl_.get();
  std::shared_ptr<StagedCommunicator> child;
  // In order with this communicator's ops: the split is the duplicate's
  // next collective on every rank.
  parent->engine.run_and_wait([&] {
    const uint64_t seq = ++parent->next_seq;  // the duplicate numbers its split
    parent->throw_if_broken(comm::OpLabel(detail::cat(
        "split #", seq, " (color ", color, ", key ", key, ") of staged communicator '",
        parent->name, "'")));
    std::shared_ptr<mpi::MpiCommunicator> host;
    if (parent->mpi) {
      host = parent->mpi->split_mpi(color, key, name);
      if (!host) return;
      comm::register_communicator(host);
    } else if (color < 0) {
      return;
    }
    auto impl = std::make_shared<StagedCommunicatorImpl>(host, parent->copier->another(), name);
    child.reset(new StagedCommunicator(impl));
  });
  return child;
}

}  // namespace staged
}  // namespace tutti
