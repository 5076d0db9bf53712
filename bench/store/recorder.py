"""The run's recorder, in a process of its own: the store's batched writer plus the NVML and server-metrics
samplers (telemetry.py). The load generator only packs its result records (msgpack) into this process's
stdin, so no DuckDB write, Arrow conversion, Prometheus parse or NVML call ever holds its event loop or its GIL.

    Recorder(db, run_id, url)                      the runner's handle: send(rows), close() -> rows written
    main() with argv DB RUN_ID [SERVER_URL]        stdin: frames of <u32 length><msgpack list of request rows>
    stdout at the end: {"requests": rows written, ...}
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import msgpack

from bench.store.db import Store
from bench.store.telemetry import GpuSampler, ServerSampler
from bench.store.writer import BatchedWriter

HELD_DB_WAIT_S = 3600.0  # how long the run's rows wait for a reader that holds the file (saying so every few s)


class Recorder:
    """main() for the run's length: the writer and the samplers, in a process of their own."""

    def __init__(self, db: Path, run_id: str, target: str):
        from gevent import subprocess as gsub  # cooperative pipes: the caller's event loop keeps running

        # -c, not -m: bench.store imports this module, and runpy would run a second copy of it
        self.proc = gsub.Popen([sys.executable, "-c", "from bench.store.recorder import main; main()", str(db), run_id,
                                target],
                               stdin=gsub.PIPE, stdout=gsub.PIPE, cwd=Path(__file__).resolve().parents[2])

    def send(self, rows: list[dict]) -> None:
        data = msgpack.packb(rows)
        self.proc.stdin.write(struct.pack("<I", len(data)) + data)
        self.proc.stdin.flush()

    def close(self) -> dict:
        """Ends the recorder: it writes what is left and says how many rows it wrote."""
        self.proc.stdin.close()
        out = self.proc.stdout.read()
        if self.proc.wait() != 0:
            raise RuntimeError(f"the recorder process failed (exit {self.proc.returncode}); see its error above")
        return json.loads(out)


def main() -> None:
    db, run_id = sys.argv[1], sys.argv[2]
    url = sys.argv[3] if len(sys.argv) > 3 else None
    writer = BatchedWriter(Store(db, lock_timeout_s=HELD_DB_WAIT_S), run_id, close_timeout_s=HELD_DB_WAIT_S)
    samplers = [GpuSampler(writer.add_gpu_sample).start()]
    if url:
        samplers.append(ServerSampler(url, writer.add_server_sample).start())
    stdin = sys.stdin.buffer
    while len(head := stdin.read(4)) == 4:
        for row in msgpack.unpackb(stdin.read(struct.unpack("<I", head)[0])):
            writer.add_request(row)
    for s in samplers:
        s.stop()
    writer.close()
    print(json.dumps(writer.rows_written), flush=True)


if __name__ == "__main__":
    main()
