"""A measured run beside the performance model's replay of it: the same deployment, workload, rate and number of
requests, so the error says how far the model is from what was measured (the Compare page, the report)."""

from __future__ import annotations

import math

import duckdb

from bench.errors import BadInput
from bench.model import Slo, catalog, fixed_workload, interval, load_workload, simulate, workload
from bench.model import capacity as cap
from bench.store import runinfo

STEADY_REQUESTS = 50  # fewer measured requests than this: too short a run to judge a prediction by
CAPACITY = 0.95  # a replay that serves less than this share of the offered rate runs at the deployment's capacity


def measured_vs_predicted(con: duckdb.DuckDBPyConnection, run_id: str, slo: Slo | None = None) -> dict:
    """The run's measured throughput and latencies beside `capbench simulate`'s replay of it: the same deployment,
    workload (its named mix, else fixed lengths at its measured means), rate (the profile's, else the achieved
    one) and number of requests, so a short run is compared with an equally short simulation; error = predicted /
    measured - 1; low, high: the prediction's 80 % interval (bench/model/evidence/interval.py; output tokens/s only
    where
    the replay runs at capacity: below it the offered load is served whatever the error) and whether the measured
    figure lies inside. out["steady"] is False for runs under STEADY_REQUESTS requests."""
    s = runinfo.summary(con, run_id, slo)  # in the modelled GPUs' time, as the prediction
    cfg = runinfo.run_deployment(con, run_id)
    out = {"run_id": run_id, "summary": s, "config": cfg, "predicted": None, "rows": []}
    if not (cfg["model"] and cfg["gpu"] and cfg["tp"] and s["ok"]):
        out["why_not"] = "the run does not say its model, GPU or tp, or it has no successful requests"
        return out
    # a summary-only import (its tool's figures, no send times): the rate it served stands for the rate sent
    served = s["throughput_rps"] if s.get("summary_only") else None
    rate = cfg["rate"] or s["achieved_rate_rps"] or served
    try:
        dep = cap.Deployment(catalog.model(cfg["model"]), catalog.gpu(cfg["gpu"]), cfg["tp"],
                             kv_dtype=cfg["kv_dtype"] or "bf16", weights=cfg["weights"] or "native")
        if not rate or not cap.capacity(dep, with_ratios=False).fits:
            raise BadInput("the deployment does not fit, or no rate was measured")
    except BadInput as e:
        out["why_not"] = str(e)
        return out
    if cfg["workload"] and workload.workload_path(cfg["workload"]):
        wl = load_workload(cfg["workload"])
    else:
        wl = fixed_workload(max(1, round((s["input_tokens"] or 0) / s["ok"])),
                            max(1, round((s["output_tokens"] or 0) / s["ok"])))
    scale = s["time_scale"]  # a twin at time_scale k runs k times faster than the modelled GPUs
    rate = cfg["rate"] / scale if cfg["rate"] else s["achieved_rate_rps"] or served
    p = simulate.run(dep, wl, rate, max(1, s["measured"]), min_seconds=0)
    out["predicted"], out["workload"], out["steady"] = p, wl.name, s["measured"] >= STEADY_REQUESTS
    at_capacity = not cfg["rate"] or p.achieved_rps < CAPACITY * rate
    for name, figure, measured, predicted in (
        ("output tokens/s", "output_tok_s", s["output_tps"] if served else
         _per(runinfo.window_output_tps(con, run_id), scale), p.output_tok_s),
        ("TPOT p50 (ms)", "tpot_ms", _ms(s["tpot_p50"]), p.tpot_p50 * 1e3),
        ("TTFT p50 (ms)", "ttft_ms", _ms(s["ttft_p50"]), p.ttft_p50 * 1e3),
    ):
        err = predicted / measured - 1 if measured else None
        band = None
        if (at_capacity or figure != "output_tok_s") and math.isfinite(predicted) and predicted > 0:
            band = interval.predicted_range(dep.model.id, dep.gpu.id, dep.weights, figure, predicted, p.mean_running)
        low, high = band or (None, None)
        inside = None if band is None or measured is None else low <= measured <= high
        out["rows"].append({"run_id": run_id, "figure": name, "measured": measured, "predicted": predicted,
                            "error": err, "low": low, "high": high, "inside": inside})
    return out


def _per(x: float | None, scale: float) -> float | None:
    return None if x is None else x / scale


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3
