"""The batched writer: callers append rows from any thread; a background thread writes them to the store as Arrow
batches, one short transaction per flush, at least once a second and once more at close(). A crash loses at most
the rows added since the last flush."""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from bench import __version__
from bench.store.db import Store, StoreBusy, _compact, _redact, new_run_id
from bench.store.histogram import to_buckets
from bench.store.schema import GPU_SCHEMA, INTEGRITY_SCHEMA, REQUESTS_SCHEMA, SERVER_SCHEMA, STATS_FROM_BATCH

log = logging.getLogger(__name__)

_TABLES = {"requests": REQUESTS_SCHEMA, "gpu_samples": GPU_SCHEMA, "server_samples": SERVER_SCHEMA,
           "integrity_events": INTEGRITY_SCHEMA}
_HIST_SCHEMA = pa.schema([("run_id", pa.string()), ("metric", pa.string()), ("bucket", pa.int32()),
                          ("n", pa.int64())])


class BatchedWriter:
    def __init__(self, store: Store, run_id: str, flush_interval_s: float = 1.0, close_timeout_s: float = 60.0):
        store.run(run_id)  # an unknown run id fails here, not a second later in the writer thread
        self.store = store
        self.run_id = run_id
        self.flush_interval_s = flush_interval_s
        self.close_timeout_s = close_timeout_s
        self.rows_written = dict.fromkeys(_TABLES, 0)
        self.flushes = 0
        self.busy_flushes = 0  # flushes put off because another process held the file
        self.error: str | None = None  # the last flush's failure other than a held file (disk full, file gone)
        self._rows: dict[str, list[dict]] = {name: [] for name in _TABLES}
        self._batches: list[tuple[pa.Table, pa.Table]] = []  # (requests, histogram) from add_requests
        self._lock = threading.Lock()  # guards the buffers
        self._flush_lock = threading.Lock()  # one flush at a time
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"capbench-writer-{run_id}", daemon=True)
        self._thread.start()
        atexit.register(self.close)  # an interpreter that exits without close() still writes its last rows

    # ---- appending (any thread) ----------------------------------------------------------------------------------
    def add_request(self, row: dict) -> None:
        self._add("requests", row)

    def add_gpu_sample(self, row: dict) -> None:
        self._add("gpu_samples", row)

    def add_server_sample(self, row: dict) -> None:
        self._add("server_samples", row)

    def add_integrity_event(self, row: dict) -> None:
        self._add("integrity_events", row)

    def add_requests(self, batch: pa.Table | pd.DataFrame | dict) -> None:
        """A whole batch of requests at once (Arrow table, DataFrame or dict of columns): the fast path."""
        if isinstance(batch, pd.DataFrame):
            batch = pa.Table.from_pandas(batch, preserve_index=False)
        elif isinstance(batch, dict):
            batch = pa.table(batch)
        unknown = set(batch.column_names) - set(REQUESTS_SCHEMA.names)
        if unknown:
            raise ValueError(f"unknown request column(s): {', '.join(sorted(unknown))}")
        # Converted and binned here, in the caller's thread: a column of the wrong type fails here, not later,
        # and the writer thread's insert of the previous batch runs meanwhile.
        batch = _derive(_conform(batch, REQUESTS_SCHEMA, self.run_id))
        hist = _histograms(self.run_id, batch)
        with self._lock:
            self._check_open()
            self._batches.append((batch, hist))

    def _add(self, table: str, row: dict) -> None:
        unknown = row.keys() - _TABLES[table].names
        if unknown:
            raise ValueError(f"unknown {table} column(s): {', '.join(sorted(unknown))}")
        with self._lock:
            self._check_open()
            self._rows[table].append(row)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"writer for run {self.run_id} is closed")

    # ---- flushing ------------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            try:
                self.flush(lock_timeout_s=min(0.5, self.flush_interval_s))
            except StoreBusy:
                self.busy_flushes += 1
                log.info("results DB busy; %s rows wait for the next flush", self.pending())
            except Exception as e:  # a writer thread must not die silently and lose every later row
                self.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                log.error("flush failed (%s); rows kept for the next try", self.error)

    def pending(self) -> int:
        with self._lock:
            return sum(len(r) for r in self._rows.values()) + sum(b.num_rows for b, _ in self._batches)

    def flush(self, lock_timeout_s: float | None = None) -> int:
        """Write everything buffered now; returns rows written. On StoreBusy the rows stay buffered."""
        with self._flush_lock:
            with self._lock:
                rows, self._rows = self._rows, {name: [] for name in _TABLES}
                batches, self._batches = self._batches, []
            try:
                tables = self._to_arrow(rows, batches)
                if not tables:
                    return 0
                with self.store.connect(timeout_s=lock_timeout_s) as con:
                    con.execute("BEGIN")
                    for name, table in tables.items():
                        if table is None or table.num_rows == 0:
                            continue
                        con.register("capbench_batch", table)
                        con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM capbench_batch")
                        if name == "requests":
                            con.execute(STATS_FROM_BATCH)
                        con.unregister("capbench_batch")
                    con.execute("COMMIT")
            except BaseException:
                with self._lock:  # put the rows back in front of anything added meanwhile
                    for name in _TABLES:
                        self._rows[name][:0] = rows[name]
                    self._batches[:0] = batches
                raise
            self.flushes += 1
            tables.pop("latency_hist", None)
            for name, table in tables.items():
                self.rows_written[name] += table.num_rows
            return sum(t.num_rows for t in tables.values())

    def _to_arrow(self, rows: dict[str, list[dict]], batches: list[tuple[pa.Table, pa.Table]]) -> dict[str, pa.Table]:
        """Everything to insert, by table; latency_hist last."""
        tables = {}
        for name, schema in _TABLES.items():
            if rows[name]:
                tables[name] = _rows_to_table(name, rows[name], schema, self.run_id)
        requests, hists = [b for b, _ in batches], [h for _, h in batches]
        if "requests" in tables:
            tables["requests"] = _derive(tables["requests"])
            hists.append(_histograms(self.run_id, tables["requests"]))
        requests = ([tables["requests"]] if "requests" in tables else []) + requests
        if requests:
            tables["requests"] = pa.concat_tables(requests)
            tables["latency_hist"] = pa.concat_tables(hists)
        return tables

    def close(self) -> None:
        """Stop the thread and write what is left; waits up to close_timeout_s for a locked file."""
        if self._closed:
            return
        self._stop.set()
        self._thread.join()
        deadline = time.monotonic() + self.close_timeout_s
        while True:
            try:
                self.flush(lock_timeout_s=max(0.1, deadline - time.monotonic()))
                break
            except StoreBusy:
                if time.monotonic() >= deadline:
                    raise
        with self._lock:
            self._closed = True
        atexit.unregister(self.close)

    def __enter__(self) -> BatchedWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _rows_to_table(name: str, rows: list[dict], schema: pa.Schema, run_id: str) -> pa.Table:
    for r in rows:
        r.setdefault("run_id", run_id)
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        # One bad value must not take its row, nor the batch, with it: it is stored as NULL, with a note if the
        # table has a column for one.
        return pa.Table.from_pylist([_fit(name, r, schema) for r in rows], schema=schema)


def _fit(name: str, row: dict, schema: pa.Schema) -> dict:
    """The row with every value that does not fit its column's type set to NULL (and said so in `note`)."""
    fitted, notes = {}, []
    for key, value in row.items():
        if key not in schema.names or value is None:
            fitted[key] = value
            continue
        try:
            pa.array([value], schema.field(key).type)
            fitted[key] = value
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            fitted[key] = None
            notes.append(f"{key} {str(value)[:40]!r} does not fit {schema.field(key).type}: stored as NULL")
            log.warning("%s row: %s does not fit its column (%s); stored as NULL", name, key, str(e)[:100])
    if notes and "note" in schema.names:
        fitted["note"] = "; ".join(filter(None, [fitted.get("note"), *notes]))[:1000]
    return fitted


def _conform(batch: pa.Table, schema: pa.Schema, run_id: str) -> pa.Table:
    """Columns in schema order and types; missing ones null; run_id filled in."""
    n = batch.num_rows
    cols = []
    for field in schema:
        if field.name in batch.column_names:
            cols.append(batch.column(field.name).cast(field.type))
        elif field.name == "run_id":
            cols.append(pa.array([run_id] * n, pa.string()))
        else:
            cols.append(pa.nulls(n, field.type))
    return pa.Table.from_arrays(cols, schema=schema)


def _derive(t: pa.Table) -> pa.Table:
    """Fill what the timestamps already say: latencies count from when the request was due (scheduled_at)."""
    due = pc.coalesce(t["scheduled_at"], t["sent_at"])
    first, done = t["first_token_at"], t["finished_at"]
    decode_tokens = pc.subtract(pc.cast(t["completion_tokens"], pa.float64()), 1.0)
    tpot = pc.if_else(pc.greater(decode_tokens, 0.0), pc.divide(pc.subtract(done, first), decode_tokens), None)
    status = pc.coalesce(t["status"], pc.if_else(pc.is_null(t["error"]), "ok", "error"))
    derived = {
        "dispatch_lag_s": pc.coalesce(t["dispatch_lag_s"], pc.subtract(t["sent_at"], t["scheduled_at"])),
        "ttft_s": pc.coalesce(t["ttft_s"], pc.subtract(first, due)),
        "e2e_s": pc.coalesce(t["e2e_s"], pc.subtract(done, due)),
        "tpot_s": pc.coalesce(t["tpot_s"], tpot),
        "phase": pc.coalesce(t["phase"], "measured"),
        "status": status,
    }
    for name, col in derived.items():
        t = t.set_column(t.schema.get_field_index(name), name, col)
    return t


def _histograms(run_id: str, requests: pa.Table) -> pa.Table:
    """Bucket counts of the batch's measured, successful requests (dispatch lag: all measured ones)."""
    measured = pc.equal(requests["phase"], "measured").to_numpy(zero_copy_only=False)
    ok = measured & pc.equal(requests["status"], "ok").to_numpy(zero_copy_only=False)
    itl = requests["itl_s"].combine_chunks() if requests.num_rows else pa.array([], REQUESTS_SCHEMA.field("itl_s").type)
    gaps = pc.list_flatten(itl).to_numpy(zero_copy_only=False)
    if not ok.all():
        gaps = gaps[ok[pc.list_parent_indices(itl).to_numpy(zero_copy_only=False)]]

    def col(name: str) -> np.ndarray:
        return requests[name].to_numpy(zero_copy_only=False).astype(np.float64, copy=False)

    values = {"ttft": col("ttft_s")[ok], "tpot": col("tpot_s")[ok], "e2e": col("e2e_s")[ok],
              "itl": gaps, "dispatch_lag": col("dispatch_lag_s")[measured]}
    metrics, buckets, counts = [], [], []
    for metric, v in values.items():
        b, n = to_buckets(v)
        metrics += [metric] * len(b)
        buckets.append(b)
        counts.append(n)
    return pa.table({
        "run_id": pa.array([run_id] * len(metrics), pa.string()),
        "metric": pa.array(metrics, pa.string()),
        "bucket": pa.array(np.concatenate(buckets).astype(np.int32)),
        "n": pa.array(np.concatenate(counts).astype(np.int64)),
    }, schema=_HIST_SCHEMA)


def write_imported_runs(store: Store, runs: list[dict]) -> list[tuple[str, bool]]:
    """Finished runs made by another tool (capbench import), each with all its requests, in ONE transaction: if any
    part fails nothing of any of them is stored. Each dict: label, target, profile, config (its import.record_sha256
    the record's digest), started_at, finished_at, requests (columns of the requests table; empty where the file
    holds only a summary) and summary ((metric, stat, value, unit) rows of run_summaries, or none). A record already
    imported (the same digest) is left alone. Returns (run id, True if stored now / False if it was there)."""
    out: list[tuple[str, bool]] = []
    with store.connect() as con:
        con.execute("BEGIN")
        try:
            for run in runs:
                digest = run["config"]["import"]["record_sha256"]
                had = con.execute("SELECT run_id FROM runs WHERE json_extract_string(config, '$.import.record_sha256')"
                                  " = ?", [digest]).fetchone()
                if had:
                    out.append((had[0], False))
                    continue
                run_id = new_run_id()
                while con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchone():
                    run_id = new_run_id()  # several runs of one file within a second
                con.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, 'completed', ?, ?, NULL)",
                            [run_id, run["label"], run["target"], run["profile"],
                             json.dumps(_redact(run["config"]), sort_keys=True, default=str), run["started_at"],
                             run["finished_at"], __version__, os.getpid()])
                if run.get("summary"):
                    con.executemany("INSERT INTO run_summaries VALUES (?, ?, ?, ?, ?)",
                                    [[run_id, *row] for row in run["summary"]])
                if run["requests"]:
                    batch = _derive(_conform(pa.table(run["requests"]), REQUESTS_SCHEMA, run_id))
                    for name, table in (("requests", batch), ("latency_hist", _histograms(run_id, batch))):
                        con.register("capbench_batch", table)
                        con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM capbench_batch")
                        if name == "requests":
                            con.execute(STATS_FROM_BATCH)
                        con.unregister("capbench_batch")
                    _compact(con, run_id)
                out.append((run_id, True))
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
    return out
