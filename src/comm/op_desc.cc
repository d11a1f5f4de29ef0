#include "comm/op_desc.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>

#include "core/check.h"

namespace tutti {
namespace comm {
namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  // splitmix64-style mixing; collisions only weaken a diagnostic.
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  return h;
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const char* a0 = static_cast<const char*>(a.data());
  const char* b0 = static_cast<const char*>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace

WireDesc make_wire(const OpRequest& r, uint64_t seq) {
  WireDesc w;
  w.seq = seq;
  w.kind = static_cast<uint8_t>(r.kind);
  w.dtype = static_cast<uint8_t>(r.input.dtype());
  switch (r.kind) {
    case CollectiveKind::kAllreduce:
      w.count = r.input.numel();
      w.op = static_cast<uint8_t>(r.op);
      break;
    case CollectiveKind::kBroadcast:
      w.count = r.input.numel();
      w.root = r.root;
      break;
    case CollectiveKind::kAllgather:
    case CollectiveKind::kAlltoall:
      w.count = r.input.numel();
      break;
    case CollectiveKind::kAllgatherv: {
      uint64_t h = 0;
      int64_t total = 0;
      for (int64_t c : r.counts) {
        h = mix(h, static_cast<uint64_t>(c));
        total += c;
      }
      w.count = total;
      w.extra = h;
      break;
    }
    case CollectiveKind::kReduceScatter:
      w.count = r.output.numel();
      w.op = static_cast<uint8_t>(r.op);
      break;
    case CollectiveKind::kBarrier:
      w.dtype = 0;
      break;
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv:
      w.count = r.input.numel();
      w.root = r.root;
      break;
  }
  return w;
}

uint64_t fingerprint(const WireDesc& w) {
  uint64_t h = 0x84222325cbf29ce4ull;
  h = mix(h, w.seq);
  h = mix(h, static_cast<uint64_t>(w.count));
  h = mix(h, w.extra);
  h = mix(h, static_cast<uint64_t>(static_cast<uint32_t>(w.root)));
  h = mix(h, (uint64_t{w.kind} << 16) | (uint64_t{w.dtype} << 8) | w.op);
  return h;
}

std::string describe_wire(const WireDesc& w) {
  std::ostringstream os;
  const auto kind = static_cast<CollectiveKind>(w.kind);
  if (w.kind > static_cast<uint8_t>(CollectiveKind::kRecv)) {
    // internal kinds (communicator splits, join)
    if (w.kind == kJoinKind) return "join";
    os << (w.kind == kSplitSharedKind ? "node split #" : "split #") << w.seq;
    return os.str();
  }
  os << collective_kind_name(kind) << " #" << w.seq;
  if (kind == CollectiveKind::kBarrier) return os.str();
  os << " " << dtype_name(static_cast<DType>(w.dtype)) << " x" << w.count;
  switch (kind) {
    case CollectiveKind::kAllreduce:
    case CollectiveKind::kReduceScatter:
      os << " " << reduce_op_name(static_cast<ReduceOp>(w.op));
      break;
    case CollectiveKind::kBroadcast:
      os << " root " << w.root;
      break;
    case CollectiveKind::kAllgatherv:
      os << " (counts hash " << std::hex << (w.extra & 0xffffff) << std::dec
         << ")";
      break;
    default:
      break;
  }
  return os.str();
}

std::string describe(const OpRequest& r, uint64_t seq,
                     const std::string& group) {
  std::ostringstream os;
  os << collective_kind_name(r.kind) << " #" << seq;
  if (!r.options.name.empty()) os << " '" << r.options.name << "'";
  if (r.kind != CollectiveKind::kBarrier)
    os << " " << dtype_name(r.input.dtype()) << r.input.shape().str();
  if (r.kind == CollectiveKind::kAllreduce ||
      r.kind == CollectiveKind::kReduceScatter)
    os << " " << reduce_op_name(r.op);
  if (r.kind == CollectiveKind::kBroadcast) os << " root " << r.root;
  if (r.kind == CollectiveKind::kSend) os << " to " << r.root << " tag " << r.tag;
  if (r.kind == CollectiveKind::kRecv)
    os << " from " << r.root << " tag " << r.tag;
  os << " on group '" << group << "'";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const OpLabel& label) {
  return os << label.str();
}

void validate(const OpRequest& r, int rank, int size, const OpLabel& d) {
  const Tensor& in = r.input;
  const Tensor& out = r.output;
  auto same_dtype = [&] {
    TUTTI_ARG_CHECK(in.dtype() == out.dtype(), d, ": input is ", in.str(),
                    " but output is ", out.str(), " (dtypes must match)");
    TUTTI_ARG_CHECK(in.device() == out.device(), d, ": input is on ",
                    in.device().str(), " but output on ", out.device().str());
  };
  switch (r.kind) {
    case CollectiveKind::kAllreduce:
      same_dtype();
      TUTTI_ARG_CHECK(in.numel() == out.numel(), d, ": output ", out.str(),
                      " has ", out.numel(), " elements, expected ", in.numel(),
                      " like the input");
      TUTTI_ARG_CHECK(in.data() == out.data() || !overlaps(in, out), d,
                      ": input and output overlap without being the same "
                      "tensor");
      break;
    case CollectiveKind::kBroadcast:
      TUTTI_ARG_CHECK(r.root >= 0 && r.root < size, d, ": root ", r.root,
                      " is not a rank of this group of size ", size);
      break;
    case CollectiveKind::kAllgather: {
      same_dtype();
      TUTTI_ARG_CHECK(out.numel() == in.numel() * size, d, ": output ",
                      out.str(), " has ", out.numel(), " elements, expected ",
                      size, " x ", in.numel(), " = ", in.numel() * size);
      const char* mine = static_cast<const char*>(out.data()) +
                         static_cast<size_t>(rank) * in.nbytes();
      TUTTI_ARG_CHECK(in.data() == mine || !overlaps(in, out), d,
                      ": input overlaps the output other than at this rank's "
                      "block");
      break;
    }
    case CollectiveKind::kAllgatherv: {
      same_dtype();
      TUTTI_ARG_CHECK(static_cast<int>(r.counts.size()) == size, d, ": ",
                      r.counts.size(), " counts given, expected one per rank (",
                      size, ")");
      int64_t total = 0;
      for (size_t i = 0; i < r.counts.size(); ++i) {
        TUTTI_ARG_CHECK(r.counts[i] >= 0, d, ": counts[", i, "] = ",
                        r.counts[i], " is negative");
        total += r.counts[i];
      }
      TUTTI_ARG_CHECK(in.numel() == r.counts[rank], d, ": input has ",
                      in.numel(), " elements but counts[", rank, "] = ",
                      r.counts[rank]);
      TUTTI_ARG_CHECK(out.numel() == total, d, ": output has ", out.numel(),
                      " elements, expected sum(counts) = ", total);
      TUTTI_ARG_CHECK(!overlaps(in, out), d, ": input and output overlap");
      break;
    }
    case CollectiveKind::kReduceScatter:
      same_dtype();
      TUTTI_ARG_CHECK(in.numel() == out.numel() * size, d, ": input ",
                      in.str(), " has ", in.numel(), " elements, expected ",
                      size, " x ", out.numel(), " (group size x output)");
      TUTTI_ARG_CHECK(!overlaps(in, out), d, ": input and output overlap");
      break;
    case CollectiveKind::kAlltoall:
      same_dtype();
      TUTTI_ARG_CHECK(in.numel() == out.numel(), d, ": output has ",
                      out.numel(), " elements, expected ", in.numel());
      TUTTI_ARG_CHECK(in.numel() % size == 0, d, ": ", in.numel(),
                      " elements do not split into ", size, " equal blocks");
      TUTTI_ARG_CHECK(!overlaps(in, out), d, ": input and output overlap");
      break;
    case CollectiveKind::kBarrier:
      break;
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv:
      TUTTI_ARG_CHECK(r.root >= 0 && r.root < size, d, ": peer ", r.root,
                      " is not a rank of this group of size ", size);
      TUTTI_ARG_CHECK(r.tag >= 0 && r.tag <= 32767, d, ": tag ", r.tag,
                      " is outside [0, 32767]");
      break;
  }
}

std::string mismatch_message(const std::vector<WireDesc>& all) {
  // Group ranks by descriptor; the group containing rank 0 is the reference.
  std::map<std::string, std::vector<int>> groups;
  for (size_t r = 0; r < all.size(); ++r)
    groups[describe_wire(all[r])].push_back(static_cast<int>(r));
  if (groups.size() <= 1) return "";
  const std::string ref = describe_wire(all[0]);
  std::ostringstream os;
  bool first = true;
  for (const auto& g : groups) {
    if (g.first == ref) continue;
    if (!first) os << "; ";
    first = false;
    os << (g.second.size() == 1 ? "rank " : "ranks ");
    for (size_t i = 0; i < g.second.size(); ++i) {
      if (i == 4 && g.second.size() > 5) {
        os << ", ... (" << g.second.size() << " ranks)";
        break;
      }
      os << (i ? ", " : "") << g.second[i];
    }
    os << (g.second.size() == 1 ? " has " : " have ") << g.first;
  }
  os << " but rank 0 has " << ref;
  return os.str();
}

WireDesc join_wire() {
  WireDesc w;
  w.kind = kJoinKind;
  return w;
}

JoinVerdict join_verdict(const std::vector<WireDesc>& all) {
  JoinVerdict v;
  std::vector<int> joined;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].kind == kJoinKind)
      joined.push_back(static_cast<int>(i));
    else if (v.runner < 0)
      v.runner = static_cast<int>(i);
  }
  if (joined.empty()) return v;
  v.any_joined = true;
  for (size_t i = 0; i < joined.size(); ++i)
    v.joined += (i ? ", " : "") + std::to_string(joined[i]);
  if (v.runner < 0) return v;  // every rank joined: nothing to serve
  const WireDesc& op = all[static_cast<size_t>(v.runner)];
  for (const WireDesc& d : all) {
    if (d.kind == kJoinKind) continue;
    if (d.pad || std::memcmp(&d, &op, sizeof(WireDesc)) != 0) return v;
  }
  v.runners_agree = true;
  switch (static_cast<CollectiveKind>(op.kind)) {
    case CollectiveKind::kAllreduce:
    case CollectiveKind::kBarrier:
      v.servable = true;
      return v;
    case CollectiveKind::kBroadcast:
      if (std::find(joined.begin(), joined.end(), op.root) == joined.end()) {
        v.servable = true;
        return v;
      }
      v.refusal = detail::cat("its root, rank ", op.root,
                              ", has joined and has no data to send");
      return v;
    default:
      v.refusal = detail::cat(
          "a joined rank can only take part in all-reduces, barriers and "
          "broadcasts from a rank that has not joined; ", describe_wire(op),
          " has no identity a joined rank could contribute");
      return v;
  }
}

namespace {
template <typename T>
void fill(void* data, int64_t n, T value) {
  std::fill_n(static_cast<T*>(data), n, value);
}
template <typename T>
void fill_int(ReduceOp op, void* data, int64_t n) {
  switch (op) {
    case ReduceOp::kMin: return fill(data, n, std::numeric_limits<T>::max());
    case ReduceOp::kMax: return fill(data, n, std::numeric_limits<T>::lowest());
    case ReduceOp::kProd: return fill(data, n, T{1});
    default: return fill(data, n, T{0});
  }
}
template <typename T>
void fill_float(ReduceOp op, void* data, int64_t n) {
  switch (op) {
    case ReduceOp::kMin: return fill(data, n, std::numeric_limits<T>::infinity());
    case ReduceOp::kMax: return fill(data, n, -std::numeric_limits<T>::infinity());
    case ReduceOp::kProd: return fill(data, n, T{1});
    default: return fill(data, n, T{0});
  }
}
// 16-bit floats as bit patterns: +inf, -inf and one.
void fill_half(ReduceOp op, void* data, int64_t n, uint16_t inf, uint16_t ninf,
               uint16_t one) {
  switch (op) {
    case ReduceOp::kMin: return fill<uint16_t>(data, n, inf);
    case ReduceOp::kMax: return fill<uint16_t>(data, n, ninf);
    case ReduceOp::kProd: return fill<uint16_t>(data, n, one);
    default: return fill<uint16_t>(data, n, 0);
  }
}
}  // namespace

void fill_identity(DType dtype, ReduceOp op, void* data, int64_t n) {
  switch (dtype) {
    case DType::kFloat32: return fill_float<float>(op, data, n);
    case DType::kFloat64: return fill_float<double>(op, data, n);
    case DType::kFloat16: return fill_half(op, data, n, 0x7c00, 0xfc00, 0x3c00);
    case DType::kBFloat16: return fill_half(op, data, n, 0x7f80, 0xff80, 0x3f80);
    case DType::kInt8: return fill_int<int8_t>(op, data, n);
    case DType::kUInt8: return fill_int<uint8_t>(op, data, n);
    case DType::kInt32: return fill_int<int32_t>(op, data, n);
    case DType::kInt64: return fill_int<int64_t>(op, data, n);
  }
}

size_t payload_bytes(const OpRequest& r) {
  switch (r.kind) {
    case CollectiveKind::kBarrier: return 0;
    case CollectiveKind::kAllgather:
    case CollectiveKind::kAllgatherv:
    case CollectiveKind::kReduceScatter: return std::max(r.input.nbytes(), r.output.nbytes());
    default: return r.input.nbytes();
  }
}

}  // namespace comm
}  // namespace tutti
