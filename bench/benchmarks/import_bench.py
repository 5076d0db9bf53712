"""`capbench import` speed: an AIPerf profile_export.jsonl of --records requests (each with --chunks streamed-chunk
gaps), written in a scratch folder, imported --repeat times into fresh DBs; prints the file size and the median
records per second (read, check against the schema, map, one transaction).

    .venv/bin/python -m bench.benchmarks.import_bench [--records 100000] [--chunks 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.imports import import_file

DEPLOYMENT = "glm-4.6@h200x8,kv=fp8_e4m3"


def write_export(path: Path, records: int, chunks: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    t0 = 1_765_000_000_000_000_000
    with path.open("w") as f:
        for i in range(records):
            gaps = rng.uniform(10, 30, chunks).round(3)
            ttft = float(rng.uniform(50, 400))
            latency = ttft + float(gaps.sum())
            start = t0 + i * 10_000_000
            f.write(json.dumps({
                "metadata": {"session_num": i, "x_request_id": f"r{i}", "x_correlation_id": f"s{i}", "turn_index": 0,
                             "request_start_ns": start, "request_end_ns": start + int(latency * 1e6),
                             "benchmark_phase": "profiling", "was_cancelled": False},
                "metrics": {"input_sequence_length": {"value": 1000, "unit": "tokens"},
                            "time_to_first_token": {"value": ttft, "unit": "ms"},
                            "request_latency": {"value": latency, "unit": "ms"},
                            "output_sequence_length": {"value": chunks + 1, "unit": "tokens"},
                            "inter_chunk_latency": {"value": gaps.tolist(), "unit": "ms"},
                            "inter_token_latency": {"value": float(gaps.mean()), "unit": "ms"}},
                "error": None}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile_export.jsonl"
        write_export(path, args.records, args.chunks)
        times = []
        for k in range(args.repeat):
            start = time.perf_counter()
            [(_, stored)] = import_file("aiperf", path, DEPLOYMENT, Path(tmp) / f"db{k}.duckdb")
            times.append(time.perf_counter() - start)
            assert stored
        med = statistics.median(times)
        print(f"aiperf export: {args.records:,} records x {args.chunks} chunk gaps, "
              f"{path.stat().st_size / 2**20:,.1f} MiB")
        print(f"import: median {med:.2f} s of {args.repeat} ({', '.join(f'{t:.2f}' for t in times)}), "
              f"{args.records / med:,.0f} records/s, {path.stat().st_size / 2**20 / med:,.1f} MiB/s")


if __name__ == "__main__":
    main()
