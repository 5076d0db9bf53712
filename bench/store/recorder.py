"""The run's recorder, in a process of its own: the store's batched writer plus the NVML and server-metrics
samplers (telemetry.py). The load generator only packs its result records (msgpack) into this process's
stdin, so no DuckDB write, Arrow conversion, Prometheus parse or NVML call ever holds its event loop or its GIL.

    Recorder(db, run_id, url, feeds, gpu_metrics)  the runner's handle: send(rows, inflight), close() -> rows written
    main() with argv DB RUN_ID [SERVER_URL]        stdin: frames (pack()) {started | rows, inflight | close}
                                                   (the GPU nodes' metrics endpoints in GPU_METRICS_ENV, JSON)
    stdout at the end: {"requests": rows written, ...}

Each request is announced (`started`) before it goes out, and frames carry the requests in flight at that moment.
If the load generator dies (SIGKILL) before its close frame, the recorder writes those as `cancelled` rows and
marks the run aborted: a request sent before the kill still has its row. Local worker processes write their own
frames into pipes of their own (`feeds`, read here beside stdin), so a killed master loses none of theirs either:
the recorder ends once stdin and every feed are closed. It ignores SIGINT and SIGTERM: a signal to the whole
process group (Ctrl-C, `timeout`, `kill -- -PGID`) reaches it too, and its runner, which handles them, closes it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import queue
import signal
import struct
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import msgpack

from bench.errors import BadInput
from bench.store.db import Store
from bench.store.nodes import NodeSampler
from bench.store.telemetry import GpuSampler, ServerSampler
from bench.store.writer import BatchedWriter

HELD_DB_WAIT_S = 3600.0  # how long the run's rows wait for a reader that holds the file (saying so every few s)
FEEDS_ENV = "CAPBENCH_RECORDER_FEEDS"  # the read ends of the local workers' pipes, comma-separated fds
READY = b'{"ready": true}'  # the recorder's first line when it scrapes GPU nodes (Recorder.wait_ready)
GPU_METRICS_ENV = "CAPBENCH_RECORDER_GPU_METRICS"  # {"urls": [...], "interval_s": s}: nodes.NodeSampler's
FEED_AFTER_CLOSE_S = 30.0  # after the runner's close, how long a worker's pipe may stay open (the runner reaps
# its workers before it closes: this bounds only a worker that hangs)


class Recorder:
    """main() for the run's length: the writer and the samplers, in a process of their own."""

    def __init__(self, db: Path, run_id: str, target: str, feeds: tuple[int, ...] = (),
                 gpu_metrics: tuple[str, ...] = (), gpu_metrics_interval_s: float = 1.0):
        from gevent import subprocess as gsub  # cooperative pipes: the caller's event loop keeps running

        nodes = json.dumps({"urls": list(gpu_metrics), "interval_s": gpu_metrics_interval_s})

        # -c, not -m: bench.store imports this module, and runpy would run a second copy of it
        self.proc = gsub.Popen([sys.executable, "-c", "from bench.store.recorder import main; main()", str(db), run_id,
                                target],
                               stdin=gsub.PIPE, stdout=gsub.PIPE, cwd=Path(__file__).resolve().parents[2],
                               pass_fds=feeds,
                               env={**os.environ, FEEDS_ENV: ",".join(map(str, feeds)), GPU_METRICS_ENV: nodes},
                               preexec_fn=_ignore_signals)
        _widen(self.proc.stdin.fileno())
        self.failed: str | None = None
        self.said: dict = {}
        from gevent.lock import BoundedSemaphore

        self.writing = BoundedSemaphore()  # users announce requests from many greenlets: one frame at a time
        self._early = b""

    def wait_ready(self, timeout_s: float) -> bool:
        """Until the recorder's node samplers run (it says so when given --gpu-metrics), so that their scrapes
        cover the load from its first request; False after timeout_s (a recorder waiting for a held DB file)."""
        from gevent import Timeout

        with Timeout(timeout_s, False):
            self._early = self.proc.stdout.readline()
        return self._early.strip() == READY

    def send(self, rows: list[dict], inflight: list[dict] | None = None) -> None:
        msg = {"rows": rows} if inflight is None else {"rows": rows, "inflight": inflight}
        self._frame(msg)

    def started(self, recs: list[dict]) -> None:
        """Requests that just went out (their in-flight fields, loadgen.frames.inflight): the recorder keeps them
        as in flight until their rows come."""
        self._frame({"started": recs})

    def withdrawn(self, request_ids: list[str]) -> None:
        """Requests announced and then not sent (the run stopped first): no row owed."""
        self._frame({"withdrawn": request_ids})

    def gone(self) -> str | None:
        """Why the recorder can no longer store rows (it exited: the DB cannot be written), or None."""
        if self.failed is None and self.proc.poll() is not None:
            self.failed = f"the recorder process exited (code {self.proc.returncode})"
        return self.failed

    def _frame(self, msg: dict) -> None:
        if self.failed:
            return
        data = pack(msg)
        try:
            with self.writing:
                self.proc.stdin.write(data)
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
        lines = [ln for ln in (self._early + self.proc.stdout.read()).splitlines() if ln.strip() not in (b"", READY)]
        said: dict = {}
        try:
            said = json.loads(lines[-1]) if lines else {}
        except ValueError:
            pass
        self.said = said  # the recorder's last word: rows written, and why it stopped if it did
        if self.proc.wait() != 0 or self.failed:
            self.failed = said.get("error") or self.failed or f"the recorder process failed (exit " \
                f"{self.proc.returncode})"
            return None
        return said


def pack(msg: dict) -> bytes:
    """One frame: <u32 little-endian length><msgpack map> (loadgen/frames.py writes the same, from workers)."""
    data = msgpack.packb(msg)
    return struct.pack("<I", len(data)) + data


def read_frames(stream) -> Iterator[dict]:
    """The frames of a stream, until its end (a frame cut short by a killed writer is dropped)."""
    while len(head := stream.read(4)) == 4:
        body = stream.read(struct.unpack("<I", head)[0])
        try:
            yield msgpack.unpackb(body)
        except (ValueError, msgpack.exceptions.ExtraData):
            return


def _ignore_signals() -> None:
    """From before the interpreter starts (a signal during its imports would kill it): exec keeps SIG_IGN."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _widen(fd: int) -> None:
    """A 1 MiB pipe (Linux's default limit) instead of 64 KiB: users wait for their request's announcement to be in
    the pipe before sending it (users.py), so a recorder slow to start (seconds on a loaded machine) or held by a
    reader must not stall the load after 64 KiB of frames."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except OSError:  # not Linux, or a lower limit: the default pipe, and users may wait
        pass


def _inputs() -> queue.Queue:
    """Frames from stdin (the runner's) and each feed (a local worker's), in one queue, as (source, frame); each
    source ends with (source, None)."""
    q: queue.Queue = queue.Queue(maxsize=10_000)
    feeds = [int(fd) for fd in os.environ.get(FEEDS_ENV, "").split(",") if fd]
    streams = [("stdin", sys.stdin.buffer)] + [(f"feed{fd}", os.fdopen(fd, "rb")) for fd in feeds]

    def pump(name: str, stream) -> None:
        try:
            for msg in read_frames(stream):
                q.put((name, msg))
        finally:
            q.put((name, None))

    for name, stream in streams:
        threading.Thread(target=pump, args=(name, stream), daemon=True).start()
    q.open = len(streams)  # type: ignore[attr-defined]
    return q


def main() -> None:
    _ignore_signals()  # its runner closes it: see the module's docstring
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
    nodes = json.loads(os.environ.get(GPU_METRICS_ENV) or "{}")
    if nodes.get("urls"):
        samplers.append(NodeSampler(nodes["urls"], writer.add_gpu_sample, writer.add_server_sample,
                                    nodes.get("interval_s", 1.0)).start())
        print(READY.decode(), flush=True)  # the runner waits for it: the nodes' scrapes cover the whole load
    inputs = _inputs()
    open_inputs: int = inputs.open  # type: ignore[attr-defined]
    inflight: dict[str, dict] = {}
    done: set[str] = set()
    closed = False
    while open_inputs:
        try:
            source, msg = inputs.get(timeout=FEED_AFTER_CLOSE_S if closed else None)
        except queue.Empty:  # closed by the runner, and a worker's pipe still open: that worker hangs
            break
        if msg is None:
            open_inputs -= 1
            continue
        closed = closed or (source == "stdin" and bool(msg.get("close")))
        # added to, never replaced: a list taken before a request's `started` frame was written may reach the
        # pipe after it (requests leave in-flight by their rows only)
        inflight.update({r["request_id"]: r for r in msg.get("inflight", ()) if r["request_id"] not in done})
        for r in msg.get("started", ()):  # announced as each request went out (one process's run)
            if r["request_id"] not in done:
                inflight[r["request_id"]] = r
        for rid in msg.get("withdrawn", ()):
            inflight.pop(rid, None)
            done.add(rid)
        for row in msg.get("rows", ()):
            writer.add_request(row)
            inflight.pop(row.get("request_id"), None)
            done.add(row.get("request_id"))
        if writer.error is not None:
            _cannot_write(writer, db)
    if inflight or not closed:  # closed with requests still in flight: a worker died without their records
        _orphaned(writer, inflight.values(), closed)
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


def _orphaned(writer: BatchedWriter, inflight, closed: bool) -> None:
    """Requests announced and never recorded (the load generator, or one of its workers, went away without
    their records) end as `cancelled` rows."""
    n = 0
    for rec in inflight:
        writer.add_request({**rec, "status": "error", "error_kind": "cancelled",
                            "error": "the load generator process died with this request in flight",
                            "note": "recorded by the recorder from the last in-flight list: no response timings"})
        n += 1
    if closed:
        print(f"recorder: {n} request(s) in flight had no record at the run's end (a worker died): recorded as "
              "cancelled", file=sys.stderr, flush=True)
    else:
        print(f"recorder: the load generator ended without closing the run; {n} request(s) in flight recorded as "
              "cancelled, the run marked aborted", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
