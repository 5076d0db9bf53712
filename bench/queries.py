"""What the dashboard and the reports ask of the store: a run's summary, its time series, runs side by side.

Every function takes an open connection (`with store.connect() as con:`) and binds values as parameters.
Statistics cover the measured phase only; latency percentiles cover its successful requests only.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import pandas as pd

from bench.errors import BadInput
from bench.store import HIST_METRICS, bucket_value

QUANTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class SLO:
    """A request meets the SLO when it succeeded and every bound that is set holds."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


def _run_row(con: duckdb.DuckDBPyConnection, run_id: str) -> dict:
    cur = con.execute("SELECT run_id, label, target, profile, status, started_at, finished_at FROM runs "
                      "WHERE run_id = ?", [run_id])
    rows = cur.fetchall()
    if not rows:
        raise BadInput(f"unknown run id {run_id!r} (see `capbench runs`)")
    return dict(zip([d[0] for d in cur.description], rows[0], strict=True))


def percentiles(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, float | None]:
    """{ttft_p50: ..., itl_p99: ...} from the run's latency histograms (within 0.4 % of exact)."""
    hist = con.execute("SELECT metric, bucket, sum(n) AS n FROM latency_hist WHERE run_id = ? "
                       "GROUP BY metric, bucket ORDER BY metric, bucket", [run_id]).df()
    out: dict[str, float | None] = {}
    for metric in HIST_METRICS:
        h = hist[hist.metric == metric]
        cum = np.cumsum(h.n.to_numpy())
        for q in QUANTILES:
            if len(cum) == 0:
                out[f"{metric}_p{q}"] = None
                continue
            # nearest rank: the smallest value with at least q % of the requests at or below it
            i = int(np.searchsorted(cum, q / 100 * cum[-1], side="left"))
            out[f"{metric}_p{q}"] = float(bucket_value(h.bucket.iloc[min(i, len(cum) - 1)]))
    return out


def summary(con: duckdb.DuckDBPyConnection, run_id: str, slo: SLO | None = None) -> dict:
    """One run in numbers: counts, success rate, rates, tokens/s, latency percentiles, goodput under `slo`.

    duration_s spans the first due time to the last finish; achieved_rate_rps is the rate requests were sent at
    (compare it with the target rate); throughput and goodput count requests finished per second of duration_s.
    """
    out = _run_row(con, run_id)
    slo = slo or SLO()
    row = con.execute("""
        SELECT count(*) AS requests,
               count(*) FILTER (WHERE phase = 'warmup') AS warmup,
               count(*) FILTER (WHERE phase = 'measured') AS measured,
               count(*) FILTER (WHERE phase = 'measured' AND status = 'ok') AS ok,
               count(*) FILTER (WHERE phase = 'measured' AND status <> 'ok') AS errors,
               min(scheduled_at) FILTER (WHERE phase = 'measured') AS first_due,
               min(sent_at) FILTER (WHERE phase = 'measured') AS first_sent,
               max(sent_at) FILTER (WHERE phase = 'measured') AS last_sent,
               max(finished_at) FILTER (WHERE phase = 'measured') AS last_finished,
               sum(prompt_tokens) FILTER (WHERE phase = 'measured' AND status = 'ok') AS input_tokens,
               sum(completion_tokens) FILTER (WHERE phase = 'measured' AND status = 'ok') AS output_tokens,
               avg(dispatch_lag_s) FILTER (WHERE phase = 'measured') AS dispatch_lag_mean,
               max(dispatch_lag_s) FILTER (WHERE phase = 'measured') AS dispatch_lag_max,
               count(*) FILTER (WHERE phase = 'measured' AND status = 'ok'
                                AND ($1::DOUBLE IS NULL OR ttft_s <= $1)
                                AND ($2::DOUBLE IS NULL OR tpot_s IS NULL OR tpot_s <= $2)
                                AND ($3::DOUBLE IS NULL OR e2e_s <= $3)) AS good
        FROM requests WHERE run_id = $4""", [slo.ttft_s, slo.tpot_s, slo.e2e_s, run_id]).fetchall()[0]
    names = ["requests", "warmup", "measured", "ok", "errors", "first_due", "first_sent", "last_sent",
             "last_finished", "input_tokens", "output_tokens", "dispatch_lag_mean", "dispatch_lag_max", "good"]
    r = dict(zip(names, row, strict=True))
    start = r["first_due"] if r["first_due"] is not None else r["first_sent"]
    duration = (r["last_finished"] - start) if start is not None and r["last_finished"] is not None else None
    send_span = (r["last_sent"] - r["first_sent"]) if r["first_sent"] is not None else None

    def per_s(x: float | None, span: float | None) -> float | None:
        return None if x is None or not span or span <= 0 else x / span

    out.update({
        "requests": r["requests"], "warmup": r["warmup"], "measured": r["measured"], "ok": r["ok"],
        "errors": r["errors"], "success_rate": r["ok"] / r["measured"] if r["measured"] else None,
        "duration_s": duration,
        "achieved_rate_rps": per_s(r["measured"], send_span),
        "throughput_rps": per_s(r["ok"], duration),
        "input_tps": per_s(r["input_tokens"], duration), "output_tps": per_s(r["output_tokens"], duration),
        "input_tokens": r["input_tokens"], "output_tokens": r["output_tokens"],
        "dispatch_lag_mean": r["dispatch_lag_mean"], "dispatch_lag_max": r["dispatch_lag_max"],
        "slo_ttft_s": slo.ttft_s, "slo_tpot_s": slo.tpot_s, "slo_e2e_s": slo.e2e_s,
        "slo_attainment": r["good"] / r["measured"] if r["measured"] else None,
        "goodput_rps": per_s(r["good"], duration),
    })
    out.update(percentiles(con, run_id))
    out["errors_by_kind"] = dict(con.execute(
        "SELECT coalesce(error_kind, 'unknown'), count(*) FROM requests "
        "WHERE run_id = ? AND phase = 'measured' AND status <> 'ok' GROUP BY 1 ORDER BY 2 DESC", [run_id]
    ).fetchall())
    return out


def _check_resolution(resolution_s: float) -> None:
    if not resolution_s > 0:
        raise BadInput(f"resolution must be a positive number of seconds, not {resolution_s}")


def series(con: duckdb.DuckDBPyConnection, run_id: str, resolution_s: float = 1.0) -> pd.DataFrame:
    """Requests per time slot (by finish time): t (slot start, epoch s), elapsed_s (since the run started),
    completed, errors, rps, output_tps, ttft/tpot/e2e p50 and p99 of that slot's successful requests."""
    _check_resolution(resolution_s)
    t0 = _run_row(con, run_id)["started_at"]
    return con.execute("""
        SELECT $1 + slot * $2 AS t, slot * $2 AS elapsed_s, count(*) AS completed,
               count(*) FILTER (WHERE status <> 'ok') AS errors, count(*) / $2 AS rps,
               coalesce(sum(completion_tokens) FILTER (WHERE status = 'ok'), 0) / $2 AS output_tps,
               quantile_cont(ttft_s, 0.5) FILTER (WHERE status = 'ok') AS ttft_p50,
               quantile_cont(ttft_s, 0.99) FILTER (WHERE status = 'ok') AS ttft_p99,
               quantile_cont(tpot_s, 0.5) FILTER (WHERE status = 'ok') AS tpot_p50,
               quantile_cont(tpot_s, 0.99) FILTER (WHERE status = 'ok') AS tpot_p99,
               quantile_cont(e2e_s, 0.5) FILTER (WHERE status = 'ok') AS e2e_p50,
               quantile_cont(e2e_s, 0.99) FILTER (WHERE status = 'ok') AS e2e_p99
        FROM (SELECT *, floor((finished_at - $1) / $2) AS slot FROM requests
              WHERE run_id = $3 AND phase = 'measured' AND finished_at IS NOT NULL)
        GROUP BY slot ORDER BY slot""", [t0, resolution_s, run_id]).df()


def gpu_series(con: duckdb.DuckDBPyConnection, run_id: str, resolution_s: float = 1.0) -> pd.DataFrame:
    """GPU samples averaged per slot and GPU."""
    _check_resolution(resolution_s)
    t0 = _run_row(con, run_id)["started_at"]
    return con.execute("""
        SELECT $1 + slot * $2 AS t, slot * $2 AS elapsed_s, gpu, any_value(name) AS name,
               avg(mem_used_mib) AS mem_used_mib, max(mem_total_mib) AS mem_total_mib,
               avg(gpu_util_pct) AS gpu_util_pct, avg(mem_util_pct) AS mem_util_pct, avg(power_w) AS power_w,
               avg(sm_clock_mhz) AS sm_clock_mhz, avg(mem_clock_mhz) AS mem_clock_mhz, max(temp_c) AS temp_c
        FROM (SELECT *, floor((t - $1) / $2) AS slot FROM gpu_samples WHERE run_id = $3)
        GROUP BY slot, gpu ORDER BY slot, gpu""", [t0, resolution_s, run_id]).df()


def server_series(con: duckdb.DuckDBPyConnection, run_id: str, metric: str,
                  resolution_s: float = 1.0) -> pd.DataFrame:
    """One server metric (e.g. 'sglang:num_running_reqs') averaged per slot and label set."""
    _check_resolution(resolution_s)
    t0 = _run_row(con, run_id)["started_at"]
    return con.execute("""
        SELECT $1 + slot * $2 AS t, slot * $2 AS elapsed_s, labels, avg(value) AS value, max(value) AS max
        FROM (SELECT *, floor((t - $1) / $2) AS slot FROM server_samples WHERE run_id = $3 AND metric = $4)
        GROUP BY slot, labels ORDER BY slot, labels""", [t0, resolution_s, run_id, metric]).df()


COMPARED = ("measured", "success_rate", "achieved_rate_rps", "throughput_rps", "goodput_rps", "slo_attainment",
            "input_tps", "output_tps", *(f"{m}_p{q}" for m in ("ttft", "tpot", "itl", "e2e") for q in QUANTILES),
            "dispatch_lag_max")


def compare(con: duckdb.DuckDBPyConnection, run_ids: list[str], slo: SLO | None = None) -> pd.DataFrame:
    """Runs side by side: one row per metric, one column per run, and `<run> / <first run>` ratio columns."""
    if len(run_ids) < 2:
        raise BadInput("compare needs at least two run ids")
    sums = [summary(con, r, slo) for r in run_ids]
    table = pd.DataFrame({s["run_id"]: [s[m] for m in COMPARED] for s in sums}, index=list(COMPARED), dtype=float)
    base = run_ids[0]
    for r in run_ids[1:]:
        with np.errstate(divide="ignore", invalid="ignore"):
            table[f"{r} / {base}"] = table[r] / table[base].where(table[base] != 0)
    return table


def runs_table(runs: pd.DataFrame):
    """`capbench runs` as a rich table: newest first, times in UTC."""
    from datetime import UTC, datetime

    from rich import box
    from rich.table import Column, Table

    def when(t: float | None) -> str:
        return "" if t is None or pd.isna(t) else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")

    table = Table(Column("run id", no_wrap=True, min_width=22), Column("label", ratio=1),
                  Column("status", no_wrap=True),
                  Column("started (UTC)", no_wrap=True), Column("duration", justify="right", no_wrap=True),
                  Column("requests", justify="right", no_wrap=True), Column("errors", justify="right", no_wrap=True),
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for r in runs.itertuples():
        duration = "" if pd.isna(r.finished_at) else f"{r.finished_at - r.started_at:,.0f} s"
        table.add_row(r.run_id, r.label or "", r.status, when(r.started_at), duration, f"{r.requests:,}",
                      f"{r.errors:,}")
    return table
