"""Integrity: KV page checksums per run: pages checksummed and verified, mismatches, and their overhead
(checksum host time per second of run, and throughput against the same deployment measured without checksums)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from bench.report import charts
from bench.store import identity, runinfo
from dashboard import common
from dashboard.common import TS_HEIGHT, fmt

st.title("Integrity")
if common.store() is None:
    st.stop()
runs = common.runs()
labels = {r: common.run_label(runs, r) for r in runs.run_id}
KEY = ["model", "gpu", "tp", "kv_dtype", "weights"]


def baseline_tps(row: pd.Series) -> float | None:
    """Mean output tokens/s of runs of the same deployment with checksums off."""
    same = runs[(runs.kv_checksum == "off") & (runs.run_id != row.run_id)]
    for k in KEY:
        same = same[same[k] == row[k]]
    values = [common.read(runinfo.summary, r)["output_tps"] for r in same.run_id]
    values = [v for v in values if v]
    return sum(values) / len(values) if values else None


with_data = set(common.read(runinfo.runs_with_integrity))
rows = []
for _, row in runs[runs.run_id.isin(with_data) | (runs.kv_checksum != "off")].iterrows():
    info = common.read(runinfo.integrity, row.run_id)
    tps = common.read(runinfo.summary, row.run_id)["output_tps"]
    base = baseline_tps(row)
    rows.append({"run": labels[row.run_id], "run_id": row.run_id, "mode": row.kv_checksum,
                 "pages_checksummed": info["pages_checksummed"], "pages_verified": info["pages_verified"],
                 "mismatches": info["mismatches"], "events": sum(info["events"].values()),
                 "checksum time share %": info["checksum_share"] * 100 if info["checksum_share"] is not None else None,
                 "throughput overhead %": (1 - tps / base) * 100 if tps and base else None})
if not rows:
    st.info("No run has KV checksum data. Launch SGLang with `capbench sglang-launch --kv-checksum verify -- "
            "--model-path ... --enable-metrics` and run a load test against it (`capbench run --target URL`): the "
            "server sampler records the capbench_kv_* counters.")
    st.stop()
table = pd.DataFrame(rows).sort_values(["mismatches", "pages_verified"], ascending=False, na_position="last")
m = st.columns(4)
m[0].metric("Runs with checksums", len(table))
m[1].metric("Pages verified", fmt(table.pages_verified.sum(), ",.0f"))
m[2].metric("Mismatches", fmt(table.mismatches.sum(), ",.0f"))
m[3].metric("Worst throughput overhead", fmt(table["throughput overhead %"].max(), ".2f", " %"))
HEADERS = {"run_id": "run id", "mode": "checksum mode", "pages_checksummed": "pages checksummed",
           "pages_verified": "pages verified"}
st.dataframe(table.rename(columns=HEADERS).round(3), hide_index=True, key="integrity_table")
st.caption("Throughput overhead: output tokens/s against runs of the same model, GPU, tp, KV dtype and weights "
           "with checksums off (n/a when there is none). Checksum time share: capbench_kv_checksum_seconds per "
           "second of the run, summed over the server's processes.")
short = {r: f"{identity.short(x)} ({r[-6:]})" for r, x in zip(runs.run_id, runs.to_dict("records"), strict=True)}
bars = table.assign(run=table.run_id.map(short)).melt(id_vars=["run"], value_vars=[
    "pages_checksummed", "pages_verified", "mismatches"],
                  var_name="counter").dropna()
if not bars.empty:
    common.chart(st, charts.integrity_bars(bars))

run_id = st.selectbox("Run", list(table.run_id), format_func=labels.get, key="integrity_run")
series = common.read(runinfo.kv_counter_series, run_id)
if not series.empty:
    pages = series[series.counter.isin(["pages_checksummed", "pages_verified"])]
    bad = series[series.counter == "checksum_mismatch"]
    c1, c2 = st.columns(2)
    common.chart(c1, charts.timeseries(pages, "value", "KV pages checksummed and verified", color="counter",
                                      y_title="pages"), height=TS_HEIGHT)
    common.chart(c2, charts.timeseries(bad, "value", "Checksum mismatches", y_title="mismatches"), height=TS_HEIGHT)
events = common.read(runinfo.integrity_events, run_id)
st.subheader(f"Integrity events ({len(events)})")
if events.empty:
    st.caption("No mismatches logged in this run.")
else:
    events["t"] = pd.to_datetime(events["t"], unit="s", utc=True)
    st.dataframe(events, hide_index=True, key="events_table")
