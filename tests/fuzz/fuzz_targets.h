// What the checkpoint fuzz targets do with one input.  Shared by the
// libFuzzer entry points (fuzz_safetensors.cc, fuzz_manifest.cc, built with
// clang and -DTUTTI_BUILD_FUZZERS=ON) and by the deterministic replay
// (fuzz_replay.cc) that ctest runs with any compiler.
//
// Contract checked: the parsers either return a result whose invariants
// hold (every offset inside the file, dtype x shape == byte length, shard
// placements inside their global tensors) or throw tutti::Error(kCorrupt);
// anything else -- another exception, a crash, a sanitizer report, a broken
// invariant (abort) -- is a bug.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tutti {
namespace fuzz {

// Returns 1 when the input parsed, 0 when it was rejected.
int safetensors_one(const uint8_t* data, size_t size);
int manifest_one(const uint8_t* data, size_t size);

}  // namespace fuzz
}  // namespace tutti
