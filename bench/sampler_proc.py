"""The run's NVML and server-metrics samplers (bench/telemetry.py) in a process of their own, printing one JSON row
a line: the load generator's event loop never pays for a scrape, a Prometheus parse or an NVML call.

    python -m bench.sampler_proc URL   ->   {"table": "gpu"|"server", "row": {...}} per line, until stdin closes
"""

from __future__ import annotations

import json
import sys
import threading

from bench.telemetry import GpuSampler, ServerSampler


def main() -> None:
    url = sys.argv[1]
    lock = threading.Lock()

    def sink(table: str):
        def put(row: dict) -> None:
            with lock:
                sys.stdout.write(json.dumps({"table": table, "row": row}) + "\n")
                sys.stdout.flush()
        return put

    samplers = [GpuSampler(sink("gpu")).start(), ServerSampler(url, sink("server")).start()]
    sys.stdin.read()  # the runner closes our stdin when the run ends
    for s in samplers:
        s.stop()


if __name__ == "__main__":
    main()
