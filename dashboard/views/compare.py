"""Compare: two or more runs side by side: capacity, throughput, latency and cost with their gains against the
first run; measured against predicted with the prediction error; quality drift when a `drift` table exists."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from bench.errors import BadInput
from bench.model import capacity, catalog
from bench.report import charts, load, measured_vs_predicted
from bench.report import plancharts as charts_load
from bench.store import identity, runinfo
from dashboard import common

st.title("Compare")
if common.store() is None:
    st.stop()
runs = common.runs()
if len(runs) < 2:
    st.info("Compare needs at least two runs.")
    st.stop()
labels = {r: common.run_label(runs, r) for r in runs.run_id}
shorts = {r: f"{identity.short(row)} ({r[-6:]})" for r, row in zip(runs.run_id, runs.to_dict("records"), strict=True)}


chosen = st.multiselect("Runs (the first is the baseline for the gains)", list(labels),
                        default=runinfo.compare_pair(runs), format_func=labels.get, key="compare_runs")
if len(chosen) < 2:
    st.info("Pick at least two runs.")
    st.stop()
owns = {r: common.own_slo(runs, r) for r in chosen}
if all(owns.values()):  # every run judged by the SLO it ran under: no page SLO to set
    slo = owns[chosen[0]]
    st.caption("Each run is judged by the SLO it ran under (\"SLO judged by\" below).")
else:
    st.caption("Runs that ran under an SLO of their own (a campaign's stages) are judged by it; the others by this "
               "one (\"SLO judged by\" below).")
    slo = common.slo_inputs("compare")
configs = runs.set_index("run_id").loc[chosen]
first_gpu = configs.iloc[0]["gpu"]
default_price = catalog.gpus()[first_gpu].price_per_gpu_hour if first_gpu in catalog.gpus() else 3.0
price = st.number_input("$ per GPU-hour", min_value=0.0, value=float(default_price), step=0.1, key="compare_price")

sums = {r: common.read(runinfo.summary, r, slo) for r in chosen}
if any(sums[r]["time_scale"] != 1 for r in chosen):
    st.caption("Twin runs are shown in the modelled GPUs' time (a twin at time_scale k ran k times faster: its rates "
               "/ k, its latencies x k, the SLO judged on that time).")
for r in (r for r in chosen if sums[r].get("summary_only")):  # capbench import of a file without requests
    st.caption(common.md_text(f"{shorts[r]}: {sums[r]['summary_only']} (no send rate, goodput or SLO attainment: "
                              "they judge each request)."))


POOL = "KV pool tokens (model)"


def capacity_of(run_id: str) -> dict:
    """SGLang's memory arithmetic for the run's deployment (a twin's at its own memory fraction): a model figure."""
    c = configs.loc[run_id]
    try:
        frac = float(c.mem_fraction) if "mem_fraction" in c and pd.notna(c.mem_fraction) else None
        dep = capacity.Deployment(catalog.model(c.model), catalog.gpu(c.gpu), int(c.tp),
                                  kv_dtype=c.kv_dtype or "bf16", weights=c.weights or "native", mem_fraction=frac)
        cap = capacity.capacity(dep, with_ratios=False)
        return {"kv_pool_tokens": cap.kv_pool_tokens, "weights_gb": cap.weight_bytes_per_gpu / 1e9}
    except (BadInput, TypeError, ValueError):
        return {"kv_pool_tokens": None, "weights_gb": None}


@st.cache_data(show_spinner="the model's latency against load", max_entries=32)
def predicted_load(model: str, gpu: str, tp: int, kv: str, weights: str, workload: str, slo):
    """load.predicted for a run's deployment and workload, at rates around the model's highest within the SLO."""
    from bench.model import Config, load_workload, search_rate, workload_names

    wl = load_workload(workload if workload in workload_names() else "chat")
    dep = Config(gpu, tp, kv_dtype=kv, weights=weights).deployment(model)
    best = search_rate(dep, wl, slo)
    return None if best is None or best.rate_rps <= 0 else load.predicted(dep, wl, slo, best)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


rows = []
for r in chosen:
    s, c, cap = sums[r], configs.loc[r], capacity_of(r)
    tp = int(c.tp) if pd.notna(c.tp) else None
    cost = price * tp / 3600 / s["output_tps"] * 1e6 if tp and s["output_tps"] else None
    gpus = f"{tp}x {str(c.gpu).upper()}" if tp and pd.notna(c.gpu) else "the modelled GPUs"
    rows.append({"run": shorts[r], "identity": c.identity, "figures from": runinfo.clock(s["time_scale"],
                                                                                       bool(c.twin), gpus),
                 POOL: cap["kv_pool_tokens"], "output tokens/s": s["output_tps"],
                 "goodput req/s": s["goodput_rps"], "achieved req/s": s["achieved_rate_rps"],
                 "TTFT p50 ms": _ms(s["ttft_p50"]), "TPOT p50 ms": _ms(s["tpot_p50"]), "E2E p99 ms": _ms(s["e2e_p99"]),
                 "SLO attainment %": None if s["slo_attainment"] is None else s["slo_attainment"] * 100,
                 "SLO judged by": runinfo.slo_said(s), "$ per 1M output tokens": cost})
side = pd.DataFrame(rows)
base = side.iloc[0]
gains = side[["run"]].copy()
for col in (POOL, "output tokens/s", "goodput req/s", "TPOT p50 ms", "$ per 1M output tokens"):
    gains[f"{col} vs first"] = side[col] / base[col] if base[col] else None
st.subheader("Side by side")
st.dataframe(side, hide_index=True, key="side_table")
st.caption(f"{POOL}: SGLang's memory arithmetic for the run's deployment (a twin's at its own memory fraction), "
           "not a measurement. Every other figure is measured; a twin's converted to the time of the GPUs it models "
           "(\"figures from\").")
st.dataframe(gains, hide_index=True, key="gains_table")

figures = side.melt(id_vars=["run"], value_vars=[POOL, "output tokens/s", "goodput req/s",
                                                 "$ per 1M output tokens"], var_name="figure").dropna()
common.chart(st, charts.compare_bars(figures, "Capacity, throughput and cost"))
pct = pd.concat([runinfo.percentile_rows(sums[r]).assign(run=shorts[r]) for r in chosen])
pct = pct[pct.metric.isin(["TTFT", "TPOT", "E2E"])]
if not pct.empty:
    common.chart(st, charts.latency_percentiles(pct, "Latency percentiles by run (ms)"))

with st.expander("Every compared figure (store query, ratios to the first run)"):
    st.dataframe(common.read(runinfo.compare, chosen, slo), key="compare_table")

st.subheader("Latency against load")
curve_runs = list(dict.fromkeys(x for r in chosen for x in load.sweep_runs(runs, r)))
measured_curve = common.read(load.measured, curve_runs, slo)
first = runs.set_index("run_id").loc[chosen[0]]
predicted_curve = None
if pd.notna(first.model) and pd.notna(first.gpu) and pd.notna(first.tp):
    predicted_curve = predicted_load(first.model, first.gpu, int(first.tp), first.kv_dtype or "bf16",
                                  first.weights or "native", first.workload or "chat", slo)
curve = pd.concat([x for x in (measured_curve, predicted_curve) if x is not None and not x.empty])
if not curve.empty:
    common.chart(st, charts_load.latency_vs_load(curve, slo, "Measured and predicted"), height=520)
    st.caption("Measured: every run of the same deployment and workload as a compared run (a sweep's stages "
               "together). Predicted: capbench simulate at rates around the highest rate the model gives within the "
               f"SLO, for the first run's deployment and workload: {common.md_text(identity.short(first.to_dict()))}.")

st.subheader("Measured vs predicted")
mvp = [common.read(measured_vs_predicted, r, slo) for r in chosen]
pred_rows = pd.DataFrame([dict(row, run=shorts[m["run_id"]]) for m in mvp for row in m["rows"]])
for m in mvp:
    if not m["rows"]:
        st.caption(common.md_text(f"{labels[m['run_id']]}: no prediction ({m.get('why_not', 'unknown')})."))
if not pred_rows.empty:
    common.chart(st, charts.measured_vs_predicted(pred_rows))
    shown = pred_rows[["run", "figure", "measured", "predicted", "error"]].copy()
    shown["error"] = shown["error"].map(lambda e: "n/a" if pd.isna(e) else f"{e:+.1%}")
    shown["80 % interval"] = [("-" if pd.isna(lo) else f"{lo:,.1f}-{hi:,.1f}")
                              for lo, hi in zip(pred_rows["low"], pred_rows["high"], strict=True)]
    shown["inside"] = pred_rows["inside"].map(lambda x: "-" if x is None or pd.isna(x) else "yes" if x else "no")
    st.dataframe(shown, hide_index=True, key="prediction_table")
    st.caption("Prediction: capbench simulate replays each run (same deployment, workload, rate and number of "
               "requests); output tokens/s over the arrival window less its first 20 %, as the simulator counts it; "
               "error = predicted / measured - 1. The 80 % interval is the model's out-of-sample error on the "
               "published corpus (output tokens/s only where the replay runs at capacity: below it the offered load "
               "is served whatever the error). Runs under 50 requests are too short to judge a model by.")

drift = common.read(runinfo.drift)
if drift is not None:  # the drift table exists (capbench drift); quality next to speed
    st.subheader("Quality drift (capbench drift runs)")
    if drift.empty:
        st.caption("No drift runs yet: `capbench drift --target URL_A --target URL_B` compares two servers' answers "
                   "token by token (e.g. BF16 KV against FP8 KV).")
    else:
        st.dataframe(drift, hide_index=True, key="drift_table")
