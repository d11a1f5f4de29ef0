"""tutti.start_timeline / stop_timeline (docs/timeline.md): the Python API
records this rank's trace with the application's spans and tutti's
collectives; the file is a closed, valid Chrome trace."""
import os
import sys

import numpy as np
import pytest

import tutti

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import timeline_trace  # noqa: E402


def test_start_stop_records_spans_and_collectives(tmp_path, world, rank, size):
    assert not tutti.timeline_active()
    tutti.start_timeline(str(tmp_path) + "/")
    try:
        f = tutti.timeline_file()
        assert f == os.path.join(str(tmp_path), f"rank{rank}.json")
        with pytest.raises(tutti.InvalidArgumentError, match="already recording"):
            tutti.start_timeline(str(tmp_path / "again"))
        tutti.timeline_begin("step")
        x = np.full(257, rank + 1, dtype=np.float32)
        world.allreduce(x, name="timeline probe")
        tutti.timeline_mark("after allreduce")
        tutti.timeline_end()
    finally:
        tutti.stop_timeline()
    assert not tutti.timeline_active() and tutti.timeline_file() == ""
    tutti.stop_timeline()  # idempotent
    assert x[0] == size * (size + 1) / 2
    assert open(f).read().rstrip().endswith("]")
    events = timeline_trace.load(f)
    assert timeline_trace.validate(events) == []
    names = {(e.get("cat"), e["ph"], e["name"]) for e in events}
    assert ("user", "B", "step") in names and ("user", "E", "step") in names
    assert ("user", "i", "after allreduce") in names
    probe = [e for e in events if e["name"] == "allreduce timeline probe"]
    if size > 1:
        assert len(probe) == 1 and probe[0]["args"]["bytes"] == 257 * 4
        assert probe[0]["args"]["count"] == 257 and probe[0]["args"]["dtype"] == "float32"
        step = [e["ts"] for e in events if e["name"] == "step"]
        assert step[0] <= probe[0]["ts"] and probe[0]["ts"] + probe[0]["dur"] <= step[1]


def test_nothing_recorded_when_off(tmp_path):
    assert not tutti.timeline_active()
    tutti.timeline_begin("ignored")
    tutti.timeline_mark("ignored")
    tutti.timeline_end()
    assert list(tmp_path.iterdir()) == []
