"""Results-store benchmark: ingest rate of request rows through the batched writer, and the per-run summary
query on 10M synthetic requests. Goals: >= 1M rows/s ingest, summary < 500 ms.

    .venv/bin/python -m bench.benchmarks.store_bench [--rows 10000000] [--gaps 8]

Synthetic requests carry `--gaps` inter-token gaps each (default 8, so 80M gaps for 10M requests): a real
10M-request run with hundreds of gaps per request would not fit this machine's disk or memory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from rich.console import Console
from rich.progress import Progress

from bench.model import Slo
from bench.store import BatchedWriter, Store, queries

BATCH = 1_000_000


def synthetic_batch(rng: np.random.Generator, start: int, n: int, gaps: int, t0: float) -> pa.Table:
    due = t0 + np.arange(start, start + n) / 10_000.0  # 10k requests/s
    lag = rng.exponential(0.0005, n)
    ttft = rng.lognormal(np.log(0.3), 0.5, n)
    itl = rng.lognormal(np.log(0.02), 0.3, n * gaps)
    decode = itl.reshape(n, gaps).sum(axis=1)
    error = rng.random(n) < 0.01
    return pa.table({
        "request_id": pa.array(np.char.add("r", np.arange(start, start + n).astype(str))),
        "phase": pa.array(np.where(np.arange(start, start + n) < 1000, "warmup", "measured")),
        "kind": pa.array(["chat"] * n),
        "scheduled_at": due, "sent_at": due + lag, "first_token_at": due + lag + ttft,
        "finished_at": due + lag + ttft + decode,
        "itl_s": pa.ListArray.from_arrays(pa.array(np.arange(0, n * gaps + 1, gaps, dtype=np.int32)), pa.array(itl)),
        "prompt_tokens": rng.integers(100, 4000, n).astype(np.int32),
        "completion_tokens": np.full(n, gaps + 1, np.int32),
        "tokens_from": pa.array(["usage"] * n),
        "status": pa.array(np.where(error, "error", "ok")),
        "error_kind": pa.array(np.where(error, "http_500", None)),
    })


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--gaps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    console = Console()
    rng = np.random.default_rng(0)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp, Progress(console=console, transient=True) as progress:
        store = Store(Path(tmp) / "bench.duckdb")
        # an earlier run in the file, so the summary has to pick its run out of more than one
        old = store.start_run(label="earlier")
        with BatchedWriter(store, old) as w:
            w.add_requests(synthetic_batch(rng, 0, 100_000, args.gaps, t0 - 3600))
        store.finish_run(old)

        batches = []
        task = progress.add_task("generating", total=args.rows)
        for start in range(0, args.rows, BATCH):
            batches.append(synthetic_batch(rng, start, min(BATCH, args.rows - start), args.gaps, t0))
            progress.advance(task, batches[-1].num_rows)

        run_id = store.start_run(label="bench", target="synthetic", profile="10k-rps")
        task = progress.add_task("ingesting", total=args.rows)
        load_before = os.getloadavg()[0]
        started, cpu_started = time.perf_counter(), time.process_time()
        w = BatchedWriter(store, run_id)
        for b in batches:
            w.add_requests(b)
            progress.advance(task, b.num_rows)
        w.close()
        ingest_s, ingest_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
        store.finish_run(run_id)
        del batches

        rows_per_s = args.rows / ingest_s
        dict_rows = 200_000
        dict_batch = synthetic_batch(rng, 0, dict_rows, args.gaps, t0).to_pylist()
        side = store.start_run(label="dict rows")
        started = time.perf_counter()
        with BatchedWriter(store, side) as w2:
            for row in dict_batch:
                w2.add_request(row)
        dict_rate = dict_rows / (time.perf_counter() - started)

        slo = Slo(ttft_s=0.5, tpot_s=0.03)
        query_ms, query_cpu_ms, open_query_ms = [], [], []
        with store.connect() as con:
            for _ in range(args.repeats):
                s, c = time.perf_counter(), time.process_time()
                summ = queries.summary(con, run_id, slo)
                query_ms.append((time.perf_counter() - s) * 1000)
                query_cpu_ms.append((time.process_time() - c) * 1000)
        for _ in range(args.repeats):
            s = time.perf_counter()
            with store.connect() as con:
                queries.summary(con, run_id, slo)
            open_query_ms.append((time.perf_counter() - s) * 1000)
        db_mib = (Path(tmp) / "bench.duckdb").stat().st_size / 2**20

    q = statistics.median(query_ms)
    console.print(f"rows: {args.rows:,} requests x {args.gaps} inter-token gaps; DB file {db_mib:,.0f} MiB")
    console.print(f"ingest (Arrow batches of {BATCH:,} via BatchedWriter, incl. final flush): "
                  f"{rows_per_s:,.0f} rows/s ({ingest_s:.2f} s)  goal >= 1,000,000: "
                  f"{'PASS' if rows_per_s >= 1e6 else 'FAIL'}")
    console.print(f"ingest CPU: {ingest_cpu_s:.2f} s over all threads = {args.rows / ingest_cpu_s:,.0f} rows per "
                  f"CPU-second; machine: {os.cpu_count()} cores, load average {load_before:.1f} when ingest began "
                  "(other processes share these cores)")
    console.print(f"ingest (one dict per add_request, {dict_rows:,} rows): {dict_rate:,.0f} rows/s")
    console.print(f"load average now {os.getloadavg()[0]:.1f}")
    console.print(f"summary query, median of {args.repeats}: {q:.0f} ms (min {min(query_ms):.0f}, "
                  f"max {max(query_ms):.0f}; CPU {statistics.median(query_cpu_ms):.0f} ms over all threads); "
                  f"with connection open/close: {statistics.median(open_query_ms):.0f} ms"
                  f"  goal < 500 ms: {'PASS' if q < 500 else 'FAIL'}")
    console.print(f"summary check: measured={summ['measured']:,} ok={summ['ok']:,} "
                  f"ttft_p50={summ['ttft_p50']:.3f}s itl_p99={summ['itl_p99']:.4f}s "
                  f"slo_attainment={summ['slo_attainment']:.3f}")


if __name__ == "__main__":
    main()
