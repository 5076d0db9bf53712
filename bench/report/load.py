"""Latency against load: TTFT and TPOT at the SLO's percentile against the offered and the achieved request rate,
predicted (capbench simulate at rates around the plan's highest rate within the SLO) and measured (a sweep's
stages, or runs of one deployment and workload at different rates), on one chart with the SLO drawn on it and the
highest rate within it marked. Rates and latencies are in the modelled GPUs' time for twin runs."""

from __future__ import annotations

import duckdb
import pandas as pd

from bench.model import Deployment, Prediction, Slo, Workload, rate
from bench.store import runinfo

FRACTIONS = (0.25, 0.5, 0.75, 0.9, 1.1, 1.25, 1.5)  # of the highest rate within the SLO
COLUMNS = ["source", "offered_rps", "achieved_rps", "ttft_ms", "tpot_ms", "within_slo", "run"]


def predicted(dep: Deployment, wl: Workload, slo: Slo, best: Prediction, requests: int = 300) -> pd.DataFrame:
    """The model's TTFT and TPOT at the SLO's percentile at rates around best.rate_rps (the plan's highest rate
    within the SLO for one instance, which is the marked point: the figure the plan quotes)."""
    q = slo.percentile
    rows = [{"source": "predicted", "offered_rps": best.rate_rps, "achieved_rps": best.rate_rps,
             "ttft_ms": best.ttft_s * 1e3, "tpot_ms": best.tpot_s * 1e3, "within_slo": True,
             "run": "the plan's highest rate within the SLO"}]
    for f in FRACTIONS:
        p = rate.simulated(dep, wl, best.rate_rps * f, requests)
        ttft, tpot = getattr(p, f"ttft_p{q}"), getattr(p, f"tpot_p{q}")
        # below the plan's rate a point is within the SLO by the plan's search; above it, it is not
        rows.append({"source": "predicted", "offered_rps": best.rate_rps * f, "achieved_rps": p.achieved_rps,
                     "ttft_ms": ttft * 1e3, "tpot_ms": tpot * 1e3, "within_slo": f < 1,
                     "run": f"model at {f:.0%} of the highest rate"})
    return pd.DataFrame(rows, columns=COLUMNS).sort_values("offered_rps", ignore_index=True)


def measured(con: duckdb.DuckDBPyConnection, run_ids: list[str], slo: Slo) -> pd.DataFrame:
    """One point per run: its offered rate (the profile's, else the achieved one), achieved rate, and TTFT/TPOT
    at the SLO's percentile, in the modelled GPUs' time; within_slo judged by the run's own SLO where it recorded
    one (a campaign stage's), else by `slo` (runinfo.summary)."""
    rows = []
    for r in run_ids:
        s, c = runinfo.summary(con, r, slo), runinfo.run_deployment(con, r)
        judged = s["slo"] or slo
        q = judged.percentile
        ttft, tpot = s.get(f"ttft_p{q}"), s.get(f"tpot_p{q}")
        if ttft is None or s["achieved_rate_rps"] is None:
            continue
        offered = (c.get("offered_rps") or c.get("rate") or 0) / s["time_scale"] or s["achieved_rate_rps"]
        rows.append({"source": "measured", "offered_rps": offered, "achieved_rps": s["achieved_rate_rps"],
                     "ttft_ms": ttft * 1e3, "tpot_ms": None if tpot is None else tpot * 1e3,
                     "within_slo": _within(judged, ttft, tpot, s.get(f"e2e_p{q}")), "run": r})
    return pd.DataFrame(rows, columns=COLUMNS)


def sweep_runs(runs: pd.DataFrame, run_id: str) -> list[str]:
    """The runs that make one load curve with `run_id` (runs: runinfo.runs_table): its sweep's stages, else the
    runs of the same deployment and workload, oldest first."""
    rows = runs.to_dict("records")
    row = next(r for r in rows if r["run_id"] == run_id)

    def key(r: dict) -> tuple:
        if _given(r.get("sweep_id")):
            return ("sweep", r["sweep_id"])
        return tuple(str(r.get(k)) for k in ("model", "gpu", "tp", "kv_dtype", "weights", "workload", "twin",
                                             "kv_checksum"))

    same = [r for r in rows if key(r) == key(row)]
    return [r["run_id"] for r in sorted(same, key=lambda r: r["started_at"])]


def _given(v: object) -> bool:
    return v is not None and not (isinstance(v, float) and pd.isna(v)) and v != ""


def highest_within(df: pd.DataFrame) -> dict[str, float | None]:
    """Per source, the highest offered rate whose point is within the SLO (None: none is)."""
    return {src: (float(g[g.within_slo].offered_rps.max()) if g.within_slo.any() else None)
            for src, g in df.groupby("source")}


def _within(slo: Slo, ttft: float | None, tpot: float | None, e2e: float | None = None) -> bool:
    return (slo.ttft_s is None or (ttft is not None and ttft <= slo.ttft_s)) and \
        (slo.tpot_s is None or tpot is None or tpot <= slo.tpot_s) and \
        (slo.e2e_s is None or (e2e is not None and e2e <= slo.e2e_s))
