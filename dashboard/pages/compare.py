"""Compare: two or more runs side by side: capacity, throughput, latency and cost with their gains against the
first run; measured against predicted with the prediction error; quality drift when a `drift` table exists."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from bench.errors import BadInput
from bench.model import capacity, catalog
from bench.report import charts, measured_vs_predicted
from bench.store import queries, runinfo
from dashboard import common

st.title("Compare")
if common.store() is None:
    st.stop()
runs = common.runs()
if len(runs) < 2:
    st.info("Compare needs at least two runs.")
    st.stop()
labels = {r: common.run_label(runs, r) for r in runs.run_id}


def default_pair() -> list[str]:
    """The newest pair worth comparing, older first (the baseline): two runs of one model, GPU, tp and label (the
    same load) that differ in KV dtype or weights; else two of one model, GPU and tp; else the newest two."""
    for keys in (["model", "gpu", "tp", "label"], ["model", "gpu", "tp"]):
        for _, group in runs.groupby(keys, sort=False, dropna=False):
            varied = group.drop_duplicates(["kv_dtype", "weights"]) if len(keys) == 4 else group
            if len(varied) >= 2:
                return list(varied.run_id[:2])[::-1]
    return list(runs.run_id[:2])[::-1]


chosen = st.multiselect("Runs (the first is the baseline for the gains)", list(labels), default=default_pair(),
                        format_func=labels.get, key="compare_runs")
if len(chosen) < 2:
    st.info("Pick at least two runs.")
    st.stop()
slo = common.slo_inputs("compare")
configs = runs.set_index("run_id").loc[chosen]
first_gpu = configs.iloc[0]["gpu"]
default_price = catalog.gpus()[first_gpu].price_per_gpu_hour if first_gpu in catalog.gpus() else 3.0
price = st.number_input("$ per GPU-hour", min_value=0.0, value=float(default_price), step=0.1, key="compare_price")

sums = {r: common.read(queries.summary, r, slo) for r in chosen}
names = [labels[r] for r in chosen]


def capacity_of(run_id: str) -> dict:
    c = configs.loc[run_id]
    try:
        dep = capacity.Deployment(catalog.model(c.model), catalog.gpu(c.gpu), int(c.tp),
                                  kv_dtype=c.kv_dtype or "bf16", weights=c.weights or "native")
        cap = capacity.capacity(dep, with_ratios=False)
        return {"kv_pool_tokens": cap.kv_pool_tokens, "weights_gb": cap.weight_bytes_per_gpu / 1e9}
    except (BadInput, TypeError, ValueError):
        return {"kv_pool_tokens": None, "weights_gb": None}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


rows = []
for r in chosen:
    s, c, cap = sums[r], configs.loc[r], capacity_of(r)
    tp = int(c.tp) if pd.notna(c.tp) else None
    cost = price * tp / 3600 / s["output_tps"] * 1e6 if tp and s["output_tps"] else None
    rows.append({"run": labels[r], "config": f"{c.model} {c.gpu} x{c.tp} {c.kv_dtype} KV {c.weights}"
                 + (" +checksum" if c.kv_checksum not in (None, "off") else ""),
                 "KV pool tokens": cap["kv_pool_tokens"], "output tokens/s": s["output_tps"],
                 "goodput req/s": s["goodput_rps"], "achieved req/s": s["achieved_rate_rps"],
                 "TTFT p50 ms": _ms(s["ttft_p50"]), "TPOT p50 ms": _ms(s["tpot_p50"]), "E2E p99 ms": _ms(s["e2e_p99"]),
                 "$ per 1M output tokens": cost})
side = pd.DataFrame(rows)
base = side.iloc[0]
gains = side[["run"]].copy()
for col in ("KV pool tokens", "output tokens/s", "goodput req/s", "TPOT p50 ms", "$ per 1M output tokens"):
    gains[f"{col} vs first"] = side[col] / base[col] if base[col] else None
st.subheader("Side by side")
st.dataframe(side, hide_index=True, key="side_table")
st.dataframe(gains, hide_index=True, key="gains_table")

figures = side.melt(id_vars=["run"], value_vars=["KV pool tokens", "output tokens/s", "goodput req/s",
                                                 "$ per 1M output tokens"], var_name="figure").dropna()
common.chart(st, charts.compare_bars(figures, "Capacity, throughput and cost"))
pct = pd.concat([runinfo.percentile_rows(sums[r]).assign(run=labels[r]) for r in chosen])
pct = pct[pct.metric.isin(["TTFT", "TPOT", "E2E"])]
if not pct.empty:
    common.chart(st, charts.latency_percentiles(pct, "Latency percentiles by run (ms)"))

with st.expander("Every compared figure (store query, ratios to the first run)"):
    st.dataframe(common.read(queries.compare, chosen, slo), key="compare_table")

st.subheader("Measured vs predicted")
mvp = [common.read(measured_vs_predicted, r, slo) for r in chosen]
pred_rows = pd.DataFrame([dict(row, run=labels[m["run_id"]]) for m in mvp for row in m["rows"]])
for m in mvp:
    if not m["rows"]:
        st.caption(f"{labels[m['run_id']]}: no prediction ({m.get('why_not', 'unknown')}).")
if not pred_rows.empty:
    common.chart(st, charts.measured_vs_predicted(pred_rows))
    shown = pred_rows[["run", "figure", "measured", "predicted", "error"]].copy()
    shown["error"] = shown["error"].map(lambda e: "n/a" if pd.isna(e) else f"{e:+.1%}")
    st.dataframe(shown, hide_index=True, key="prediction_table")
    st.caption("Prediction: capbench simulate replays each run (same deployment, workload, rate and number of "
               "requests); output tokens/s over the arrival window less its first 20 %, as the simulator counts it; "
               "error = predicted / measured - 1. Runs under 50 requests are too short to judge a model by.")

drift = common.read(runinfo.drift)
if drift is not None:  # the drift table exists (capbench drift); quality next to speed
    st.subheader("Quality drift (capbench drift runs)")
    if drift.empty:
        st.caption("No drift runs yet: `capbench drift --target URL_A --target URL_B` compares two servers' answers "
                   "token by token (e.g. BF16 KV against FP8 KV).")
    else:
        st.dataframe(drift, hide_index=True, key="drift_table")
