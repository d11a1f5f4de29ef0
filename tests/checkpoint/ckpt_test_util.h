// Helpers for the checkpoint tests: a shared scratch directory, Stateful
// components whose contents are a closed-form function of (rank, step), and
// file corruption.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/checkpoint.h"
#include "tutti/tutti.h"

namespace tutti {
namespace test {

// Collective: a fresh directory under `root` (/tmp; /dev/shm for the
// memory tier's medium), the same path on every rank; removed by the last
// reference on rank 0.
class ScratchDir {
 public:
  explicit ScratchDir(const ProcessGroupPtr& g, const std::string& root = "/tmp");
  ~ScratchDir();
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  ProcessGroupPtr group_;
  std::string path_;
};

// Collective: a directory in which this process cannot create entries, the
// same on every rank, or "" where there is none (the caller skips).
// Permission bits stop an ordinary user (a 0500 directory in `tmp`) but not
// root, who gets /sys instead: sysfs refuses new entries to everyone.
std::string unwritable_dir(const ProcessGroupPtr& g, const ScratchDir& tmp);

// One tensor per dtype and a few shapes; element i of tensor k holds a value
// determined by (seed, k, i) so that any mix of two saves is detectable.
class Blob : public Stateful {
 public:
  // `sizes` elements per tensor (one tensor per size per dtype).
  explicit Blob(std::vector<int64_t> sizes = {0, 1, 7, 1000});
  void fill(uint64_t seed);
  // Element-exact comparison with fill(seed).
  ::testing::AssertionResult holds(uint64_t seed) const;
  StateDict state_dict() override;
  void on_state_loaded() override { ++loads; }
  int loads = 0;

 private:
  struct T {
    DType dtype;
    std::vector<unsigned char> bytes;
    int64_t n;
  };
  std::vector<T> ts_;
};

// Value a Blob stores for (seed, tensor, element) as raw bits: exactly
// representable in every dtype.
double blob_value(uint64_t seed, size_t tensor, int64_t i);

// Flips one bit of a file at `offset` (negative: from the end).
void flip_bit(const std::string& path, int64_t offset);
void truncate_file(const std::string& path, uint64_t size);
std::string read_text(const std::string& path);
void write_text(const std::string& path, const std::string& text);
bool exists(const std::string& path);
std::vector<std::string> complete_checkpoints(const std::string& dir);

}  // namespace test
}  // namespace tutti
