"""The run's recorder, in a process of its own: the store's batched writer plus the NVML and server-metrics
samplers (bench/telemetry.py). The load generator only packs its result records (msgpack) into this process's
stdin, so no DuckDB write, Arrow conversion, Prometheus parse or NVML call ever holds its event loop or its GIL.

    python -m bench.recorder DB RUN_ID [SERVER_URL]   stdin: frames of <u32 length><msgpack list of request rows>
    stdout at the end: {"requests": rows written, ...}
"""

from __future__ import annotations

import json
import struct
import sys

import msgpack

from bench.store import Store
from bench.telemetry import GpuSampler, ServerSampler


def main() -> None:
    db, run_id = sys.argv[1], sys.argv[2]
    url = sys.argv[3] if len(sys.argv) > 3 else None
    writer = Store(db).writer(run_id)
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
