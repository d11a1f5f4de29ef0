// MemoryReplica, the commit side, and the file copies (memory_replica.h).
// The restore side is memory_restore.cc.
#include "checkpoint/memory_replica.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "checkpoint/catalog.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/mapped_file.h"
#include "checkpoint/retention.h"
#include "core/check.h"
#include "tutti/config.h"
#include "tutti/log.h"

namespace tutti {
namespace ckpt {
namespace {

constexpr int kBuddyTag = 0x7c50;  // buddy copies (private communicator)

std::string message_of(const Error& e) { return e.message(); }

}  // namespace

void send_file(ProcessGroup& comm, const std::string& path, int peer, int tag,
               const OpOptions& o, std::string* error) {
  // Sent from a read-only mapping: no copy of the file on this side.
  File f;
  MappedFile map;
  int64_t size = -1;
  try {
    f = File::open_read(path);
    const uint64_t n = f.size();
    map = MappedFile::map_whole(f.fd(), n, /*writable=*/false, path);
    size = static_cast<int64_t>(n);
  } catch (const Error& e) {
    *error = message_of(e);
  }
  comm.send(Tensor::of(&size, 1), peer, tag, o);
  if (size <= 0) return;
  for (uint64_t at = 0; at < map.size();) {
    const uint64_t n = std::min<uint64_t>(kMemoryChunkBytes, map.size() - at);
    // send() only reads the bytes of this read-only mapping.
    comm.send(Tensor(const_cast<unsigned char*>(map.data()) + at, DType::kUInt8,
                     Shape{static_cast<int64_t>(n)}),
              peer, tag, o);
    at += n;
  }
}

void recv_file(ProcessGroup& comm, int peer, int tag, const OpOptions& o,
               const std::string& dir, const std::string& name, unsigned mode,
               std::string* error) {
  int64_t size = 0;
  comm.recv(Tensor::of(&size, 1), peer, tag, o);
  if (size < 0) {
    *error = detail::cat("rank ", peer, " could not read its copy of ", name);
    return;
  }
  // Received straight into a shared mapping of the new file (tmpfs: the
  // pages are the file's), then renamed into place.
  const std::string tmp = join_path(dir, "." + name + ".tmp");
  int fd = -1;
  MappedFile map;
  std::vector<uint8_t> scratch;  // only to drain the messages after a local failure
  std::string local;
  try {
    File::create(tmp, mode).close();  // O_EXCL | O_NOFOLLOW in our 0700 directory
    fd = ::open(tmp.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);  // a shared mapping reads too
    if (fd < 0) TUTTI_THROW(kIo, "opening '", tmp, "' failed: ", std::strerror(errno));
    if (size > 0) {
      if (::ftruncate(fd, size) != 0)
        TUTTI_THROW(kIo, "sizing '", tmp, "' to ", size, " bytes failed: ", std::strerror(errno));
      map = MappedFile::map_whole(fd, static_cast<uint64_t>(size), /*writable=*/true, tmp);
    }
  } catch (const Error& e) {
    local = message_of(e);
  }
  for (uint64_t at = 0; at < static_cast<uint64_t>(size);) {
    const uint64_t n = std::min<uint64_t>(kMemoryChunkBytes, static_cast<uint64_t>(size) - at);
    uint8_t* dst = map.mapped() ? map.writable_data() + at : nullptr;
    if (!dst) {
      scratch.resize(static_cast<size_t>(n));
      dst = scratch.data();
    }
    comm.recv(Tensor(dst, DType::kUInt8, Shape{static_cast<int64_t>(n)}), peer, tag, o);
    at += n;
  }
  map = MappedFile();
  if (fd >= 0 && ::close(fd) != 0 && local.empty())  // RAM: no fsync (a lost host loses it anyway)
    local = detail::cat("closing '", tmp, "' failed: ", std::strerror(errno));
  if (local.empty()) {
    try {
      rename_path(tmp, join_path(dir, name));
    } catch (const Error& e) {
      local = message_of(e);
    }
  }
  if (!local.empty()) {
    ::unlink(tmp.c_str());
    *error = local;
  }
}

std::unique_ptr<MemoryReplica> MemoryReplica::make(ProcessGroup& comm, double timeout_s,
                                                   unsigned file_mode, unsigned dir_mode) {
  if (comm.size() == 1) return nullptr;  // one rank: one host (and maybe no MPI)
  std::unique_ptr<MemoryReplica> m(new MemoryReplica(comm, timeout_s, file_mode, dir_mode));
  m->node_ = comm.node_group();
  Agreement agree(comm, timeout_s, "memory tier");
  std::vector<int64_t> keys(static_cast<size_t>(comm.size()), 0);
  keys[static_cast<size_t>(comm.rank())] = m->node_->world_rank(0) + 1;
  m->layout_ = layout_from_keys(agree.allreduce_max(std::move(keys), "finding the hosts"));
  m->my_node_ = m->layout_.node_of[static_cast<size_t>(comm.rank())];
  m->every_ = config::get_int("TUTTI_MEM_BUDDY_EVERY");
  const bool first = comm.rank() == 0;
  if (m->layout_.nodes() < 2) {
    if (first)
      TUTTI_LOG(kInfo) << "memory tier: one host, no buddy copies (a restart reloads this "
                          "host's commits)";
    return nullptr;
  }
  if (first) {
    if (m->every_ <= 0)
      TUTTI_LOG(kWarn) << "memory tier: the job spans " << m->layout_.nodes()
                       << " hosts and buddy copies are off (TUTTI_MEM_BUDDY_EVERY="
                       << m->every_ << "): a restart after a lost host finds its ranks' "
                       << "files nowhere and cannot resume from memory";
    else
      TUTTI_LOG(kInfo) << "memory tier: " << m->layout_.nodes() << " hosts; each rank "
                       << "copies its commit files to the rank with its local index on the "
                       << "next host, every " << m->every_ << " commit(s)";
  }
  return m;
}

OpOptions MemoryReplica::p2p_options(const std::string& what) const {
  OpOptions o;
  o.name = "memory tier: " + what;
  o.timeout_s = timeout_s_;
  return o;
}

bool MemoryReplica::begin_save() {
  const bool buddy = every_ > 0 && saves_ % every_ == 0;
  ++saves_;
  return buddy;
}

std::string MemoryReplica::prepare_step_dir(const std::string& dir) {
  std::string error;
  if (leader()) {
    try {
      if (!with_rank0() && path_exists(dir)) remove_tree(dir);  // another timeline's
      make_dirs(dir, dir_mode_);
      make_dir(join_path(dir, kBuddyDir), dir_mode_);
    } catch (const Error& e) {
      error = message_of(e);
    }
  }
  Agreement host(*node_, timeout_s_, "memory tier, preparing '" + dir + "'");
  const int64_t failed = host.allreduce_max(error.empty() ? 0 : 1, "creating the step");
  if (failed && error.empty())
    error = detail::cat("rank ", layout_.leader(my_node_), ", this host's leader, could not "
                        "create '", dir, "'");
  return error;
}

std::string MemoryReplica::copy_to_buddy(const std::string& dir, const std::string& own) {
  const int me = comm_.rank();
  const int to = buddy_of(layout_, me);
  const OpOptions o = p2p_options("buddy copy in '" + dir + "'");
  std::string send_error;
  // Sends in their own thread: every rank sends and receives at once (a
  // ring over the hosts), and a blocking send would wait for its peer's.
  std::thread sender([&] {
    try {
      if (own.empty()) {
        int64_t none = 0;
        comm_.send(Tensor::of(&none, 1), to, kBuddyTag, o);
      } else {
        send_file(comm_, join_path(dir, own), to, kBuddyTag, o, &send_error);
      }
    } catch (const Error& e) {
      send_error = message_of(e);
    }
  });
  std::string recv_error;
  try {
    for (int from : buddy_senders(layout_, me)) {
      std::string err;
      recv_file(comm_, from, kBuddyTag, o, join_path(dir, kBuddyDir), shard_file_name(from),
                file_mode_, &err);
      if (!err.empty() && recv_error.empty()) recv_error = err;
    }
  } catch (const Error& e) {
    recv_error = message_of(e);
  }
  sender.join();
  if (!send_error.empty()) return "sending the buddy copy: " + send_error;
  if (!recv_error.empty()) return "keeping a buddy copy: " + recv_error;
  return "";
}

void MemoryReplica::publish_everywhere(Agreement& agree, const std::string& root,
                                       const std::string& name, const std::string& manifest_text,
                                       const std::string& what) {
  const std::string text = agree.broadcast(manifest_text, 0, "sending the manifest to the hosts");
  const std::string dir = join_path(root, name);
  std::string error;
  if (leader() && !with_rank0()) {
    try {
      write_file_atomic(dir, kManifestName, text, file_mode_);
      write_file_atomic(root, kLatestName, name + "\n", file_mode_);
    } catch (const Error& e) {
      error = message_of(e);
    }
  }
  const int64_t worst = agree.allreduce_max(error.empty() ? 0 : comm_.size() - comm_.rank(),
                                            "writing the manifest on every host");
  if (!worst) return;
  if (leader()) ::unlink(join_path(dir, kManifestName).c_str());  // not complete anywhere
  const int bad = comm_.size() - static_cast<int>(worst);
  TUTTI_THROW(kIo, what, " (", dir, ") was not published: rank ", bad,
              " could not write the manifest on its host",
              error.empty() ? "" : ": ", error, " (the step is complete on no host)");
}

void MemoryReplica::retain(const std::string& root, const std::string& name, int keep_last) {
  if (leader() && !with_rank0()) apply_retention(root, name, keep_last);
}

void MemoryReplica::drop_newer(const std::string& root, const std::string& name) {
  if (!leader()) return;
  try {
    CatalogEntry from;  // "": before every step
    from.step = -1;
    if (!name.empty()) {
      from.name = name;
      parse_checkpoint_name(name, &from.step, &from.suffix);
    }
    for (const CatalogEntry& e : scan_catalog(root))
      if (e.complete && from < e) {
        remove_checkpoint(root, e.name);
        TUTTI_LOG(kInfo) << "memory tier: removed " << e.name << ", newer than "
                         << (name.empty() ? "the fresh start" : name)
                         << " this job resumed from (an abandoned timeline)";
      }
    if (is_directory(root))
      for (const std::string& n : list_dir(root))
        if (n.compare(0, 10, "abandoned-") == 0) remove_tree(join_path(root, n));
  } catch (const Error& e) {
    TUTTI_LOG(kWarn) << "memory tier: could not remove the commits newer than "
                     << (name.empty() ? "the fresh start" : name) << " in '" << root
                     << "': " << e.message();
  }
}

}  // namespace ckpt
}  // namespace tutti
