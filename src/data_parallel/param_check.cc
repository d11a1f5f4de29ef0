#include "data_parallel/param_check.h"

#include <algorithm>
#include <cstring>

#include "comm/rank_list.h"
#include "core/check.h"
#include "core/cuda_utils.h"
#include "core/host_buffer.h"
#include "data_parallel/list_agreement.h"

namespace tutti {
namespace dp {
namespace {

// XXH64's constants and rounds (Collet's xxHash, 64-bit variant): fast (a
// multiply per 8 bytes and lane) and well mixed, so one flipped bit in any
// parameter changes the digest.
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t read64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t read32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t round64(uint64_t acc, uint64_t input) {
  acc += input * kP2;
  return rotl(acc, 31) * kP1;
}
inline uint64_t merge(uint64_t acc, uint64_t v) {
  acc ^= round64(0, v);
  return acc * kP1 + kP4;
}

// Parameters are digested in chunks of this many bytes, each chunk seeded
// with the previous chunk's digest, so a CUDA parameter (copied to the host
// one chunk at a time) and a host one with the same bytes agree.
constexpr size_t kChunk = size_t{4} << 20;

}  // namespace

uint64_t digest_bytes(const void* data, size_t len, uint64_t seed) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + len;
  uint64_t h;
  if (len >= 32) {
    uint64_t v1 = seed + kP1 + kP2, v2 = seed + kP2, v3 = seed, v4 = seed - kP1;
    const unsigned char* const limit = end - 32;
    do {
      v1 = round64(v1, read64(p));
      v2 = round64(v2, read64(p + 8));
      v3 = round64(v3, read64(p + 16));
      v4 = round64(v4, read64(p + 24));
      p += 32;
    } while (p <= limit);
    h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    h = merge(merge(merge(merge(h, v1), v2), v3), v4);
  } else {
    h = seed + kP5;
  }
  h += static_cast<uint64_t>(len);
  for (; p + 8 <= end; p += 8) h = rotl(h ^ round64(0, read64(p)), 27) * kP1 + kP4;
  if (p + 4 <= end) {
    h = rotl(h ^ (static_cast<uint64_t>(read32(p)) * kP1), 23) * kP2 + kP3;
    p += 4;
  }
  for (; p < end; ++p) h = rotl(h ^ (*p * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t digest_tensor(const Tensor& t, void* stream) {
  const size_t bytes = t.nbytes();
  uint64_t h = 0;
  if (!t.is_cuda()) {
    const char* p = static_cast<const char*>(t.data());
    for (size_t off = 0; off < bytes; off += kChunk)
      h = digest_bytes(p + off, std::min(kChunk, bytes - off), h);
    return bytes ? h : digest_bytes(nullptr, 0, 0);
  }
#if TUTTI_WITH_CUDA
  cuda::DeviceGuard g(t.device().index);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  HostBuffer staging(std::min(kChunk, bytes));
  const char* p = static_cast<const char*>(t.data());
  for (size_t off = 0; off < bytes; off += kChunk) {
    const size_t n = std::min(kChunk, bytes - off);
    TUTTI_CUDA_CHECK(cudaMemcpyAsync(staging.data(), p + off, n, cudaMemcpyDeviceToHost, s));
    TUTTI_CUDA_CHECK(cudaStreamSynchronize(s));
    h = digest_bytes(staging.data(), n, h);
  }
  return bytes ? h : digest_bytes(nullptr, 0, 0);
#else
  (void)stream;
  TUTTI_THROW(kUnsupported, "digest of CUDA tensor ", t.str(),
              ": this build of tutti has no CUDA support");
#endif
}

void check_parameters_agree(Communicator& comm, const std::string& context,
                            const std::vector<ParamEntry>& params, void* stream) {
  const int size = comm.size(), rank = comm.rank();
  const size_t n = params.size();
  if (size <= 1 || n == 0) return;
  std::vector<uint64_t> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = digest_tensor(params[i].value, stream);
  const uint64_t digest = digest_bytes(mine.data(), n * sizeof(uint64_t));
  // (d, ~d) all-reduced by MAX: d agrees everywhere iff max(d) == ~max(~d)
  // (~ reverses the int64 order), which every rank reads alike.
  int64_t words[2] = {static_cast<int64_t>(digest), static_cast<int64_t>(~digest)};
  const auto allreduce = [&](const Tensor& t, const std::string& what) {
    count_agreement_collective(t.nbytes());
    OpOptions o;
    o.name = context + " " + what;
    comm.allreduce(t, ReduceOp::kMax, o);
  };
  allreduce(Tensor(words, DType::kInt64, Shape{2}), "parameter digest");
  if (words[0] == ~words[1]) return;
  // Every rank takes this branch.  Rank 0's per-parameter digests to all,
  // then flags all-reduced by MAX (one byte per parameter and per rank), so
  // no rank gathers the others' digests: O(parameters + W) bytes each.
  std::vector<uint64_t> ref = mine;
  const int64_t ni = static_cast<int64_t>(n);
  count_agreement_collective(n * sizeof(uint64_t));
  OpOptions o;
  o.name = context + " per-parameter digests of rank 0";
  // uint64 digests travel as int64 (the same bits; only equality matters).
  comm.broadcast(Tensor(ref.data(), DType::kInt64, Shape{ni}), 0, o);
  //  flags[i]: parameter i differs from rank 0's on some rank;
  //  flags[n + r]: rank r's copy differs from rank 0's somewhere.
  std::vector<uint8_t> flags(n + static_cast<size_t>(size), 0);
  for (size_t i = 0; i < n; ++i)
    if (mine[i] != ref[i]) flags[i] = flags[n + static_cast<size_t>(rank)] = 1;
  allreduce(Tensor(flags.data(), DType::kUInt8, Shape{ni + size}), "differing parameters");
  size_t first = n;
  int64_t differing = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!flags[i]) continue;
    ++differing;
    if (first == n) first = i;
  }
  std::vector<int> any_ranks;
  for (int r = 0; r < size; ++r)
    if (flags[n + static_cast<size_t>(r)]) any_ranks.push_back(r);
  const std::string group = comm.name() == "world" ? std::string()
                                                   : " of group '" + comm.name() + "'";
  if (first == n)  // equal tables with different digests of them cannot happen
    TUTTI_THROW(kInternal, context, ": the parameter digests differ across ranks",
                group, " but every parameter's digest agrees");
  // The ranks whose copy of that first parameter differs.
  std::vector<uint8_t> at_first(static_cast<size_t>(size), 0);
  at_first[static_cast<size_t>(rank)] = mine[first] != ref[first];
  allreduce(Tensor(at_first.data(), DType::kUInt8, Shape{size}), "ranks differing at parameter #" +
                                                                     std::to_string(first));
  std::vector<int> first_ranks;
  for (int r = 0; r < size; ++r)
    if (at_first[static_cast<size_t>(r)]) first_ranks.push_back(r);
  const int cap = tutti::comm::report_max_ranks();
  const ParamEntry& p = params[first];
  TUTTI_THROW(kMismatch, context, ": the replicas' parameters differ at the first "
              "step: parameter #", first, " '", p.name, "' ", dtype_name(p.value.dtype()),
              p.value.shape().str(), " of ", tutti::comm::format_ranks(first_ranks, cap), group,
              " differs from rank 0's (", differing, " of ", n, " parameters differ, on ",
              tutti::comm::format_ranks(any_ranks, cap), "). Every replica must start from the same "
              "values: call broadcast_parameters(0) after build() (Python: "
              "hvd.broadcast_parameters(model.state_dict(), root_rank=0)), or set "
              "TUTTI_CHECK_PARAMETERS=0 if the replicas are meant to differ");
}

}  // namespace dp
}  // namespace tutti
