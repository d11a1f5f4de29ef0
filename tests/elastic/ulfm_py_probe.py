"""What the Python ULFM probes share (ulfm_torch_probe.py,
ulfm_sampler_probe.py): tutti.torch's init, and exit 77 (skipped) where
in-process recovery is not available."""
import sys

import tutti
import tutti.torch as hvd


def init_or_skip():
    """hvd.init(); exits 77 without recovery.  Returns the rank at start."""
    hvd.init()
    if not tutti.recovery_available():
        print("ulfm_probe: in-process recovery is not available here")
        tutti.shutdown()
        sys.exit(77)
    return hvd.rank()
