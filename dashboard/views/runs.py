"""Runs: a filterable list of every run's identity; for one run its latency percentiles, TTFT, ITL and E2E
distributions (log bins on log axes) and the ITL CDF, throughput, latency and concurrency over time (lines break
where there is no data), GPU telemetry and server metrics on the same time axis. A twin's figures are in the
modelled GPUs' time (runinfo.summary/series)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from bench.campaign import stage_counts
from bench.report import charts, load, plancharts, run_stage
from bench.store import identity, queries, runinfo
from dashboard import common
from dashboard.common import TS_HEIGHT, fmt

st.title("Runs")
if common.store() is None:
    st.stop()
runs = common.runs()

with st.expander("Filter", expanded=True):
    c1, c2, c3, c4 = st.columns(4)
    status = c1.multiselect("Status", sorted(runs.status.dropna().unique()), key="f_status")
    model = c2.multiselect("Model", sorted(runs.model.dropna().unique()), key="f_model")
    kv = c3.multiselect("KV dtype", sorted(runs.kv_dtype.dropna().unique()), key="f_kv")
    text = c4.text_input("Label contains", key="f_label")
shown = runs
if status:
    shown = shown[shown.status.isin(status)]
if model:
    shown = shown[shown.model.isin(model)]
if kv:
    shown = shown[shown.kv_dtype.isin(kv)]
if text:
    shown = shown[shown.label.fillna("").str.contains(text, case=False, regex=False)]
st.caption(f"{len(shown)} of {len(runs)} runs")
st.dataframe(identity.runs_display(shown), hide_index=True, key="runs_table")
if shown.empty:
    st.stop()
if st.button("Refresh", help="Re-read the DB (a running run keeps writing)"):
    st.cache_data.clear()

labels = {r: common.run_label(runs, r) for r in shown.run_id}
run_id = st.selectbox("Run", list(labels), format_func=labels.get, key="run")
own = common.own_slo(runs, run_id)
if own is not None:  # a campaign stage, or a run given --slo: judged by the SLO it ran under, as its verdict was
    st.caption(common.md_text(f"Judged by the SLO this run ran under: {own.describe()}. Goodput, SLO attainment "
                              "and the load curve below use it."))
    slo = own
else:
    slo = common.slo_inputs("runs")
res = st.select_slider("Time resolution (s)", [0.5, 1.0, 2.0, 5.0, 10.0], value=1.0, key="resolution")

s = common.read(runinfo.summary, run_id, slo)
st.subheader(common.md_text(runs.set_index("run_id").loc[run_id, "identity"]))
st.caption(f"Run {run_id}, {s['status']}"
           + (f". A twin that ran {s['time_scale']:g}x faster than the GPUs it models: every figure here is in the "
              "modelled GPUs' time (rates / {k:g}, latencies x {k:g}), the SLO judged on that time."
              .format(k=s["time_scale"]) if s["time_scale"] != 1 else "."))
m = st.columns(5)
m[0].metric("Measured requests", fmt(s["measured"], ",d"))
m[1].metric("Success rate", fmt(s["success_rate"] * 100 if s["success_rate"] is not None else None, ".1f", " %"))
m[2].metric("Achieved rate (req/s)", fmt(s["achieved_rate_rps"], ",.2f"))
m[3].metric("Output tokens/s (run average)", fmt(s["output_tps"], ",.0f"))
m[4].metric("Goodput (req/s in SLO)", fmt(s["goodput_rps"], ",.2f"))
m = st.columns(5)
attained = s["slo_attainment"] * 100 if s["slo_attainment"] is not None else None
m[0].metric("SLO attainment" + (" (its own SLO)" if s["slo_own"] else ""), fmt(attained, ".1f", " %"))
m[1].metric("TTFT p50 (ms)", fmt(s["ttft_p50"] * 1e3 if s["ttft_p50"] is not None else None))
m[2].metric("TTFT p99 (ms)", fmt(s["ttft_p99"] * 1e3 if s["ttft_p99"] is not None else None))
m[3].metric("TPOT p50 (ms)", fmt(s["tpot_p50"] * 1e3 if s["tpot_p50"] is not None else None))
m[4].metric("Dispatch lag max (ms)", fmt(s["dispatch_lag_max"] * 1e3 if s["dispatch_lag_max"] is not None else None))
if s["errors_by_kind"]:
    st.caption("Errors: " + ", ".join(f"{k} {v}" for k, v in s["errors_by_kind"].items()))
stage = common.read(run_stage, run_id)
if stage is not None:  # a campaign's sweep stage: every request it sent judged (bench/campaign/stage.py)
    p = stage["point"] or {}
    st.markdown("**Campaign stage** " + common.md_text(f"of {stage['cell']} ({stage['campaign']}): " + (
        stage_counts(p) + (f"; {p['rate']:.3g} req/s offered, " + ("within the SLO" if p.get("meets") else
                                                                   f"missed the SLO: {p.get('why')}")
                           if p.get("rate") is not None else "")
        if p else "the cell has not recorded this stage (still running, or failed)")))
    if p:
        m = st.columns(5)
        for col, key in zip(m, ("sent", "completed", "missed", "cut_off", "errored"), strict=True):
            col.metric(f"Stage: {key.replace('_', ' ')}", fmt(p.get(key), ",d"))

curve = load.sweep_runs(runs, run_id)
if len(curve) > 1:  # a sweep, or other runs of this deployment and workload at other rates: the load curve
    common.chart(st, plancharts.latency_vs_load(common.read(load.measured, curve, slo), slo,
                                                f"Latency against load: the {len(curve)} runs of this deployment"),
                 height=520)
pct = runinfo.percentile_rows(s)
if not pct.empty:
    common.chart(st, charts.latency_percentiles(pct))
if s.get("summary_only"):  # imported from a tool's summary: no request to chart
    st.info(s["summary_only"].capitalize() + ": the file held no per-request times, so there are no distributions "
            "or time series to show.")
    st.stop()
dists = {m: common.read(runinfo.distribution, run_id, m) for m in ("ttft", "itl", "e2e")}
c1, c2 = st.columns(2)
for col, metric, title, unit in ((c1, "ttft", "Time to first token", "requests"),
                                 (c2, "itl", "Inter-token latency (every gap between tokens)", "gaps"),
                                 (c1, "e2e", "End-to-end latency", "requests")):
    if dists[metric].empty:
        col.caption(f"No {metric.upper()} values in this run.")
    else:
        common.chart(col, charts.distribution(dists[metric], title, unit), height=300)
if not dists["itl"].empty:
    common.chart(c2, charts.cdf(dists["itl"], "Inter-token latency: share of gaps at or below"), height=300)

series = common.read(runinfo.series, run_id, res)
gpu = common.read(queries.gpu_series, run_id, res)
names = common.read(runinfo.server_metric_names, run_id)
shown_metrics = st.multiselect("Server metrics to chart", names, key=f"metrics_{run_id}",
                               default=[n for n in runinfo.SERVER_METRICS if n in names])
server = {n: common.read(runinfo.server_series, run_id, n, res)
          for n in dict.fromkeys(["sglang:num_running_reqs", "sglang:num_queue_reqs", *shown_metrics]) if n in names}
spans = [df.elapsed_s for df in (series, gpu, *server.values()) if not df.empty]
if not spans:
    st.info("No time series yet: the run has written no finished requests or samples.")
    st.stop()
domain = (0.0, float(max(x.max() for x in spans)) + res)

st.subheader("Over time (one time axis)")
if not series.empty:
    common.chart(st, charts.timeseries(series, "output_tps", "Output tokens/s", domain, y_title="tokens/s",
                                      step=res), height=TS_HEIGHT)
    common.chart(st, charts.timeseries(series, "rps", "Completed requests/s", domain, y_title="req/s", step=res),
                    height=TS_HEIGHT)
    for metric, name in (("ttft", "Time to first token"), ("tpot", "Time per output token")):
        lat = series.melt(id_vars=["elapsed_s"], value_vars=[f"{metric}_p50", f"{metric}_p99"], var_name="latency")
        lat["ms"] = lat["value"] * 1e3
        lat["latency"] = lat["latency"].str.replace(f"{metric}_", "")
        common.chart(st, charts.timeseries(lat, "ms", f"{name} per slot, p50 and p99 (no line: nothing finished)",
                                          domain, color="latency", y_title="ms", step=res), height=TS_HEIGHT)
if "sglang:num_running_reqs" in server:
    conc = pd.concat([server[n].assign(metric=n.removeprefix("sglang:")) for n in
                      ("sglang:num_running_reqs", "sglang:num_queue_reqs") if n in server])
    common.chart(st, charts.timeseries(conc, "value", "Concurrency: running and queued requests", domain,
                                      color="metric", y_title="requests", step=res), height=TS_HEIGHT)
if not gpu.empty:
    where = gpu["node"].map(lambda n: f"{n} " if isinstance(n, str) else "")  # a node's DCGM rows, or NVML here
    gpu["gpu"] = where + "GPU " + gpu["gpu"].astype(str)
    for y, title in (("gpu_util_pct", "GPU utilisation (%)"), ("power_w", "GPU power (W)"),
                     ("mem_used_mib", "GPU memory used (MiB)")):
        common.chart(st, charts.timeseries(gpu, y, title, domain, color="gpu", y_title=title, step=res),
                        height=TS_HEIGHT)
else:
    st.caption("No GPU samples in this run (no NVML on the machine that ran it).")
if s["time_scale"] != 1 and server:
    st.caption(f"Server metrics of a {runinfo.clock(s['time_scale'], True)}: on the same time axis; rates "
               f"({', '.join(runinfo.RATE_METRICS)}) divided by {s['time_scale']:g} like every rate here, the other "
               "values (counts, shares, GB) as the twin reported them.")
for name, df in server.items():
    if name in ("sglang:num_running_reqs", "sglang:num_queue_reqs"):
        continue
    title = name + (f" (twin x{s['time_scale']:g}, per modelled second)" if s["time_scale"] != 1
                    and name in runinfo.RATE_METRICS else "")
    common.chart(st, charts.timeseries(df, "value", title, domain, y_title=name.removeprefix("sglang:"), step=res),
                    height=TS_HEIGHT)
