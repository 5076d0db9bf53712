"""The results store: one DuckDB file that holds every run, request, GPU sample, server sample and
integrity event capbench records.

Clock: every timestamp in every table (requests' scheduled_at/sent_at/first_token_at/finished_at,
samples' t, runs' started_at/finished_at, integrity events' t) is wall-clock epoch seconds from
`time.time()`, as a DOUBLE. The load generator, the twin and the samplers all read that one clock, so their
rows line up on one time axis. Durations (ttft_s, e2e_s, ...) are seconds and may come from
`time.perf_counter()` deltas. Latencies count from when a request was due (scheduled_at), so a client that falls
behind shows up as latency, not as a lower rate (coordinated omission); dispatch_lag_s = sent_at - scheduled_at
says by how much. A closed-loop user sets scheduled_at = sent_at.

Concurrency: DuckDB lets one process write a file, and no other process open it while it does. So nobody
holds the file open: the batched writer opens it read-write for one short transaction per flush (about once a
second) and closes it; readers (the dashboard, `capbench runs`) open it read-only for one query or page and close
it. Whoever finds it locked retries with a short back-off (`connect()`); a writer that cannot get in keeps its
rows and tries again at the next flush. Within one process, open a single Store mode (DuckDB refuses read-only and
read-write connections to one file side by side in one process).

Summaries: with each flush the writer also appends counts and sums per (phase, status, error_kind) to
`request_stats`, and folds measured, successful requests into log-linear latency histograms (`latency_hist`, 128
buckets per power of two, so a percentile is within 0.4 % of the exact one). The summary reads those, plus one
scan of three latency columns for goodput, which keeps it fast on tens of millions of requests with every
inter-token gap stored. So rows go in through the writer (bench/store/writer.py), not by hand.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa

from bench import __version__
from bench.errors import BadInput
from bench.store.histogram import bucket_value
from bench.store.schema import INTEGRITY_SCHEMA, MIGRATIONS, SCHEMA_VERSION

log = logging.getLogger(__name__)

DEFAULT_DB = Path("data/capbench.duckdb")
WAIT_NOTICE_S = 5.0  # a writer kept out of the file says so this often
RUN_STATUSES = ("running", "completed", "aborted", "failed")

_SECRET_KEYS = {"api_key", "apikey", "authorization", "password", "secret", "token", "hf_token",
                "openai_api_key", "access_token"}


def _redact(obj: object) -> object:
    """API keys belong in env vars, never in the DB: blank any config value under a secret-looking key."""
    if isinstance(obj, dict):
        return {k: "***" if str(k).lower() in _SECRET_KEYS else _redact(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_redact(v) for v in obj]
    return obj


def pid_alive(pid: int | None) -> bool:
    """Whether a process of this host has this pid (one owned by another user counts as alive)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def new_run_id() -> str:
    """Sortable by start time, unique by a random tail: 20261130-235501-3f9a1c."""
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def _holder(e: Exception) -> str:
    """Who holds the file, from DuckDB's lock message ("... held in /usr/bin/python (PID 123)")."""
    text = str(e).splitlines()[0]
    return text[text.find("held in"):].split(". See")[0] if "held in" in text else "locked"


class StoreBusy(RuntimeError):
    """The DB stayed locked by another process past the timeout."""


class Store:
    """A capbench DuckDB file. Opening it read-write creates it, migrates it to SCHEMA_VERSION, and marks runs
    whose writer process on this host has died as aborted. Every method opens and closes its own connection."""

    def __init__(self, path: str | Path = DEFAULT_DB, read_only: bool = False, lock_timeout_s: float = 10.0,
                 recording: str | None = None):
        """recording: the run this process records (its recorder): never marked aborted here, even when its load
        generator has died, since the recorder still writes its rows and then marks it aborted itself."""
        self.path = Path(path)
        self.read_only = read_only
        self.lock_timeout_s = lock_timeout_s
        if read_only:
            if not self.path.is_file():
                raise BadInput(f"no results database at {self.path} (pass --db PATH)")
            with self.connect() as con:
                version = _schema_version(con)
            if version < SCHEMA_VERSION:
                raise BadInput(f"{self.path} has schema version {version}; open it read-write once to migrate it")
            if version > SCHEMA_VERSION:
                raise BadInput(f"{self.path} has schema version {version}, newer than this capbench "
                               f"({SCHEMA_VERSION}); upgrade capbench")
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.connect() as con:
                migrate(con, self.path)
                self.aborted_on_open = _abort_dead_runs(con, spare=recording)

    @contextmanager
    def connect(self, timeout_s: float | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short-lived connection; waits (with back-off) while another process holds the file."""
        start = time.monotonic()
        deadline = start + (self.lock_timeout_s if timeout_s is None else timeout_s)
        delay, told = 0.01, start
        while True:
            try:
                con = duckdb.connect(str(self.path), read_only=self.read_only)
                break
            except duckdb.IOException as e:
                if "conflicting lock" not in str(e).lower() and "could not set lock" not in str(e).lower():
                    raise BadInput(f"cannot open {self.path}: {str(e).splitlines()[0]}") from None
                if time.monotonic() + delay > deadline:
                    raise StoreBusy(f"{self.path} stayed locked by another process") from None
                if time.monotonic() - told >= WAIT_NOTICE_S:
                    told = time.monotonic()
                    log.warning("waiting for another process to release %s (%.0f s so far): %s", self.path,
                                told - start, _holder(e))
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
            except duckdb.Error as e:  # a truncated or foreign file
                raise BadInput(f"cannot open {self.path}: {str(e).splitlines()[0]}") from None
        try:
            yield con
        except (duckdb.IOException, duckdb.SerializationException) as e:  # a damaged file, found mid-query
            raise BadInput(f"cannot open {self.path}: {str(e).splitlines()[0]}") from None
        finally:
            con.close()

    # ---- run lifecycle -------------------------------------------------------------------------------------------
    def start_run(self, label: str = "", target: str = "", profile: str = "", config: dict | None = None) -> str:
        run_id = new_run_id()
        with self.connect() as con:
            con.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, NULL, 'running', ?, ?, ?)",
                [run_id, label, target, profile, json.dumps(_redact(config or {}), sort_keys=True, default=str),
                 time.time(), __version__, os.getpid(), socket.gethostname()],
            )
        return run_id

    def finish_run(self, run_id: str, status: str = "completed") -> None:
        if status not in RUN_STATUSES[1:]:
            raise BadInput(f"run status must be one of {', '.join(RUN_STATUSES[1:])}, not {status!r}")
        with self.connect() as con:
            require_run(con, run_id)
            con.execute("BEGIN")
            con.execute("UPDATE runs SET status = ?, finished_at = ? WHERE run_id = ?", [status, time.time(), run_id])
            _compact(con, run_id)
            con.execute("COMMIT")

    def runs(self) -> pd.DataFrame:
        """All runs, newest first, with their request counts, throughput (successful measured requests per second)
        and TTFT p99 (seconds, from the latency histograms; a summary-only import's: the tool's own figures, errors
        NULL where the tool counted successes only)."""
        with self.connect() as con:
            runs = con.execute("""
                WITH t AS (SELECT run_id, bucket, sum(n) AS n FROM latency_hist WHERE metric = 'ttft' GROUP BY ALL),
                c AS (SELECT run_id, bucket, sum(n) OVER (PARTITION BY run_id ORDER BY bucket) AS cum,
                             sum(n) OVER (PARTITION BY run_id) AS total FROM t)
                SELECT r.run_id, r.label, r.target, r.profile, r.status, r.started_at, r.finished_at,
                       coalesce(q.n, s.n, 0) AS requests,
                       CASE WHEN q.n IS NULL AND s.n IS NOT NULL THEN s.errors ELSE coalesce(q.errors, 0) END AS errors,
                       r.capbench_version, r.config, coalesce(q.ok / nullif(q.span, 0), s.rps) AS throughput_rps,
                       h.bucket AS ttft_p99_bucket, s.ttft_p99
                FROM runs r LEFT JOIN (
                    SELECT run_id, sum(n)::BIGINT AS n, (sum(n) FILTER (WHERE status <> 'ok'))::BIGINT AS errors,
                           sum(n) FILTER (WHERE phase = 'measured' AND status = 'ok') AS ok,
                           max(last_finished) FILTER (WHERE phase = 'measured')
                           - min(first_due) FILTER (WHERE phase = 'measured') AS span
                    FROM request_stats GROUP BY run_id) q USING (run_id)
                LEFT JOIN (
                    SELECT run_id, (sum(value) FILTER (WHERE metric = 'requests'))::BIGINT AS n,
                           (sum(value) FILTER (WHERE metric = 'requests' AND stat = 'errors'))::BIGINT AS errors,
                           any_value(value) FILTER (WHERE metric = 'throughput' AND stat = 'requests') AS rps,
                           any_value(value) FILTER (WHERE metric = 'ttft' AND stat = 'p99') AS ttft_p99
                    FROM run_summaries GROUP BY run_id) s USING (run_id)
                LEFT JOIN (SELECT run_id, min(bucket) AS bucket FROM c WHERE cum >= 0.99 * total GROUP BY run_id) h
                    USING (run_id)
                ORDER BY r.started_at DESC""").df()
        bucket = runs.pop("ttft_p99_bucket")
        hist = pd.Series(bucket_value(bucket.fillna(0).astype("int64").to_numpy()), index=runs.index)
        runs["ttft_p99_s"] = runs.pop("ttft_p99").fillna(hist.where(bucket.notna()))
        return runs

    def add_drift(self, rows: list[dict]) -> None:
        """Quality-drift rows (bench/drift.py rows_for_store): a few per prompt, written in one transaction."""
        cols = ("run_id", "target_a", "target_b", "prompt_id", "kind", "tokens_a", "tokens_b", "token_agreement",
                "first_divergence", "mean_kl", "exact_match", "tool_calls_match", "error")
        with self.connect() as con:
            con.executemany(f"INSERT INTO drift ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                            [[row[c] for c in cols] for row in rows])

    def add_rows(self, table: str, rows: list[dict]) -> None:
        """Rows of one of the eval tables (bench/eval), their keys its columns, in one transaction."""
        if table not in ("eval_answers", "eval_positions"):
            raise ValueError(f"add_rows writes the eval tables only, not {table!r}")
        if not rows:
            return
        cols = list(rows[0])
        with self.connect() as con:
            con.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                            [[row[c] for c in cols] for row in rows])

    def run(self, run_id: str) -> dict:
        with self.connect() as con:
            return require_run(con, run_id)

    def import_integrity_log(self, run_id: str, jsonl_path: str | Path) -> int:
        """Load the KV-checksum patch's JSON lines {t, kind, layer, page, detail}; returns rows imported.
        Lines that are not such objects are skipped and counted in the log."""
        path = Path(jsonl_path)
        if not path.is_file():
            raise BadInput(f"no integrity log at {path}")
        rows, bad = [], 0
        for line in path.read_text(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                e = json.loads(line)
                detail = e.get("detail")
                rows.append({"run_id": run_id, "t": float(e["t"]), "kind": str(e.get("kind", "")),
                             "layer": None if e.get("layer") is None else int(e["layer"]),
                             "page": None if e.get("page") is None else int(e["page"]),
                             "detail": detail if isinstance(detail, str) or detail is None else json.dumps(detail)})
            except (ValueError, KeyError, TypeError, AttributeError):
                bad += 1
        if bad:
            log.warning("%s: skipped %d malformed integrity line(s)", path, bad)
        table = pa.Table.from_pylist(rows, schema=INTEGRITY_SCHEMA)
        with self.connect() as con:
            require_run(con, run_id)
            con.register("capbench_batch", table)
            con.execute("INSERT INTO integrity_events BY NAME SELECT * FROM capbench_batch")
            con.unregister("capbench_batch")
        return len(rows)


def migrate(con: duckdb.DuckDBPyConnection, path: Path | str = "") -> int:
    """Bring the schema up to SCHEMA_VERSION in one transaction (a reader never sees half a schema, and a failed
    migration leaves the file as it was); returns the version."""
    con.execute("BEGIN")
    try:
        con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL, "
                    "applied_at DOUBLE NOT NULL, note VARCHAR)")
        version = _schema_version(con)
        if version > SCHEMA_VERSION:
            raise BadInput(f"{path} has schema version {version}, newer than this capbench ({SCHEMA_VERSION}); "
                           "upgrade capbench")
        for v, note, statements in MIGRATIONS:
            if v > version:
                for sql in statements:
                    con.execute(sql)
                con.execute("INSERT INTO schema_version VALUES (?, ?, ?)", [v, time.time(), note])
                version = v
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    return version


def _schema_version(con: duckdb.DuckDBPyConnection) -> int:
    exists = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version'"
                         ).fetchall()[0][0]
    if not exists:
        return 0
    return con.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchall()[0][0]


def _abort_dead_runs(con: duckdb.DuckDBPyConnection, spare: str | None = None) -> list[str]:
    """Runs left 'running' by a process on this host that no longer exists are marked aborted.
    (Runs written from another host are left alone: their process cannot be checked from here.)"""
    host = socket.gethostname()
    rows = con.execute("SELECT run_id, pid FROM runs WHERE status = 'running' AND hostname = ?", [host]).fetchall()
    dead = [run_id for run_id, pid in rows if run_id != spare and not pid_alive(pid)]
    for run_id in dead:
        con.execute("UPDATE runs SET status = 'aborted', finished_at = coalesce("
                    "(SELECT max(finished_at) FROM requests WHERE run_id = ?), started_at) WHERE run_id = ?",
                    [run_id, run_id])
        _compact(con, run_id)
        log.warning("run %s was left running by a process that died: marked aborted", run_id)
    return dead


def _compact(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """The writer appends one histogram and one stats slice per flush; fold them into one row per key."""
    con.execute("CREATE OR REPLACE TEMP TABLE hist_fold AS SELECT run_id, metric, bucket, sum(n)::BIGINT AS n "
                "FROM latency_hist WHERE run_id = ? GROUP BY ALL", [run_id])
    con.execute("DELETE FROM latency_hist WHERE run_id = ?", [run_id])
    con.execute("INSERT INTO latency_hist SELECT * FROM hist_fold")
    con.execute("DROP TABLE hist_fold")
    con.execute("""CREATE OR REPLACE TEMP TABLE stats_fold AS
        SELECT run_id, phase, status, error_kind, sum(n)::BIGINT, min(first_due), min(first_sent), max(last_sent),
               max(last_finished), sum(input_tokens)::BIGINT, sum(output_tokens)::BIGINT, sum(dispatch_lag_sum),
               sum(dispatch_lag_n)::BIGINT, max(dispatch_lag_max)
        FROM request_stats WHERE run_id = ? GROUP BY run_id, phase, status, error_kind""", [run_id])
    con.execute("DELETE FROM request_stats WHERE run_id = ?", [run_id])
    con.execute("INSERT INTO request_stats SELECT * FROM stats_fold")
    con.execute("DROP TABLE stats_fold")


def require_run(con: duckdb.DuckDBPyConnection, run_id: str) -> dict:
    cur = con.execute("SELECT * FROM runs WHERE run_id = ?", [run_id])
    rows = cur.fetchall()
    if not rows:
        raise BadInput(f"unknown run id {run_id!r} (see `capbench runs`)")
    return dict(zip([d[0] for d in cur.description], rows[0], strict=True))
