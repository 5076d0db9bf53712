"""The recorder's wire format, from a worker: frames of <u32 little-endian length><msgpack map>. The runner writes
them into the recorder's stdin (bench/store/recorder.py's pack: bench.store imports nothing of loadgen); a local
worker writes its own into a pipe of its own to the same recorder, which reads both, so that the worker's rows
reach the store even when the master is killed outright (tests/bench/store/test_recorder_feeds.py checks that the
two agree).

A frame's keys: `started` (requests that just went out), `rows` (finished records), `inflight` (requests sent
with no record yet, at that moment), `withdrawn` (request ids announced, then not sent), `close` (the runner's
end of the run)."""

from __future__ import annotations

import fcntl
import os
import struct

import msgpack

PIPE_FD_ENV = "CAPBENCH_RECORDER_FD"  # a local worker's write end of its pipe to the recorder
INFLIGHT_FIELDS = ("request_id", "kind", "phase", "scheduled_at", "sent_at", "dispatch_lag_s")


CLIENT_ONLY = ("session_last",)  # what a record tells the runner, not the store


def rows(recs) -> list[dict]:
    """Records as the store's rows (without what only the runner reads)."""
    return [{k: v for k, v in r.items() if k not in CLIENT_ONLY} for r in recs]


def inflight(recs) -> list[dict]:
    """What the recorder keeps of a request in flight (its row, should its sender die before the record)."""
    return [{k: r.get(k) for k in INFLIGHT_FIELDS} for r in recs]


def pack(msg: dict) -> bytes:
    data = msgpack.packb(msg)
    return struct.pack("<I", len(data)) + data


class PipeWriter:
    """A worker's frames into its pipe, from gevent greenlets: non-blocking writes (a full pipe waits, the event
    loop keeps running), one frame at a time."""

    def __init__(self, fd: int):
        from gevent.lock import BoundedSemaphore
        from gevent.os import make_nonblocking

        self.fd = fd
        make_nonblocking(fd)
        try:  # 1 MiB rather than 64 KiB: a recorder slow to start must not hold the load (recorder.py's _widen)
            fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        except OSError:
            pass
        self.lock = BoundedSemaphore()
        self.broken = False

    def write(self, msg: dict) -> None:
        from gevent.os import nb_write

        if self.broken:
            return
        data = memoryview(pack(msg))
        with self.lock:
            try:
                while data:
                    data = data[nb_write(self.fd, data):]
            except OSError:  # the recorder is gone: nothing to store into any more
                self.broken = True

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
