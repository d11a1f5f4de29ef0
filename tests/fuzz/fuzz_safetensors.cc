// libFuzzer entry point: the safetensors parser and tutti's shard metadata.
//   clang build: -DTUTTI_BUILD_FUZZERS=ON, then
//   build/tests/fuzz/fuzz_safetensors tests/fuzz/corpus/safetensors -max_total_time=60
#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tutti::fuzz::safetensors_one(data, size);
  return 0;
}
