"""What the dashboard and the reports ask of the store: a run's summary, its time series, runs side by side.

Every function takes an open connection (`with store.connect() as con:`) and binds values as parameters.
Statistics cover the measured phase only; latency percentiles cover its successful requests only.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd

from bench.errors import BadInput
from bench.model import Slo
from bench.store.histogram import HIST_METRICS, bucket_value

QUANTILES = (50, 90, 95, 99)


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


def summary(con: duckdb.DuckDBPyConnection, run_id: str, slo: Slo | None = None) -> dict:
    """One run in numbers: counts, success rate, rates, tokens/s, latency percentiles, goodput under `slo`.

    duration_s spans the first due time to the last finish; achieved_rate_rps is the rate requests were sent at
    (compare it with the target rate); throughput and goodput count requests finished per second of duration_s.
    """
    out = _run_row(con, run_id)
    slo = slo or Slo()
    # counts and sums from the writer's per-flush stats (request_stats), not a scan of every request
    stats = con.execute("""
        SELECT phase, status, error_kind, sum(n), min(first_due), min(first_sent), max(last_sent), max(last_finished),
               sum(input_tokens), sum(output_tokens), sum(dispatch_lag_sum), sum(dispatch_lag_n), max(dispatch_lag_max)
        FROM request_stats WHERE run_id = ? GROUP BY phase, status, error_kind""", [run_id]).df()
    stats.columns = ["phase", "status", "error_kind", "n", "first_due", "first_sent", "last_sent", "last_finished",
                     "input_tokens", "output_tokens", "lag_sum", "lag_n", "lag_max"]
    measured = stats[stats.phase == "measured"]
    ok = measured[measured.status == "ok"]
    failed = measured[~measured.status.isin(["ok", "cancelled"])]
    n_measured, n_ok = int(measured.n.sum()), int(ok.n.sum())
    # cancelled on purpose by the client (--cancel): neither a success nor an error, out of the rates' denominators
    n_cancelled = int(measured[measured.status == "cancelled"].n.sum())
    answered = n_measured - n_cancelled

    def agg(frame: pd.DataFrame, col: str, how: str) -> float | None:
        v = getattr(frame[col], how)() if len(frame) else None
        return None if v is None or pd.isna(v) else float(v)

    # goodput: the one scan, over three latency columns (numeric filters first, text only for what passes)
    # behind a concurrency cap the user also waited for a slot: it counts, as in a campaign stage's judgement
    clauses = [(sql, v) for sql, v in (("ttft_s + coalesce(slot_wait_s, 0) <= ?", slo.ttft_s),
                                       ("(tpot_s IS NULL OR tpot_s <= ?)", slo.tpot_s),
                                       ("e2e_s + coalesce(slot_wait_s, 0) <= ?", slo.e2e_s)) if v is not None]
    good = n_ok
    if clauses:
        where = " AND ".join(sql for sql, _ in clauses)  # fixed text; the bounds go in as parameters
        good = con.execute(f"SELECT count(*) FROM requests WHERE run_id = ? AND {where} AND status = 'ok' "
                           "AND phase = 'measured'", [run_id, *(v for _, v in clauses)]).fetchall()[0][0]
    start = agg(measured, "first_due", "min")
    last_finished = agg(measured, "last_finished", "max")
    duration = last_finished - start if start is not None and last_finished is not None else None
    first_sent, last_sent = agg(measured, "first_sent", "min"), agg(measured, "last_sent", "max")
    send_span = last_sent - first_sent if first_sent is not None and last_sent is not None else None
    input_tokens, output_tokens = agg(ok, "input_tokens", "sum"), agg(ok, "output_tokens", "sum")
    lag_n = agg(measured, "lag_n", "sum")

    def per_s(x: float | None, span: float | None) -> float | None:
        return None if x is None or not span or span <= 0 else x / span

    out.update({
        "requests": int(stats.n.sum()), "warmup": int(stats[stats.phase == "warmup"].n.sum()),
        "measured": n_measured, "ok": n_ok, "errors": answered - n_ok, "cancelled": n_cancelled,
        "success_rate": n_ok / answered if answered else None,
        "duration_s": duration,
        "achieved_rate_rps": per_s(n_measured, send_span),
        "throughput_rps": per_s(n_ok, duration),
        "input_tps": per_s(input_tokens, duration), "output_tps": per_s(output_tokens, duration),
        "input_tokens": input_tokens, "output_tokens": output_tokens,
        "dispatch_lag_mean": agg(measured, "lag_sum", "sum") / lag_n if lag_n else None,
        "dispatch_lag_max": agg(measured, "lag_max", "max"),
        "slo_ttft_s": slo.ttft_s, "slo_tpot_s": slo.tpot_s, "slo_e2e_s": slo.e2e_s,
        "slo_attainment": good / answered if answered else None,
        "goodput_rps": per_s(good, duration),
    })
    out.update(percentiles(con, run_id))
    waits = con.execute("SELECT quantile_cont(slot_wait_s, [0.5, 0.9, 0.99]) FROM requests WHERE run_id = ? AND "
                        "phase = 'measured' AND slot_wait_s IS NOT NULL", [run_id]).fetchone()[0]
    if waits:  # a capped run: how long arrivals waited in the client for a slot (not in ttft/e2e)
        out.update(slot_wait_p50=waits[0], slot_wait_p90=waits[1], slot_wait_p99=waits[2])
    kinds = failed.assign(kind=failed.error_kind.fillna("unknown")).groupby("kind").n.sum()
    out["errors_by_kind"] = {k: int(v) for k, v in kinds.sort_values(ascending=False).items()}
    ttfc = con.execute("SELECT quantile_cont(ttfc_s, [0.5, 0.9, 0.99]) FROM requests WHERE run_id = ? AND "
                       "phase = 'measured' AND status = 'ok' AND ttfc_s IS NOT NULL AND "
                       "(reasoning_tokens > 0 OR ttfc_s > ttft_s)",
                       [run_id]).fetchone()[0]
    if ttfc:  # a reasoning model: the time to its first answer token, beside TTFT (which counts reasoning)
        out.update(ttfc_p50=ttfc[0], ttfc_p90=ttfc[1], ttfc_p99=ttfc[2])
    late = con.execute("SELECT quantile_cont(dispatch_lag_s, 0.5), quantile_cont(ttft_s - dispatch_lag_s, 0.5) FROM "
                       "requests WHERE run_id = ? AND phase = 'measured' AND status = 'ok' AND ttft_s IS NOT NULL",
                       [run_id]).fetchone()
    if late and late[1] is not None:  # TTFT counts from the due time: how much of it is the client's lateness
        out.update(ttft_lag_p50=late[0], ttft_from_send_p50=late[1])
    turns = by_turn(con, run_id)
    if turns:
        out["by_turn"] = turns
    out.update(tool_summary(con, run_id) or {})
    return out


def tool_summary(con: duckdb.DuckDBPyConnection, run_id: str) -> dict | None:
    """A summary-only import's figures as summary() names them (run_summaries: the tool's own counts, rates and
    percentiles), summary_only the line per-request views show instead of empty charts; None for a run with its
    requests. What the tool did not report stays None: errors where it
    counted successes only, send rate, goodput and SLO attainment (they need each request)."""
    rows = con.execute("SELECT metric, stat, value FROM run_summaries WHERE run_id = ?", [run_id]).fetchall()
    if not rows:
        return None
    f = {(metric, stat): value for metric, stat, value in rows}
    ok, errors = f.get(("requests", "ok")), f.get(("requests", "errors"))
    answered = None if ok is None else ok + (errors or 0)
    out = {"summary_only": f"summary only: {int(answered or 0):,} requests, percentiles from the tool",
           "requests": int(answered or 0), "measured": int(answered or 0),
           "ok": int(ok or 0), "errors": None if errors is None else int(errors),
           "success_rate": ok / answered if errors is not None and answered else None,
           "duration_s": f.get(("duration", "total")), "achieved_rate_rps": None, "goodput_rps": None,
           "slo_attainment": None, "throughput_rps": f.get(("throughput", "requests")),
           "input_tps": f.get(("throughput", "input_tokens")), "output_tps": f.get(("throughput", "output_tokens")),
           "input_tokens": f.get(("tokens", "input")), "output_tokens": f.get(("tokens", "output"))}
    out.update({f"{m}_p{q}": f.get((m, f"p{q}")) for m in ("ttft", "tpot", "itl", "e2e") for q in QUANTILES})
    out.update({f"{m}_mean": f[(m, "mean")] for m in ("ttft", "tpot", "itl", "e2e") if (m, "mean") in f})
    return out


def by_turn(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    """Closed-loop sessions' measured requests by turn: count, successes, TTFT p50/p90, prompt tokens and the share
    of them the server had cached (usage.prompt_tokens_details.cached_tokens; None where it did not say)."""
    cur = con.execute("""
        SELECT turn, count(*), count(*) FILTER (WHERE status = 'ok'),
               quantile_cont(ttft_s, 0.5) FILTER (WHERE status = 'ok'),
               quantile_cont(ttft_s, 0.9) FILTER (WHERE status = 'ok'),
               avg(prompt_tokens) FILTER (WHERE status = 'ok'),
               sum(cached_tokens) FILTER (WHERE status = 'ok') / nullif(sum(prompt_tokens) FILTER (WHERE status = 'ok'
                   AND cached_tokens IS NOT NULL), 0)
        FROM requests WHERE run_id = ? AND phase = 'measured' AND turn IS NOT NULL GROUP BY turn ORDER BY turn""",
                      [run_id])
    names = ("turn", "requests", "ok", "ttft_p50", "ttft_p90", "prompt_tokens_mean", "cached_share")
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def finished_within(con: duckdb.DuckDBPyConnection, run_id: str, window_s: float) -> int:
    """Successful measured requests that finished within window_s of the first one's due time."""
    return con.execute(
        "SELECT count(*) FROM requests WHERE run_id = ? AND phase = 'measured' AND status = 'ok' AND "
        "finished_at <= (SELECT min(scheduled_at) FROM requests WHERE run_id = ?) + ?",
        [run_id, run_id, window_s]).fetchone()[0]


def _check_resolution(resolution_s: float) -> None:
    if not resolution_s > 0:
        raise BadInput(f"resolution must be a positive number of seconds, not {resolution_s}")


def series(con: duckdb.DuckDBPyConnection, run_id: str, resolution_s: float = 1.0) -> pd.DataFrame:
    """Requests per time slot (by finish time): t (slot start, epoch s), elapsed_s (since the run started),
    completed, errors, rps, output_tps, ttft/tpot/e2e p50 and p99 of that slot's successful requests. Every slot
    from the first to the last is there: one where nothing finished has 0 completed and no latencies (NaN), so a
    chart shows the gap instead of a line across it."""
    _check_resolution(resolution_s)
    t0 = _run_row(con, run_id)["started_at"]
    return con.execute("""
        WITH r AS (SELECT *, floor((finished_at - $1) / $2) AS slot FROM requests
                   WHERE run_id = $3 AND phase = 'measured' AND finished_at IS NOT NULL),
        per AS (
            SELECT slot, count(*) AS completed, count(*) FILTER (WHERE status <> 'ok') AS errors,
                   coalesce(sum(completion_tokens) FILTER (WHERE status = 'ok'), 0) AS tokens,
                   quantile_cont(ttft_s, 0.5) FILTER (WHERE status = 'ok') AS ttft_p50,
                   quantile_cont(ttft_s, 0.99) FILTER (WHERE status = 'ok') AS ttft_p99,
                   quantile_cont(tpot_s, 0.5) FILTER (WHERE status = 'ok') AS tpot_p50,
                   quantile_cont(tpot_s, 0.99) FILTER (WHERE status = 'ok') AS tpot_p99,
                   quantile_cont(e2e_s, 0.5) FILTER (WHERE status = 'ok') AS e2e_p50,
                   quantile_cont(e2e_s, 0.99) FILTER (WHERE status = 'ok') AS e2e_p99
            FROM r GROUP BY slot),
        slots AS (SELECT unnest(range(CAST(min(slot) AS BIGINT), CAST(max(slot) AS BIGINT) + 1)) AS slot FROM per)
        SELECT $1 + s.slot * $2 AS t, s.slot * $2 AS elapsed_s, coalesce(completed, 0) AS completed,
               coalesce(errors, 0) AS errors, coalesce(completed, 0) / $2 AS rps,
               coalesce(tokens, 0) / $2 AS output_tps, ttft_p50, ttft_p99, tpot_p50, tpot_p99, e2e_p50, e2e_p99
        FROM slots s LEFT JOIN per USING (slot) ORDER BY s.slot""", [t0, resolution_s, run_id]).df()


def gpu_series(con: duckdb.DuckDBPyConnection, run_id: str, resolution_s: float = 1.0) -> pd.DataFrame:
    """GPU samples averaged per slot, node (NULL: NVML on the load generator's machine) and GPU."""
    _check_resolution(resolution_s)
    t0 = _run_row(con, run_id)["started_at"]
    return con.execute("""
        SELECT $1 + slot * $2 AS t, slot * $2 AS elapsed_s, node, gpu, any_value(name) AS name,
               avg(mem_used_mib) AS mem_used_mib, max(mem_total_mib) AS mem_total_mib,
               avg(gpu_util_pct) AS gpu_util_pct, avg(mem_util_pct) AS mem_util_pct, avg(power_w) AS power_w,
               avg(sm_clock_mhz) AS sm_clock_mhz, avg(mem_clock_mhz) AS mem_clock_mhz, max(temp_c) AS temp_c
        FROM (SELECT *, floor((t - $1) / $2) AS slot FROM gpu_samples WHERE run_id = $3)
        GROUP BY slot, node, gpu ORDER BY slot, node NULLS FIRST, gpu""", [t0, resolution_s, run_id]).df()


def gpu_summary(con: duckdb.DuckDBPyConnection, run_id: str) -> pd.DataFrame:
    """Each GPU over the run, per node (NULL node: NVML on the load generator's machine): samples, mean and peak
    utilisation, mean and peak memory used of its total, mean power."""
    return con.execute("""
        SELECT node, gpu, any_value(name) AS name, count(*) AS samples, avg(gpu_util_pct) AS gpu_util_mean,
               max(gpu_util_pct) AS gpu_util_max, avg(mem_used_mib) AS mem_used_mean_mib,
               max(mem_used_mib) AS mem_used_max_mib, max(mem_total_mib) AS mem_total_mib, avg(power_w) AS power_w
        FROM gpu_samples WHERE run_id = ? GROUP BY node, gpu ORDER BY node NULLS FIRST, gpu""", [run_id]).df()


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


def compare(con: duckdb.DuckDBPyConnection, run_ids: list[str], slo: Slo | None = None) -> pd.DataFrame:
    """Runs side by side: one row per metric, one column per run, and `<run> / <first run>` ratio columns."""
    if len(set(run_ids)) < 2 or len(set(run_ids)) != len(run_ids):
        raise BadInput("compare needs at least two different run ids, each once")
    sums = [summary(con, r, slo) for r in run_ids]
    table = pd.DataFrame({s["run_id"]: [s[m] for m in COMPARED] for s in sums}, index=list(COMPARED), dtype=float)
    base = run_ids[0]
    for r in run_ids[1:]:
        with np.errstate(divide="ignore", invalid="ignore"):
            table[f"{r} / {base}"] = table[r] / table[base].where(table[base] != 0)
    return table
