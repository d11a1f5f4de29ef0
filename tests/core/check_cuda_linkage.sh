#!/bin/sh
# One CUDA runtime per process: every binary given must need the shared
# libcudart, must not carry a static copy (defined cuda* API functions), and
# must not need libcuda (the driver is reached through
# cudaGetDriverEntryPointByVersion, so libtutti loads without a driver).
status=0
for f in "$@"; do
  needed=$(readelf -d "$f" | grep NEEDED)
  if ! echo "$needed" | grep -q 'libcudart\.so'; then
    echo "FAIL $f: does not need libcudart.so"; status=1
  fi
  if echo "$needed" | grep -q 'libcuda\.so'; then
    echo "FAIL $f: needs libcuda.so (look driver entry points up at run time)"; status=1
  fi
  static=$(nm --defined-only "$f" 2>/dev/null | grep -cE ' cuda[A-Z][A-Za-z_]*$')
  if [ "$static" -ne 0 ]; then
    echo "FAIL $f: defines $static CUDA runtime functions (cudart_static linked in)"; status=1
  fi
  [ $status -eq 0 ] && echo "ok $f"
done
exit $status
