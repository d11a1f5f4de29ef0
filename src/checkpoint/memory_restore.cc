// MemoryReplica::restore (memory_replica.h): which step survives across
// the hosts, and the copies that make it whole on every host.
//
// Per candidate (newest first, at most kCandidates):
//   1. all-reduce MAX of each rank's newest complete step below the last
//      candidate: the candidate (its name as step and suffix);
//   2. the lowest rank whose host holds its manifest broadcasts it;
//   3. one all-reduce MAX over 2 words per manifest file: the lowest rank
//      holding it (own or buddy copy), and whether some host holds its own
//      (not a buddy) copy -- O(files) words, whatever the number of ranks;
//   4. one all-reduce SUM of a host bitmap per file (each host's leader
//      sets its bit where its host lacks the file): plan_transfers() gives
//      every rank the same list of whole-file copies;
//   5. the copies, in that list's order (each involves two ranks, so the
//      lowest unfinished one can always proceed: no deadlock), and an
//      all-reduce of the verdict.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "checkpoint/catalog.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/memory_replica.h"
#include "checkpoint/safetensors.h"
#include "core/check.h"
#include "tutti/log.h"

namespace tutti {
namespace ckpt {
namespace {

constexpr int kCandidates = 4;
constexpr int kFetchTag = 0x7c51;  // restore copies (private communicator)
constexpr int kSuffixBits = 20;

int64_t key_of(const CatalogEntry& e) {
  return (e.step << kSuffixBits) | std::min(e.suffix, (1 << kSuffixBits) - 1);
}

// This host's copy of `file` in `dir`: the own file, else the buddy copy,
// else "" (a size other than the manifest's does not count).
std::string local_copy(const std::string& dir, const ShardRecord& rec, bool* own) {
  for (const std::string& p : {join_path(dir, rec.file), join_path(join_path(dir, kBuddyDir), rec.file)}) {
    try {
      if (path_exists(p) && file_size(p) == rec.bytes) {
        *own = p == join_path(dir, rec.file);
        return p;
      }
    } catch (const Error&) {
    }
  }
  *own = false;
  return "";
}

std::string mib(uint64_t b) { return detail::cat(static_cast<double>(b) / (1 << 20), " MiB"); }

}  // namespace

std::optional<std::string> MemoryReplica::restore(const std::string& root, int64_t step) {
  Agreement agree(comm_, timeout_s_, "memory tier restore from '" + root + "'");
  const int me = comm_.rank(), world = comm_.size();
  std::vector<CatalogEntry> local;
  try {
    for (const CatalogEntry& e : scan_catalog(root))
      if (e.complete && (step < 0 || e.step == step)) local.push_back(e);
  } catch (const Error& e) {
    TUTTI_LOG(kWarn) << "memory tier: cannot list '" << root << "': " << e.message();
  }
  std::vector<std::string> reasons;
  int64_t bound = INT64_MAX;
  for (int round = 0; round < kCandidates; ++round) {
    int64_t mine = -1;
    for (const CatalogEntry& e : local)
      if (key_of(e) < bound) mine = std::max(mine, key_of(e));
    const int64_t key = agree.allreduce_max(mine, "choosing a step");
    if (key < 0) break;
    bound = key;
    const std::string name =
        checkpoint_name(key >> kSuffixBits, static_cast<int>(key & ((1 << kSuffixBits) - 1)));
    const std::string dir = join_path(root, name);
    const std::string mpath = join_path(dir, kManifestName);
    const bool has_manifest = path_exists(mpath);
    const int holder = world - static_cast<int>(agree.allreduce_max(has_manifest ? world - me : 0,
                                                                    "finding a manifest"));
    std::string text;
    if (me == holder) {
      try {
        text = read_file(mpath, max_header_bytes());
      } catch (const Error& e) {
        TUTTI_LOG(kWarn) << "memory tier: " << e.message();
      }
    }
    text = agree.broadcast(text, holder, "sending the manifest");
    Manifest m;
    try {
      m = parse_manifest(text, mpath);
    } catch (const Error& e) {
      reasons.push_back(detail::cat(name, ": its manifest on rank ", holder,
                                    "'s host cannot be read (", e.message(), ")"));
      continue;
    }
    // 3. Who holds each file.
    const size_t files = m.shards.size();
    std::vector<std::string> path(files);
    std::vector<bool> own(files, false);
    std::vector<int64_t> words(2 * files, 0);
    for (size_t f = 0; f < files; ++f) {
      bool o = false;
      path[f] = local_copy(dir, m.shards[f], &o);
      own[f] = o;
      words[f] = path[f].empty() ? 0 : world - me;
      words[files + f] = o ? 1 : 0;
    }
    words = agree.allreduce_max(std::move(words), "finding the files");
    std::vector<int> holders(files), lost, from_buddy;
    for (size_t f = 0; f < files; ++f) {
      holders[f] = words[f] ? world - static_cast<int>(words[f]) : -1;
      if (holders[f] < 0) lost.push_back(m.shards[f].rank);
      else if (!words[files + f]) from_buddy.push_back(m.shards[f].rank);
    }
    if (!lost.empty()) {
      reasons.push_back(detail::cat(
          name, " (step ", m.step, ") lacks the files of rank(s) ", rank_ranges(lost), " of the ",
          m.world_size, "-rank job that wrote it: no surviving host holds them or a buddy copy "
          "(a lost host, and buddy copies older or off: TUTTI_MEM_BUDDY_EVERY)"));
      continue;
    }
    // 4. What each host lacks.
    const int nw = bitmap_words(layout_.nodes());
    std::vector<int64_t> lacking(files * static_cast<size_t>(nw), 0);
    if (leader())
      for (size_t f = 0; f < files; ++f)
        if (path[f].empty())
          lacking[f * nw + static_cast<size_t>(my_node_ / 64)] =
              static_cast<int64_t>(uint64_t{1} << (my_node_ % 64));
    OpOptions o = p2p_options("restoring " + name);
    comm_.allreduce(Tensor::of(lacking), ReduceOp::kSum, o);  // one bit per host: SUM is OR
    const std::vector<FileTransfer> plan = plan_transfers(layout_, holders, lacking);
    // 5. The copies.  The loader reads own names: a leader links its
    // buddy copies there first (same file system).
    std::string error;
    uint64_t fetched = 0;
    try {
      if (leader()) {
        make_dirs(dir, dir_mode_);
        for (size_t f = 0; f < files; ++f)
          if (!path[f].empty() && !own[f] &&
              ::link(path[f].c_str(), join_path(dir, m.shards[f].file).c_str()) != 0 &&
              errno != EEXIST)
            TUTTI_THROW(kIo, "linking the buddy copy '", path[f], "' into '", dir, "': ",
                        std::strerror(errno));
      }
    } catch (const Error& e) {
      error = e.message();
    }
    for (const FileTransfer& t : plan) {
      const ShardRecord& rec = m.shards[static_cast<size_t>(t.file)];
      std::string err;
      if (t.from == me) send_file(comm_, path[static_cast<size_t>(t.file)], t.to, kFetchTag, o, &err);
      if (t.to == me) {
        recv_file(comm_, t.from, kFetchTag, o, dir, rec.file, file_mode_, &err);
        fetched += rec.bytes;
      }
      if (!err.empty() && error.empty()) error = err;
    }
    if (leader() && !has_manifest && error.empty()) {
      try {
        write_file_atomic(dir, kManifestName, text, file_mode_);
      } catch (const Error& e) {
        error = e.message();
      }
    }
    const std::vector<int64_t> verdict = agree.allreduce_max(
        {error.empty() ? 0 : world - me, static_cast<int64_t>(fetched)}, "copying the files");
    if (verdict[0]) {
      const int bad = world - static_cast<int>(verdict[0]);
      TUTTI_THROW(kIo, "memory tier: restoring ", name, " failed: rank ", bad,
                  " could not copy its files", error.empty() ? "" : ": ", error);
    }
    if (me == 0) {
      for (const std::string& r : reasons)
        TUTTI_LOG(kWarn) << "memory tier: skipped " << r;
      TUTTI_LOG(kWarn) << "memory tier: restoring " << name << " (step " << m.step << ", "
                       << m.world_size << " ranks) from memory across " << layout_.nodes()
                       << " host(s): " << files << " file(s), " << plan.size()
                       << " copied between hosts (largest per host " << mib(verdict[1]) << ")"
                       << (from_buddy.empty() ? std::string(", no buddy copy needed")
                                              : ", buddy copies used for rank(s) " +
                                                    rank_ranges(from_buddy));
    }
    return name;
  }
  if (me == 0) {
    std::string all;
    for (const std::string& r : reasons) all += "; " + r;
    if (reasons.empty())
      TUTTI_LOG(kInfo) << "memory tier: no complete commit on any host in '" << root << "'";
    else
      TUTTI_LOG(kWarn) << "memory tier: no complete commit across the surviving hosts" << all
                       << "; nothing is loaded from memory (an elastic job starts fresh)";
  }
  return std::nullopt;
}

}  // namespace ckpt
}  // namespace tutti
