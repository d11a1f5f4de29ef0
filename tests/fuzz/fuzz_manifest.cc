// libFuzzer entry point: the manifest.json parser.
//   build/tests/fuzz/fuzz_manifest tests/fuzz/corpus/manifest -max_total_time=60
#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tutti::fuzz::manifest_one(data, size);
  return 0;
}
