"""The run's recorder, in a process of its own: the store's batched writer plus the NVML and server-metrics
samplers (telemetry.py). The load generator only packs its result records (msgpack) into this process's
stdin, so no DuckDB write, Arrow conversion, Prometheus parse or NVML call ever holds its event loop or its GIL.

    Recorder(db, run_id, url)                      the runner's handle: send(rows, inflight), close() -> rows written
    main() with argv DB RUN_ID [SERVER_URL]        stdin: frames of <u32 length><msgpack {rows, inflight} | {close}>
    stdout at the end: {"requests": rows written, ...}

Each frame also carries the requests in flight at that moment (sent, no record yet). If the load generator dies
(SIGKILL) before its close frame, the recorder writes those as `cancelled` rows and marks the run aborted: a
request in flight at the kill still has its row. Lost are only records that both started and ended within the last
frame interval (half a second).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import sys
from pathlib import Path

import msgpack

from bench.errors import BadInput
from bench.store.db import Store
from bench.store.telemetry import GpuSampler, ServerSampler
from bench.store.writer import BatchedWriter

INFLIGHT_FIELDS = ("request_id", "kind", "phase", "scheduled_at", "sent_at", "dispatch_lag_s")
HELD_DB_WAIT_S = 3600.0  # how long the run's rows wait for a reader that holds the file (saying so every few s)


class Recorder:
    """main() for the run's length: the writer and the samplers, in a process of their own."""

    def __init__(self, db: Path, run_id: str, target: str):
        from gevent import subprocess as gsub  # cooperative pipes: the caller's event loop keeps running

        # -c, not -m: bench.store imports this module, and runpy would run a second copy of it
        self.proc = gsub.Popen([sys.executable, "-c", "from bench.store.recorder import main; main()", str(db), run_id,
                                target],
                               stdin=gsub.PIPE, stdout=gsub.PIPE, cwd=Path(__file__).resolve().parents[2])
        _widen(self.proc.stdin.fileno())
        self.failed: str | None = None
        self.said: dict = {}
        from gevent.lock import BoundedSemaphore

        self.writing = BoundedSemaphore()  # users announce requests from many greenlets: one frame at a time

    def send(self, rows: list[dict], inflight: list[dict] | None = None) -> None:
        msg = {"rows": rows} if inflight is None else {"rows": rows, "inflight": [
            {k: r.get(k) for k in INFLIGHT_FIELDS} for r in inflight]}
        self._frame(msg)

    def started(self, recs: list[dict]) -> None:
        """Requests that just went out: the recorder keeps them as in flight until their rows come."""
        self._frame({"started": [{k: r.get(k) for k in INFLIGHT_FIELDS} for r in recs]})

    def gone(self) -> str | None:
        """Why the recorder can no longer store rows (it exited: the DB cannot be written), or None."""
        if self.failed is None and self.proc.poll() is not None:
            self.failed = f"the recorder process exited (code {self.proc.returncode})"
        return self.failed

    def _frame(self, msg: dict) -> None:
        if self.failed:
            return
        data = msgpack.packb(msg)
        try:
            with self.writing:
                self.proc.stdin.write(struct.pack("<I", len(data)) + data)
                self.proc.stdin.flush()
        except OSError as e:  # the recorder is gone: the runner stops sending (gone()), its end says the count
            self.failed = f"the recorder process ended early ({e})"

    def close(self) -> dict | None:
        """Ends the recorder: it writes what is left and says how many rows it wrote (None if it failed: count
        the rows in the DB)."""
        self._frame({"close": True})
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        out = self.proc.stdout.read()
        said: dict = {}
        try:
            said = json.loads(out)
        except ValueError:
            pass
        self.said = said  # the recorder's last word: rows written, and why it stopped if it did
        if self.proc.wait() != 0 or self.failed:
            self.failed = said.get("error") or self.failed or f"the recorder process failed (exit " \
                f"{self.proc.returncode})"
            return None
        return said


def _widen(fd: int) -> None:
    """A 1 MiB pipe (Linux's default limit) instead of 64 KiB: users wait for their request's announcement to be in
    the pipe before sending it (users.py), so a recorder slow to start (seconds on a loaded machine) or held by a
    reader must not stall the load after 64 KiB of frames."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except OSError:  # not Linux, or a lower limit: the default pipe, and users may wait
        pass


def main() -> None:
    db, run_id = sys.argv[1], sys.argv[2]
    url = sys.argv[3] if len(sys.argv) > 3 else None
    logging.getLogger("bench.store.writer").setLevel(logging.CRITICAL)  # a failed flush is said by the runner
    try:
        store = Store(db, lock_timeout_s=HELD_DB_WAIT_S, recording=run_id)  # a slow start may outlive its runner
    except BadInput as e:  # the file went bad after the run started: the runner says it, with the count
        print(json.dumps({"requests": 0, "error": str(e)}), flush=True)
        sys.exit(1)
    writer = BatchedWriter(store, run_id, close_timeout_s=HELD_DB_WAIT_S)
    samplers = [GpuSampler(writer.add_gpu_sample).start()]
    if url:
        samplers.append(ServerSampler(url, writer.add_server_sample).start())
    stdin = sys.stdin.buffer
    inflight: dict[str, dict] = {}
    done: set[str] = set()
    closed = False
    while len(head := stdin.read(4)) == 4:
        msg = msgpack.unpackb(stdin.read(struct.unpack("<I", head)[0]))
        closed = closed or bool(msg.get("close"))
        # added to, never replaced: a list taken before a request's `started` frame was written may reach the
        # pipe after it (requests leave in-flight by their rows only)
        inflight.update({r["request_id"]: r for r in msg.get("inflight", ()) if r["request_id"] not in done})
        for r in msg.get("started", ()):  # announced as each request went out (one process's run)
            if r["request_id"] not in done:
                inflight[r["request_id"]] = r
        for row in msg.get("rows", ()):
            writer.add_request(row)
            inflight.pop(row.get("request_id"), None)
            done.add(row.get("request_id"))
        if writer.error is not None:
            _cannot_write(writer, db)
    if not closed:
        _orphaned(writer, inflight.values())
    for s in samplers:
        s.stop()
    try:
        writer.close()
        if not closed:
            writer.store.finish_run(run_id, "aborted")
    except Exception as e:  # the last rows, or the run's end, could not be written
        writer.error = writer.error or f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        _cannot_write(writer, db)
    try:
        print(json.dumps(writer.rows_written), flush=True)
    except BrokenPipeError:  # the load generator was killed: nobody reads the count, the rows are written
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush goes nowhere, quietly
    sys.stderr.flush()
    # Everything is written and closed, the threads joined: the interpreter's teardown of pandas, DuckDB and Arrow
    # (0.25 s here) would only hold the runner, which waits for this exit before a sweep's next stage.
    os._exit(0)


def _cannot_write(writer: BatchedWriter, db: str) -> None:
    """The DB can no longer be written (disk full, file gone or truncated): say so to the runner, which stops
    sending, and end now; the rows written before stay."""
    print(json.dumps({**writer.rows_written, "error": f"cannot write {db} ({writer.error})",
                      "unwritten": writer.pending()}), flush=True)
    os._exit(1)  # not close(): its flush would fail the same way, and retry for an hour


def _orphaned(writer: BatchedWriter, inflight) -> None:
    """The load generator went away without its close frame: its requests in flight end as `cancelled` rows."""
    n = 0
    for rec in inflight:
        writer.add_request({**rec, "status": "error", "error_kind": "cancelled",
                            "error": "the load generator process died with this request in flight",
                            "note": "recorded by the recorder from the last in-flight list: no response timings"})
        n += 1
    print(f"recorder: the load generator ended without closing the run; {n} request(s) in flight recorded as "
          "cancelled, the run marked aborted", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
