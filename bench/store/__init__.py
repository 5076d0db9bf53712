"""What we measured: one DuckDB file of runs, requests, GPU and server samples, integrity events and drift.

db         the Store: migrations on open, run lifecycle, short connections that wait out another writer
schema     the tables (migrations, frozen once released) and the Arrow schemas the writer appends
histogram  log-linear latency buckets: percentiles within 0.4 % without scanning every request
writer     the batched background writer: Arrow batches, one short transaction a second; imported runs
recorder   the writer and the samplers in a process of their own, fed through a pipe
telemetry  NVML GPU samples and SGLang's /metrics and /server_info
nodes      the GPU nodes' DCGM exporter (Prometheus) samples, per node and GPU
repeats    a repeat group's runs and the 90 % interval of each figure across them
queries    a run in numbers (goodput under an SLO), time series, runs side by side
identity   a run in one line (and as table columns): deployment, load, when, twin or measured
runinfo    a run's deployment, latency distributions, KV integrity, quality drift
export     one run's rows as Parquet or CSV
"""

from bench.store import identity, nodes, queries, repeats, runinfo, telemetry
from bench.store.db import DEFAULT_DB, Store, StoreBusy, pid_alive
from bench.store.export import export_run, replacing
from bench.store.histogram import HIST_METRICS, bucket_value, to_buckets
from bench.store.recorder import HELD_DB_WAIT_S, Recorder
from bench.store.schema import MIGRATIONS, SCHEMA_VERSION
from bench.store.telemetry import GpuSampler, ServerSampler
from bench.store.writer import BatchedWriter, write_imported_runs

__all__ = [
    "identity", "nodes", "queries", "repeats", "runinfo", "telemetry",
    "DEFAULT_DB", "Store", "StoreBusy", "export_run", "HIST_METRICS",
    "bucket_value", "to_buckets", "Recorder", "HELD_DB_WAIT_S", "MIGRATIONS", "SCHEMA_VERSION", "GpuSampler",
    "ServerSampler", "BatchedWriter", "replacing", "pid_alive", "write_imported_runs",
]
