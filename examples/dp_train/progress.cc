#include "progress.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <tutti/tutti.h>

namespace demo {

namespace {

// The number after "key": in a flat JSON object we wrote ourselves.
bool number(const std::string& json, const char* key, double* out) {
  const std::string k = std::string("\"") + key + "\":";
  const size_t at = json.find(k);
  if (at == std::string::npos) return false;
  const char* p = json.c_str() + at + k.size();
  char* end = nullptr;
  const double v = std::strtod(p, &end);
  if (end == p) return false;
  *out = v;
  return true;
}

template <typename T>
void read(const std::string& json, const char* key, T* field) {
  double v;
  if (number(json, key, &v)) *field = static_cast<T>(v);
}

}  // namespace

std::string Progress::to_json() const {
  char buf[512];
  // Integers up to 2^53 survive the double round trip of from_json.
  std::snprintf(buf, sizeof(buf),
                "{\"position\": %lld, \"global_batch\": %lld, \"world\": %d, \"runs\": %lld, "
                "\"resizes\": %lld, \"bytes_sent\": %llu, \"train_s\": %.6f, \"ckpt_s\": %.6f, "
                "\"lost_s\": %.6f, \"saved_at\": %.6f}",
                static_cast<long long>(position), static_cast<long long>(global_batch), world,
                static_cast<long long>(runs), static_cast<long long>(resizes),
                static_cast<unsigned long long>(bytes_sent), train_s, ckpt_s, lost_s, saved_at);
  return buf;
}

bool Progress::from_json(const std::string& json) {
  double v;
  if (!number(json, "position", &v)) return false;
  position = static_cast<int64_t>(v);
  read(json, "global_batch", &global_batch);
  read(json, "world", &world);
  read(json, "runs", &runs);
  read(json, "resizes", &resizes);
  read(json, "bytes_sent", &bytes_sent);
  read(json, "train_s", &train_s);
  read(json, "ckpt_s", &ckpt_s);
  read(json, "lost_s", &lost_s);
  read(json, "saved_at", &saved_at);
  return true;
}

SamplesLog::SamplesLog(const std::string& path) : path_(path) {
  if (path.empty()) return;
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw tutti::Error(tutti::ErrorCode::kIo,
                       "samples log '" + path + "': open failed: " + std::strerror(errno));
}

SamplesLog::~SamplesLog() {
  if (fd_ >= 0) ::close(fd_);
}

void SamplesLog::record(int64_t start, int64_t step, int rank, int world, int64_t first, int64_t count) {
  if (fd_ < 0) return;
  char line[256];
  const int n = std::snprintf(line, sizeof(line),
                              "{\"start\": %lld, \"step\": %lld, \"rank\": %d, \"world\": %d, "
                              "\"first\": %lld, \"count\": %lld}\n",
                              static_cast<long long>(start), static_cast<long long>(step), rank, world,
                              static_cast<long long>(first), static_cast<long long>(count));
  if (::write(fd_, line, static_cast<size_t>(n)) != n)
    throw tutti::Error(tutti::ErrorCode::kIo, "rank " + std::to_string(rank) + ": samples log '" +
                                                  path_ + "': write failed: " + std::strerror(errno));
}

}  // namespace demo
