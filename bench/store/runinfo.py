"""What the dashboard and the report read about runs beyond queries.py: each run's configuration (from its
config JSON, a `twin:` spec read with model/spec.py), latency distributions, KV-integrity totals, quality-drift
results, and the output throughput inside the arrival window (the figure simulate reports).

Every function that reads takes an open connection (`with store.connect() as con:`) and binds parameters.
"""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pandas as pd

from bench.errors import BadInput
from bench.model import Slo, parse_spec
from bench.store import identity, queries
from bench.store.histogram import bucket_value

# capbench_kv_* counters as prometheus_client exposes them (counters get _total).
KV_COUNTERS = {
    "pages_checksummed": "capbench_kv_pages_checksummed_total",
    "pages_verified": "capbench_kv_pages_verified_total",
    "mismatches": "capbench_kv_checksum_mismatch_total",
    "checksum_seconds": "capbench_kv_checksum_seconds_total",
    "verifications": "capbench_kv_verifications_total",  # by source: admission, insert, scrub, offload, load
}
# Server metrics the Runs page charts by default (others can be added there); histograms are left out.
SERVER_METRICS = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
                  "sglang:cache_hit_rate", "sglang:kv_cache_memory_usage_gb", "capbench_kv_checksum_mismatch_total")


def run_config(config: str | dict | None) -> dict:
    """The deployment a run measured, from its config JSON: model (catalog id), gpu, tp, kv_dtype, weights, rate,
    kv_checksum, time_scale (None when unknown), and twin (True: measured against capbench's twin, not GPUs).
    A `twin:` target's spec gives all of them; for a real server the model comes from the served name (a catalog
    id or Hugging Face repo) and `run_deployment` fills tp and gpu from the run's samples."""
    if isinstance(config, str):
        try:
            config = json.loads(config) if config else {}
        except json.JSONDecodeError:
            config = {}
    c = config if isinstance(config, dict) else {}
    profile = c.get("profile") if isinstance(c.get("profile"), dict) else {}
    params = profile.get("params") if isinstance(profile.get("params"), dict) else {}
    out = {"model": _catalog_model(c.get("model")), "gpu": c.get("gpu"), "tp": c.get("tp"),
           "dp": c.get("dp") or 1, "ep": c.get("ep") or 1, "kv_dtype": c.get("kv_dtype"), "weights": c.get("weights"),
           "profile": profile.get("name") or (c.get("profile") if isinstance(c.get("profile"), str) else None),
           "users": params.get("users"), "sweep_id": c.get("sweep_id"), "offered_rps": c.get("offered_rps"),
           "rate": c.get("rate", params.get("rate", profile.get("rate"))),
           "kv_checksum": c.get("kv_checksum") or "off", "time_scale": c.get("time_scale") or 1.0,
           "workload": (c.get("workload") or {}).get("name") if isinstance(c.get("workload"), dict)
           else c.get("workload"), "twin": False, "mem_fraction": None, "slo": None,
           "cell": c.get("cell") if isinstance(c.get("cell"), str) else None,
           "imported": (c.get("import") or {}).get("tool") if isinstance(c.get("import"), dict) else None}
    twin = c.get("twin") or (c.get("target") if str(c.get("target", "")).startswith("twin:") else None)
    spec = twin or c.get("deployment")  # deployment: what an imported run's server ran (capbench import)
    if isinstance(spec, str) and spec:
        try:
            s = parse_spec(spec)
            dep = s.deployment()
            out.update(model=s.model, gpu=s.gpu, tp=s.tp, dp=dep.dp, kv_dtype=dep.kv_dtype, weights=dep.weights,
                       mem_fraction=dep.mem_fraction)
            if twin:
                out.update(time_scale=s.value("time_scale", float, 1.0), twin=True)
            out["kv_checksum"] = s.options.get("kv_checksum") or out["kv_checksum"]
        except BadInput:
            pass
    if out["model"] and not out["weights"]:
        out["weights"] = "native"
    out["tp"] = int(out["tp"]) if out["tp"] is not None else None
    out["rate"] = float(out["rate"]) if out["rate"] is not None else None
    out["slo"] = _own_slo(c, float(out["time_scale"] or 1.0) if out["twin"] else 1.0)
    return out


def _own_slo(c: dict, k: float) -> Slo | None:
    """The SLO the run was judged by when it ran (a campaign stage's, `capbench run --slo`'s), in the modelled GPUs'
    time; None when it recorded no bound. A campaign hands its server the SLO in the server's own time (k times
    tighter on a twin k times faster): multiplied back here."""
    raw = c.get("slo") if isinstance(c.get("slo"), dict) else {}
    bounds = {key: raw.get(key) for key in ("ttft_s", "tpot_s", "e2e_s")}
    try:
        slo = Slo(**{key: None if v is None else float(v) * (k if c.get("campaign") else 1.0)
                     for key, v in bounds.items()}, percentile=int(raw.get("percentile") or 90))
    except (BadInput, TypeError, ValueError):
        return None
    return slo if slo.bounded else None


def _catalog_model(name: object) -> str | None:
    """A served model name (catalog id or Hugging Face repo, any case) as a catalog id; None when unknown."""
    if not isinstance(name, str) or not name:
        return None
    from bench.model import catalog

    lowered = name.lower().rstrip("/")
    for model in catalog.models().values():
        if lowered in (model.id, model.hf_repo.lower()) or lowered.endswith("/" + model.hf_repo.lower()):
            return model.id
    return None


def run_deployment(con: duckdb.DuckDBPyConnection, run_id: str) -> dict:
    """run_config, with tp from SGLang's /server_info samples and the GPU from the NVML samples' name when the
    config does not say (a run against a real server). kv_dtype defaults to bf16 (SGLang's 'auto')."""
    from bench.model import catalog

    row = con.execute("SELECT config FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        raise BadInput(f"unknown run id {run_id!r} (see `capbench runs`)")
    cfg = run_config(row[0])
    if cfg["tp"] is None:
        tp = con.execute("SELECT max(value) FROM server_samples WHERE run_id = ? AND metric = 'server_info:tp_size'",
                         [run_id]).fetchone()[0]
        cfg["tp"] = int(tp) if tp else None
    if cfg["gpu"] is None:
        name = con.execute("SELECT any_value(name) FROM gpu_samples WHERE run_id = ?", [run_id]).fetchone()[0]
        if name:
            known = sorted(catalog.gpus(), key=len, reverse=True)
            cfg["gpu"] = next((g for g in known if g.split("-")[0] in name.lower()), None)
    cfg["kv_dtype"] = cfg["kv_dtype"] or "bf16"
    return cfg


def runs_table(runs: pd.DataFrame, hosts: dict[str, str] | None = None) -> pd.DataFrame:
    """store.runs() with the configuration spread into columns, `host` (from `hosts`, run id -> hostname) and
    `identity`, the one description of a run every page, table and report shows."""
    configs = pd.DataFrame([run_config(c) for c in runs["config"]], index=runs.index,
                           columns=list(run_config(None)))
    if "profile" in runs:  # the store's profile name, where the config does not say
        configs["profile"] = configs["profile"].fillna(runs["profile"])
    out = pd.concat([runs.drop(columns=["config", "profile"], errors="ignore"), configs], axis=1)
    out["started"] = pd.to_datetime(out["started_at"], unit="s", utc=True).dt.strftime("%Y-%m-%d %H:%M:%S")
    out["host"] = [(hosts or {}).get(r) for r in out["run_id"]]
    out["identity"] = [identity.identity(row) for row in out.to_dict("records")]
    return out


DEPLOYMENT_KEYS = ("model", "gpu", "tp", "dp", "ep", "kv_dtype", "weights", "twin", "kv_checksum", "mem_fraction")


def compare_pair(runs: pd.DataFrame) -> list[str]:
    """The pair Compare opens with (runs: runs_table, newest first), older first as the baseline: two deployments,
    never two repeats of one. The newest run that has a run of another deployment (another KV dtype, weights, GPU,
    parallelism, checksum setting or campaign deployment) of the same model under the same load (workload and
    offered rate), and the newest such run; else the same with the same workload, then the same model; the newest
    two when every run is of one deployment."""
    rows = runs.to_dict("records")
    if len(rows) < 2:
        return [r["run_id"] for r in rows][::-1]

    def text(v: object) -> str:
        return "" if v is None or (isinstance(v, float) and pd.isna(v)) else str(v)

    def deployment(r: dict) -> tuple:
        return (*(text(r.get(k)) for k in DEPLOYMENT_KEYS), text(r.get("cell")).split("/")[0])

    def offered(r: dict) -> str:
        rate = r.get("offered_rps") if text(r.get("offered_rps")) else r.get("rate")
        return f"{float(rate) / float(r.get('time_scale') or 1):.3g}" if text(rate) else text(r.get("users"))

    def load(r: dict, rate: bool) -> tuple:
        return text(r.get("model")), text(r.get("workload")), offered(r) if rate else ""

    tiers = (lambda a, b: load(a, True) == load(b, True), lambda a, b: load(a, False) == load(b, False),
             lambda a, b: text(a.get("model")) == text(b.get("model")))
    for same in tiers:
        for i, newest in enumerate(rows):
            other = next((r for r in rows[i + 1:] if same(r, newest) and deployment(r) != deployment(newest)), None)
            if other is not None:
                return [other["run_id"], newest["run_id"]]
    return [rows[1]["run_id"], rows[0]["run_id"]]


def hosts(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """run id -> the host `capbench run` ran on."""
    return dict(con.execute("SELECT run_id, hostname FROM runs WHERE hostname IS NOT NULL").fetchall())


def list_runs(store) -> pd.DataFrame:
    """Every run, newest first, as runs_table (with hosts)."""
    with store.connect() as con:
        where = hosts(con)
    return runs_table(store.runs(), where)


def time_scale(con: duckdb.DuckDBPyConnection, run_id: str) -> float:
    """How many times faster than the GPUs it models the run's server was: a twin's time_scale, else 1."""
    c = run_deployment(con, run_id)
    return float(c["time_scale"] or 1.0) if c["twin"] else 1.0


RATE_KEYS = ("achieved_rate_rps", "throughput_rps", "goodput_rps", "input_tps", "output_tps")
TIME_KEYS = ("duration_s", "slo_ttft_s", "slo_tpot_s", "slo_e2e_s",
             *(f"{m}_p{q}" for m in ("ttft", "tpot", "itl", "e2e") for q in queries.QUANTILES))


def judged_by(con: duckdb.DuckDBPyConnection, run_id: str, slo: Slo | None) -> tuple[Slo | None, bool]:
    """The SLO a run is judged by wherever it is shown: its own (the one it ran under, True), else `slo` (False)."""
    own = run_deployment(con, run_id)["slo"]
    return (own, True) if own is not None else (slo, False)


def summary(con: duckdb.DuckDBPyConnection, run_id: str, slo: Slo | None = None) -> dict:
    """queries.summary in the time of the GPUs the run measured or modelled: a twin that ran k times faster has
    its SLO judged k times tighter, its rates divided by k and its latencies multiplied by k (time_scale: k). Every
    page and report shows a run through this. Goodput and SLO attainment are judged by the run's own SLO where it
    recorded one (a campaign stage's), else by `slo`: "slo" is the one used, "slo_own" whose it is."""
    k = time_scale(con, run_id)
    slo, own = judged_by(con, run_id, slo)
    s = queries.summary(con, run_id, slo.scaled(k) if slo is not None and k != 1 else slo)
    s["slo"], s["slo_own"] = slo, own
    if k != 1:
        s.update({key: s[key] / k for key in RATE_KEYS if s.get(key) is not None})
        s.update({key: s[key] * k for key in TIME_KEYS if s.get(key) is not None})
    s["time_scale"] = k
    return s


def series(con: duckdb.DuckDBPyConnection, run_id: str, resolution_s: float = 1.0) -> pd.DataFrame:
    """queries.series in the modelled GPUs' time (as summary): elapsed and latencies x k, rates / k; the slot is
    resolution_s of GPU time."""
    k = time_scale(con, run_id)
    df = queries.series(con, run_id, resolution_s / k)
    df["elapsed_s"] = df["elapsed_s"] * k
    for col in ("rps", "output_tps"):
        df[col] = df[col] / k
    for col in [c for c in df if c.startswith(("ttft_", "tpot_", "e2e_"))]:
        df[col] = df[col] * k
    return df


# server metrics that are rates over the server's own clock: a twin's are k times the modelled GPUs'
RATE_METRICS = ("sglang:gen_throughput",)


def server_series(con: duckdb.DuckDBPyConnection, run_id: str, metric: str,
                  resolution_s: float = 1.0) -> pd.DataFrame:
    """queries.server_series with elapsed_s in the modelled GPUs' time, and a twin's rate metrics (RATE_METRICS)
    divided by its time scale; other values (counts, shares, bytes) as the server reported them."""
    k = time_scale(con, run_id)
    df = queries.server_series(con, run_id, metric, resolution_s / k)
    df["elapsed_s"] = df["elapsed_s"] * k
    if metric in RATE_METRICS:
        df["value"] = df["value"] / k
    return df


def clock(time_scale: float, twin: bool, gpus: str = "the modelled GPUs") -> str:
    """Whose time a run's figures are in, as the pages and the live panel say it: a twin's are converted to the
    modelled GPUs' time (rates / k, latencies x k), never shown in its own time beside a model's figures."""
    if twin:
        return f"twin x{time_scale:g}, figures in the time of {gpus}"
    return f"{gpus} (measured)"


def distribution(con: duckdb.DuckDBPyConnection, run_id: str, metric: str) -> pd.DataFrame:
    """A latency metric's histogram (the store's 1 % log buckets): value_ms (in the modelled GPUs' time), n;
    empty when none."""
    df = con.execute("SELECT bucket, sum(n) AS n FROM latency_hist WHERE run_id = ? AND metric = ? "
                     "GROUP BY bucket ORDER BY bucket", [run_id, metric]).df()
    df["value_ms"] = bucket_value(df["bucket"].to_numpy()) * 1e3 * (time_scale(con, run_id) if len(df) else 1)
    return df[["value_ms", "n"]]


def percentile_rows(summary: dict) -> pd.DataFrame:
    """Long table of a summary's latency percentiles: metric, percentile, ms."""
    rows = [{"metric": m.upper(), "percentile": f"p{q}", "ms": summary[f"{m}_p{q}"] * 1e3}
            for m in ("ttft", "tpot", "itl", "e2e") for q in queries.QUANTILES
            if summary.get(f"{m}_p{q}") is not None]
    return pd.DataFrame(rows, columns=["metric", "percentile", "ms"])


def compare(con: duckdb.DuckDBPyConnection, run_ids: list[str], slo: Slo | None = None) -> pd.DataFrame:
    """queries.compare in the modelled GPUs' time, each run judged by its own SLO where it recorded one (summary):
    one row per figure, one column per run, and `<run> / <first run>` ratio columns."""
    if len(set(run_ids)) < 2 or len(set(run_ids)) != len(run_ids):
        raise BadInput("compare needs at least two different run ids, each once")
    sums = [summary(con, r, slo) for r in run_ids]
    table = pd.DataFrame({s["run_id"]: [s.get(m) for m in queries.COMPARED] for s in sums},
                         index=list(queries.COMPARED), dtype=float)
    base = run_ids[0]
    for r in run_ids[1:]:
        with np.errstate(divide="ignore", invalid="ignore"):
            table[f"{r} / {base}"] = table[r] / table[base].where(table[base] != 0)
    return table


def slo_said(s: dict) -> str:
    """Which SLO a summary judged the run by, in words: its own, or the page's / question's."""
    if s.get("slo") is None:
        return "no SLO"
    return s["slo"].describe() + (" (the run's own)" if s.get("slo_own") else " (this page's)")


def server_metric_names(con: duckdb.DuckDBPyConnection, run_id: str) -> list[str]:
    """The run's sampled server metrics, less Prometheus histogram parts (_bucket, _sum, _count)."""
    return [r[0] for r in con.execute(
        "SELECT DISTINCT metric FROM server_samples WHERE run_id = ? AND NOT regexp_matches(metric, "
        "'_(bucket|sum|count)$') ORDER BY 1", [run_id]).fetchall()]


def integrity(con: duckdb.DuckDBPyConnection, run_id: str) -> dict:
    """KV checksum totals of a run: counter increases over the run (summed over label sets), integrity events by
    kind, and checksum_share = checksum host seconds per second of the run."""
    out: dict = {}
    for key, metric in KV_COUNTERS.items():
        row = con.execute("""
            SELECT sum(hi - lo), count(*) FROM (
                SELECT labels, max(value) AS hi, arg_min(value, t) AS lo FROM server_samples
                WHERE run_id = ? AND metric = ? GROUP BY labels)""", [run_id, metric]).fetchone()
        out[key] = float(row[0]) if row[1] else None
    span = con.execute("SELECT max(t) - min(t) FROM server_samples WHERE run_id = ? AND metric LIKE 'capbench_kv%'",
                       [run_id]).fetchone()[0]
    out["span_s"] = span
    secs = out["checksum_seconds"]
    out["checksum_share"] = secs / span if secs is not None and span else None
    out["events"] = dict(con.execute("SELECT kind, count(*) FROM integrity_events WHERE run_id = ? GROUP BY kind "
                                     "ORDER BY kind", [run_id]).fetchall())
    out["has_data"] = any(out[k] is not None for k in KV_COUNTERS) or bool(out["events"])
    return out


def runs_with_integrity(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Runs that recorded capbench_kv_* counters or integrity events."""
    return [r[0] for r in con.execute(
        "SELECT DISTINCT run_id FROM server_samples WHERE metric LIKE 'capbench_kv%' "
        "UNION SELECT DISTINCT run_id FROM integrity_events").fetchall()]


def integrity_events(con: duckdb.DuckDBPyConnection, run_id: str, limit: int = 200) -> pd.DataFrame:
    return con.execute("SELECT t, kind, layer, page, detail FROM integrity_events WHERE run_id = ? ORDER BY t "
                       "LIMIT ?", [run_id, limit]).df()


def kv_counter_series(con: duckdb.DuckDBPyConnection, run_id: str) -> pd.DataFrame:
    """capbench_kv_* counters over the run: elapsed_s, counter, value (summed over label sets)."""
    t0 = con.execute("SELECT started_at FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if t0 is None:
        raise BadInput(f"unknown run id {run_id!r}")
    return con.execute("""
        SELECT t - ? AS elapsed_s, replace(replace(metric, 'capbench_kv_', ''), '_total', '') AS counter,
               sum(value) AS value
        FROM server_samples WHERE run_id = ? AND metric LIKE 'capbench_kv%'
        GROUP BY t, metric ORDER BY t""", [t0[0], run_id]).df()


def has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]).fetchone()[0] > 0


DRIFT_COLUMNS = {"run_id", "target_a", "target_b", "token_agreement", "exact_match", "mean_kl", "first_divergence"}


def drift(con: duckdb.DuckDBPyConnection) -> pd.DataFrame | None:
    """Quality drift per drift run (`capbench drift` compares two servers prompt by prompt): None when the DB has
    no `drift` table, else one row per drift run (empty when none ran)."""
    if not has_table(con, "drift"):
        return None
    cols = {r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'drift'"
                                      ).fetchall()}
    if not DRIFT_COLUMNS <= cols:  # a layout this reader does not know: show the rows as they are
        return con.execute("SELECT * FROM drift LIMIT 1000").df()
    return con.execute("""
        SELECT d.run_id, any_value(r.label) AS label, any_value(d.target_a) AS target_a,
               any_value(d.target_b) AS target_b, count(*) AS prompts, avg(d.token_agreement) AS token_agreement,
               avg(CAST(d.exact_match AS DOUBLE)) AS exact_match_rate, avg(d.mean_kl) AS mean_kl,
               median(d.first_divergence) AS first_divergence_median
        FROM drift d LEFT JOIN runs r USING (run_id)
        GROUP BY d.run_id ORDER BY min(r.started_at) DESC NULLS LAST""").df()


WARMUP_SHARE = 0.2  # as model/simulate.py: the first 20 % of the arrival window is not counted


def window_output_tps(con: duckdb.DuckDBPyConnection, run_id: str) -> float | None:
    """Output tokens/s delivered inside the run's arrival window less its first WARMUP_SHARE, each request's
    tokens spread evenly from its first token to its finish: the figure `capbench simulate` reports, so the two
    compare like for like (a whole-run average also counts the drain after the last arrival)."""
    row = con.execute("""
        WITH w AS (SELECT min(scheduled_at) + ? * (max(scheduled_at) - min(scheduled_at)) AS lo,
                          max(scheduled_at) AS hi
                   FROM requests WHERE run_id = ? AND phase = 'measured')
        SELECT sum(CASE WHEN r.finished_at > r.first_token_at
                        THEN r.completion_tokens * greatest(0, least(r.finished_at, w.hi)
                             - greatest(r.first_token_at, w.lo)) / (r.finished_at - r.first_token_at)
                        WHEN r.finished_at BETWEEN w.lo AND w.hi THEN r.completion_tokens ELSE 0 END),
               any_value(w.hi - w.lo)
        FROM requests r, w
        WHERE r.run_id = ? AND r.phase = 'measured' AND r.status = 'ok'""",
                      [WARMUP_SHARE, run_id, run_id]).fetchone()
    tokens, span = row
    return tokens / span if tokens is not None and span else None
