#include "ckpt_test_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "checkpoint/file_util.h"

namespace tutti {
namespace test {

ScratchDir::ScratchDir(const ProcessGroupPtr& g, const std::string& root) : group_(g) {
  std::vector<uint8_t> buf(256, 0);
  if (g->rank() == 0) {
    std::string tmpl = root + "/tutti-ckpt-test-XXXXXX";
    if (tmpl.size() >= buf.size() || !mkdtemp(&tmpl[0])) std::abort();
    std::string p(tmpl);
    std::copy(p.begin(), p.end(), buf.begin());
  }
  g->broadcast(Tensor::of(buf), 0);
  path_ = reinterpret_cast<const char*>(buf.data());
}

ScratchDir::~ScratchDir() {
  try {
    group_->barrier();
    if (group_->rank() == 0) ckpt::remove_tree(path_);
  } catch (...) {
  }
}

namespace {

bool can_create_in(const std::string& dir) {
  const std::string probe = dir + "/.tutti-write-probe-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

}  // namespace

std::string unwritable_dir(const ProcessGroupPtr& g, const ScratchDir& tmp) {
  const std::string ro = tmp.sub("read-only");
  if (g->rank() == 0 && (::mkdir(ro.c_str(), 0700) != 0 || ::chmod(ro.c_str(), 0500) != 0))
    ADD_FAILURE() << "could not make " << ro << " with mode 0500: " << std::strerror(errno);
  g->barrier();
  std::string found;
  for (const std::string& dir : {ro, std::string("/sys")})
    if (ckpt::is_directory(dir) && !can_create_in(dir)) {
      found = dir;
      break;
    }
  // The same answer everywhere (one host, one user: a difference is a bug here).
  int64_t which = found.empty() ? 0 : (found == ro ? 1 : 2);
  int64_t lo = which, hi = which;
  g->allreduce(Tensor::of(&lo, 1), ReduceOp::kMin);
  g->allreduce(Tensor::of(&hi, 1), ReduceOp::kMax);
  if (lo != hi) {
    ADD_FAILURE() << "ranks disagree about an unwritable directory (this rank: '" << found
                  << "')";
    return "";
  }
  return found;
}

double blob_value(uint64_t seed, size_t tensor, int64_t i) {
  // Small integers: exact in int8 .. float64 alike.
  const uint64_t h = (seed * 1000003u + tensor * 7919u + static_cast<uint64_t>(i) * 31u) % 101u;
  return static_cast<double>(h) - 50.0;
}

Blob::Blob(std::vector<int64_t> sizes) {
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                          DType::kFloat64, DType::kInt8,    DType::kUInt8,
                          DType::kInt32,   DType::kInt64};
  for (DType d : dtypes)
    for (int64_t n : sizes) {
      T t{d, std::vector<unsigned char>(static_cast<size_t>(n) * dtype_size(d)), n};
      ts_.push_back(std::move(t));
    }
}

void Blob::fill(uint64_t seed) {
  for (size_t k = 0; k < ts_.size(); ++k)
    for (int64_t i = 0; i < ts_[k].n; ++i) {
      double v = blob_value(seed, k, i);
      if (ts_[k].dtype == DType::kUInt8) v += 50;
      store_from_double(ts_[k].bytes.data(), ts_[k].dtype, static_cast<size_t>(i), v);
    }
}

::testing::AssertionResult Blob::holds(uint64_t seed) const {
  for (size_t k = 0; k < ts_.size(); ++k)
    for (int64_t i = 0; i < ts_[k].n; ++i) {
      double v = blob_value(seed, k, i);
      if (ts_[k].dtype == DType::kUInt8) v += 50;
      const double got = load_as_double(ts_[k].bytes.data(), ts_[k].dtype, static_cast<size_t>(i));
      if (got != v)
        return ::testing::AssertionFailure()
               << "tensor " << k << " (" << dtype_name(ts_[k].dtype) << "[" << ts_[k].n
               << "]) element " << i << " is " << got << ", expected " << v
               << " (seed " << seed << ")";
    }
  return ::testing::AssertionSuccess();
}

StateDict Blob::state_dict() {
  StateDict out;
  for (size_t k = 0; k < ts_.size(); ++k) {
    T& t = ts_[k];
    out.push_back({"t" + std::to_string(k) + "_" + dtype_name(t.dtype),
                   Tensor(t.bytes.data(), t.dtype, Shape{t.n}), ShardInfo{}});
  }
  return out;
}

void flip_bit(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const int64_t size = f.tellg();
  const int64_t pos = offset < 0 ? size + offset : offset;
  f.seekg(pos);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(pos);
  f.write(&c, 1);
}

void truncate_file(const std::string& path, uint64_t size) {
  if (::truncate(path.c_str(), static_cast<off_t>(size)) != 0) std::abort();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<std::string> complete_checkpoints(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& c : list_checkpoints(dir))
    if (c.complete) out.push_back(c.name);
  return out;
}

}  // namespace test
}  // namespace tutti
