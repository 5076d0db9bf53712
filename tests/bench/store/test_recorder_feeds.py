"""A local worker's frames (loadgen/frames.py) are the recorder's frames (bench/store/recorder.py): one format."""

import io

from bench.store import recorder
from loadgen import frames


def test_a_workers_frames_read_as_the_recorders():
    msgs = [{"started": frames.inflight([{"request_id": "7", "kind": "chat", "phase": "measured", "extra": 1}])},
            {"rows": [{"request_id": "7", "status": "ok", "itl_s": [0.01, 0.02]}], "inflight": []}]
    data = b"".join(frames.pack(m) for m in msgs)
    assert data == b"".join(recorder.pack(m) for m in msgs)
    assert list(recorder.read_frames(io.BytesIO(data))) == [
        {"started": [{"request_id": "7", "kind": "chat", "phase": "measured", "scheduled_at": None, "sent_at": None,
                      "dispatch_lag_s": None}]}, msgs[1]]
    assert list(recorder.read_frames(io.BytesIO(data[:-3]))) == msgs[:1]  # a writer killed mid-frame
