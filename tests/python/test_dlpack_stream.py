"""The stream argument tutti passes to a CUDA producer's __dlpack__ (the
DLPack protocol: 1 is CUDA's legacy default stream, 2 the per-thread one,
any other value a stream handle; 0 is disallowed as ambiguous, and
PyTorch 2.11 raises on it).  tutti's own stream argument is a CUDA stream
handle, where 0 is the legacy default stream: it must reach __dlpack__ as 1.
Seen on an H100 (2026-11-27): every CUDA collective called without a stream
failed with "AssertionError: unsupported stream on CUDA: 0".  A fake CUDA
producer records what it is asked for, so this runs without a GPU."""
import pytest

import tutti

K_DL_CUDA = 2


class Asked(Exception):
    pass


class FakeCudaArray:
    """Claims to live on cuda:0; records __dlpack__'s stream and stops there."""

    def __init__(self):
        self.streams = []

    def __dlpack_device__(self):
        return (K_DL_CUDA, 0)

    def __dlpack__(self, stream=None, **kwargs):
        self.streams.append(stream)
        raise Asked()


@pytest.mark.parametrize("given, expected", [(None, 1), (0, 1), (1, 1), (2, 2),
                                             (0x7f00deadbeef, 0x7f00deadbeef)])
def test_the_stream_reaches_dlpack_as_the_protocol_spells_it(world, given, expected):
    x = FakeCudaArray()
    kwargs = {} if given is None else {"stream": given}
    with pytest.raises(Asked):
        world.allreduce(x, op="sum", **kwargs)
    assert x.streams == [expected]


def test_broadcast_and_allgather_too(world):
    for call in (lambda x: world.broadcast(x, root=0),
                 lambda x: world.allgather(x, FakeCudaArray())):
        x = FakeCudaArray()
        with pytest.raises(Asked):
            call(x)
        assert x.streams == [1]
