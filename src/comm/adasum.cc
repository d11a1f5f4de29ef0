// Adasum over a Communicator: an argument agreement (one allgather of a few
// integers), then vector-halving distance-doubling with per-tensor dot
// products, then the reverse allgather.  See adasum.h and
// docs/communication.md.
#include "comm/adasum.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <sstream>

#include "core/check.h"
#include "core/cuda_utils.h"
#include "core/fast_convert.h"

namespace tutti {
namespace comm {
namespace {

// One rank's description of its call, compared across ranks before any data
// moves: status, tensor count, dtype, device kind, total elements, and a
// hash of the per-tensor element counts.
constexpr int kDescLen = 6;
constexpr int64_t kOk = 0;
constexpr int64_t kRejected = 1;

int64_t counts_hash(const std::vector<Tensor>& tensors) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the element counts
  for (const Tensor& t : tensors) {
    uint64_t n = static_cast<uint64_t>(t.numel());
    for (int i = 0; i < 8; ++i) {
      h ^= (n >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return static_cast<int64_t>(h & 0x7fffffffffffffffull);
}

std::string label(const Communicator& comm, const OpOptions& o) {
  std::string s = "adasum_allreduce";
  if (!o.name.empty()) s += " '" + o.name + "'";
  return s + " on group '" + comm.name() + "' (rank " + std::to_string(comm.rank()) +
         " of " + std::to_string(comm.size()) + ")";
}

std::string describe(const int64_t* d) {
  std::ostringstream os;
  os << d[1] << " tensor(s) of " << dtype_name(static_cast<DType>(d[2])) << " on "
     << (d[3] ? "cuda" : "cpu") << ", " << d[4] << " elements in all (counts hash " << d[5]
     << ")";
  return os.str();
}

// Every rank learns every rank's description; a rejected or differing one
// is Error(kMismatch) on the ranks that did not reject.
void agree(Communicator& comm, const std::vector<Tensor>* tensors, const OpOptions& o) {
  std::vector<int64_t> mine(kDescLen, 0);
  if (tensors == nullptr) {
    mine[0] = kRejected;
  } else {
    int64_t total = 0;
    for (const Tensor& t : *tensors) total += t.numel();
    mine = {kOk,
            static_cast<int64_t>(tensors->size()),
            tensors->empty() ? 0 : static_cast<int64_t>((*tensors)[0].dtype()),
            !tensors->empty() && (*tensors)[0].is_cuda() ? 1 : 0,
            total,
            counts_hash(*tensors)};
  }
  std::vector<int64_t> all(static_cast<size_t>(kDescLen) * comm.size());
  OpOptions ao = o;
  ao.name = (o.name.empty() ? std::string("adasum") : o.name) + " agreement";
  comm.allgather(Tensor::of(mine), Tensor::of(all), ao);
  if (tensors == nullptr) return;
  std::vector<int> rejected, differing;
  const int64_t* first = nullptr;
  for (int r = 0; r < comm.size(); ++r) {
    const int64_t* d = all.data() + static_cast<size_t>(kDescLen) * r;
    if (d[0] == kRejected) {
      rejected.push_back(r);
      continue;
    }
    if (first == nullptr) first = d;
    // The device kind may differ (one rank on CUDA, one on the CPU: both
    // stage through host memory); everything else must agree.
    if (d[1] != first[1] || d[2] != first[2] || d[4] != first[4] || d[5] != first[5])
      differing.push_back(r);
  }
  auto list = [](const std::vector<int>& v) {
    std::string s;
    for (int r : v) s += (s.empty() ? "" : ", ") + std::to_string(r);
    return s;
  };
  if (!rejected.empty())
    TUTTI_THROW(kMismatch, label(comm, o), ": rank(s) ", list(rejected),
                " rejected their arguments (see the error on those ranks)");
  if (!differing.empty()) {
    std::ostringstream os;
    for (int r = 0; r < comm.size(); ++r)
      os << "; rank " << r << ": " << describe(all.data() + static_cast<size_t>(kDescLen) * r);
    TUTTI_THROW(kMismatch, label(comm, o), ": the ranks disagree on the tensors (rank(s) ",
                list(differing), " differ from the first)", os.str());
  }
}

// Sends `ns` elements to `peer` while receiving `nr` from it.
template <typename T>
void exchange(Communicator& comm, const T* send, int64_t ns, T* recv, int64_t nr, int peer,
              const OpOptions& o) {
  WorkPtr s = comm.send_async(Tensor::of(const_cast<T*>(send), ns), peer, kAdasumTag, o);
  WorkPtr r = comm.recv_async(Tensor::of(recv, nr), peer, kAdasumTag, o);
  std::exception_ptr failed;
  try {
    s->wait();
  } catch (...) {
    failed = std::current_exception();
  }
  r->wait();
  if (failed) std::rethrow_exception(failed);
}

// The tree on a fused host buffer `buf` holding the tensors back to back
// (`counts` elements each).
template <typename T>
void vhdd(Communicator& comm, T* buf, const std::vector<int64_t>& counts, const OpOptions& o) {
  const int rank = comm.rank();
  const int size = comm.size();
  const size_t ntensors = counts.size();
  std::vector<int64_t> starts(ntensors + 1, 0);
  for (size_t t = 0; t < ntensors; ++t) starts[t + 1] = starts[t] + counts[t];
  const int64_t total = starts[ntensors];
  std::vector<T> recv(static_cast<size_t>(total - total / 2));
  std::vector<double> dots(3 * ntensors), peer_dots(3 * ntensors);
  std::vector<std::pair<int64_t, int64_t>> held;  // (offset, count) before each level
  int64_t off = 0;
  int64_t cnt = total;
  // Calls fn(t, lo, hi) for each tensor t overlapping [begin, begin + n).
  auto each_tensor = [&](int64_t begin, int64_t n, auto&& fn) {
    auto it = std::upper_bound(starts.begin(), starts.end(), begin);
    for (size_t t = static_cast<size_t>(it - starts.begin()) - 1;
         t < ntensors && starts[t] < begin + n; ++t) {
      const int64_t lo = std::max(starts[t], begin);
      const int64_t hi = std::min(starts[t + 1], begin + n);
      if (lo < hi) fn(t, lo, hi);
    }
  };
  for (int level = 1; level < size; level <<= 1) {
    const int nbr = rank ^ level;
    const bool left = (rank & level) == 0;  // keeps the first half; its data is `a`
    const int64_t first = cnt / 2;
    const int64_t keep_off = left ? off : off + first;
    const int64_t keep_cnt = left ? first : cnt - first;
    const int64_t send_off = left ? off + first : off;
    const int64_t send_cnt = cnt - keep_cnt;
    held.emplace_back(off, cnt);
    exchange(comm, buf + send_off, send_cnt, recv.data(), keep_cnt, nbr, o);
    const T* theirs = recv.data() - keep_off;  // indexed by buffer position
    const T* av = left ? buf : theirs;        // the lower rank's half: `a`
    const T* bv = left ? theirs : buf;
    std::fill(dots.begin(), dots.end(), 0.0);
    if (keep_cnt > 0)
      each_tensor(keep_off, keep_cnt, [&](size_t t, int64_t lo, int64_t hi) {
        double ab = 0, aa = 0, bb = 0;
        for (int64_t i = lo; i < hi; ++i) {
          const double a = av[i];
          const double b = bv[i];
          ab += a * b;
          aa += a * a;
          bb += b * b;
        }
        dots[3 * t] = ab;
        dots[3 * t + 1] = aa;
        dots[3 * t + 2] = bb;
      });
    // The 2*level ranks of this block hold disjoint pieces of a and b: sum
    // their partial dot products by recursive doubling (a + b == b + a, so
    // every rank of the block ends with the same bits).
    for (int d = 1; d < 2 * level; d <<= 1) {
      exchange(comm, dots.data(), static_cast<int64_t>(dots.size()), peer_dots.data(),
               static_cast<int64_t>(peer_dots.size()), rank ^ d, o);
      for (size_t k = 0; k < dots.size(); ++k) dots[k] += peer_dots[k];
    }
    if (keep_cnt > 0)
      each_tensor(keep_off, keep_cnt, [&](size_t t, int64_t lo, int64_t hi) {
        double ca = 1, cb = 1;
        adasum_coefficients(dots[3 * t], dots[3 * t + 1], dots[3 * t + 2], &ca, &cb);
        for (int64_t i = lo; i < hi; ++i)
          buf[i] = static_cast<T>(ca * static_cast<double>(av[i]) +
                                  cb * static_cast<double>(bv[i]));
      });
    off = keep_off;
    cnt = keep_cnt;
  }
  // Distance halving: each pair swaps its pieces until every rank has all.
  for (int level = size / 2; level >= 1; level >>= 1) {
    const auto [poff, pcnt] = held.back();
    held.pop_back();
    const bool left = (rank & level) == 0;
    const int64_t first = pcnt / 2;
    const int64_t nbr_off = left ? poff + first : poff;
    const int64_t nbr_cnt = pcnt - cnt;
    exchange(comm, buf + off, cnt, buf + nbr_off, nbr_cnt, rank ^ level, o);
    off = poff;
    cnt = pcnt;
  }
}

// Host bytes of a tensor (a CUDA tensor is copied on o.stream).
void to_host(const Tensor& t, void* dst, const OpOptions& o) {
  if (t.nbytes() == 0) return;
  if (t.device().is_cpu()) {
    std::memcpy(dst, t.data(), t.nbytes());
    return;
  }
#if TUTTI_WITH_CUDA
  cuda::DeviceGuard g(t.device().index);
  auto stream = static_cast<cudaStream_t>(o.stream);
  TUTTI_CUDA_CHECK(cudaMemcpyAsync(dst, t.data(), t.nbytes(), cudaMemcpyDeviceToHost, stream));
  TUTTI_CUDA_CHECK(cudaStreamSynchronize(stream));
#else
  (void)o;
  TUTTI_THROW(kUnsupported, "adasum_allreduce: ", t.str(), " needs CUDA, which this build lacks");
#endif
}

void from_host(const Tensor& t, const void* src, const OpOptions& o) {
  if (t.nbytes() == 0) return;
  if (t.device().is_cpu()) {
    std::memcpy(t.data(), src, t.nbytes());
    return;
  }
#if TUTTI_WITH_CUDA
  cuda::DeviceGuard g(t.device().index);
  auto stream = static_cast<cudaStream_t>(o.stream);
  TUTTI_CUDA_CHECK(cudaMemcpyAsync(t.data(), src, t.nbytes(), cudaMemcpyHostToDevice, stream));
  TUTTI_CUDA_CHECK(cudaStreamSynchronize(stream));
#else
  (void)o;
  TUTTI_THROW(kUnsupported, "adasum_allreduce: ", t.str(), " needs CUDA, which this build lacks");
#endif
}

// Fuses the tensors into a host buffer of W (float or double), runs the
// tree, writes the result back.
template <typename W>
void run_fused(Communicator& comm, const std::vector<Tensor>& tensors, const OpOptions& o) {
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (const Tensor& t : tensors) {
    counts.push_back(t.numel());
    total += t.numel();
  }
  std::vector<W> buf(static_cast<size_t>(total));
  std::vector<uint16_t> half;
  int64_t at = 0;
  for (const Tensor& t : tensors) {
    const size_t n = static_cast<size_t>(t.numel());
    const DType d = t.dtype();
    if (d == DType::kFloat16 || d == DType::kBFloat16) {
      half.resize(n);
      to_host(t, half.data(), o);
      if (d == DType::kFloat16)
        f16_to_f32(half.data(), reinterpret_cast<float*>(buf.data() + at), n);
      else
        bf16_to_f32(half.data(), reinterpret_cast<float*>(buf.data() + at), n);
    } else {
      to_host(t, buf.data() + at, o);
    }
    at += t.numel();
  }
  vhdd(comm, buf.data(), counts, o);
  at = 0;
  for (const Tensor& t : tensors) {
    const size_t n = static_cast<size_t>(t.numel());
    const DType d = t.dtype();
    if (d == DType::kFloat16 || d == DType::kBFloat16) {
      half.resize(n);
      const float* src = reinterpret_cast<const float*>(buf.data() + at);
      if (d == DType::kFloat16)
        f32_to_f16(src, half.data(), n);
      else
        f32_to_bf16(src, half.data(), n);
      from_host(t, half.data(), o);
    } else {
      from_host(t, buf.data() + at, o);
    }
    at += t.numel();
  }
}

}  // namespace

void adasum_coefficients(double dot, double a_norm2, double b_norm2, double* a_coef,
                         double* b_coef) {
  *a_coef = a_norm2 > 0 ? 1.0 - dot / (2.0 * a_norm2) : 1.0;
  *b_coef = b_norm2 > 0 ? 1.0 - dot / (2.0 * b_norm2) : 1.0;
}

void adasum_reject(Communicator& comm, const OpOptions& options) {
  const int p = comm.size();
  if (p <= 1 || (p & (p - 1)) != 0) return;  // every rank raises on its own
  try {
    agree(comm, nullptr, options);
  } catch (const Error&) {
    // The caller raises its own error.
  }
}

}  // namespace comm

void adasum_allreduce(Communicator& comm, const std::vector<Tensor>& tensors,
                      const OpOptions& options) {
  const int p = comm.size();
  // Every rank knows the size: all raise this without communicating.
  TUTTI_ARG_CHECK(p > 0 && (p & (p - 1)) == 0, comm::label(comm, options),
                  ": Adasum needs a power-of-two number of ranks (as Horovod's), but the "
                  "group has ", p, "; use op=Average, or run on 1, 2, 4, 8, ... ranks");
  std::string local;  // this rank's own argument error, shared before raising
  for (size_t i = 0; i < tensors.size() && local.empty(); ++i) {
    const Tensor& t = tensors[i];
    const DType d = t.dtype();
    if (d != DType::kFloat32 && d != DType::kFloat64 && d != DType::kFloat16 &&
        d != DType::kBFloat16)
      local = "tensor " + std::to_string(i) + " is " + dtype_name(d) +
              "; Adasum needs floating-point tensors (float32, float64, float16, bfloat16)";
    else if (d != tensors[0].dtype())
      local = "tensor " + std::to_string(i) + " is " + dtype_name(d) + " but tensor 0 is " +
              dtype_name(tensors[0].dtype()) + "; one call takes one dtype";
    else if (t.numel() > 0 && t.data() == nullptr)
      local = "tensor " + std::to_string(i) + " has no data";
  }
  if (!local.empty()) {
    comm::adasum_reject(comm, options);
    TUTTI_THROW(kInvalidArgument, comm::label(comm, options), ": ", local);
  }
  if (p == 1) return;
  comm::agree(comm, &tensors, options);
  if (tensors.empty()) return;
  if (tensors[0].dtype() == DType::kFloat64)
    comm::run_fused<double>(comm, tensors, options);
  else
    comm::run_fused<float>(comm, tensors, options);
}

}  // namespace tutti
