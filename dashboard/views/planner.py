"""Planner: a deployment and a workload in, capacity, predicted throughput at the SLO, cost, GPUs needed for a
target rate, and the four-way comparison (BF16 vs FP8 KV, native vs INT4 experts) out. Needs no DB."""

from __future__ import annotations

import os

import pandas as pd
import streamlit as st

from bench.errors import BadInput
from bench.model import Plan, Question, Slo, capacity, catalog, for_plan, format_table, make_plan, workload_names
from bench.model.answer import make_headline
from bench.model.pd import versus as pd_versus
from bench.report import charts, compared, formats_section, gpu_bests, load, plancharts, predicted_table, wording
from bench.report import pd as pd_report
from dashboard import common
from dashboard.common import fmt

st.title("Planner")
st.caption("SGLang 0.5.23's memory arithmetic and capbench simulate's scheduler, each step priced from published "
           "per-kernel SGLang measurements (the roofline where none exist, said per answer): no GPU, no runs needed.")

models, gpus = catalog.models(), catalog.gpus()
c1, c2, c3, c4 = st.columns(4)
model_id = c1.selectbox("Model", sorted(models), index=sorted(models).index("kimi-k2-thinking"), key="model")
gpu_id = c2.selectbox("GPU", sorted(gpus), index=sorted(gpus).index("h200"), key="gpu")
tp = c3.selectbox("TP (GPUs per instance)", [1, 2, 4, 8, 16, 32], index=3, key="tp")
gpu_count = c4.number_input("GPUs on hand", min_value=tp, value=max(tp, 8), step=tp, key=f"gpus_{tp}")

c1, c2, c3, c4 = st.columns(4)
kv_dtype = c1.selectbox("KV cache dtype", list(capacity.KV_DTYPES), index=1, key="kv_dtype")
weights = c2.selectbox("Expert weights", list(capacity.WEIGHTS), key="weights",
                       help="native: as the checkpoint ships (Kimi K2 Thinking: INT4 g32; GLM-4.x: BF16)")
model = models[model_id]
context = c3.number_input("Context length", min_value=1024, max_value=model.max_context, value=model.max_context,
                          step=1024, key=f"context_{model_id}")
price = c4.number_input("$ per GPU-hour", min_value=0.0, value=float(gpus[gpu_id].price_per_gpu_hour), step=0.1,
                        key=f"price_{gpu_id}", help="Indicative on-demand price from data/gpus.yaml: use your quote.")

c1, c2, c3, c4, c5 = st.columns(5)
mixes = [*workload_names(), "custom"]
workload = c1.selectbox("Workload", mixes, index=mixes.index("chat") if "chat" in mixes else 0, key="workload",
                        help="Request mixes from data/workloads (as `capbench simulate --workload`), or fixed lengths")
custom = workload == "custom"
input_tokens = c2.number_input("Input tokens (custom)", min_value=1, value=2000, step=100, key="in_tokens",
                               disabled=not custom)
output_tokens = c3.number_input("Output tokens (custom)", min_value=1, value=500, step=50, key="out_tokens",
                                disabled=not custom)
slo_ttft = c4.number_input("SLO: TTFT (s)", min_value=0.01, value=2.0, step=0.1, key="slo_ttft")
slo_tpot = c5.number_input("SLO: TPOT (ms)", min_value=1.0, value=50.0, step=5.0, key="slo_tpot")
c1, c2, c3 = st.columns([1, 1, 2])
slo_p = c1.selectbox("SLO percentile", [50, 90, 99], index=1, key="slo_p", format_func=lambda p: f"p{p}")
target = c2.number_input("Target load (requests/s)", min_value=0.01, value=10.0, step=1.0, key="target_rate")
searched = c3.multiselect("GPUs to search", sorted(gpus), default=[gpu_id], key="search_gpus",
                          help="The search covers tp, DP attention, EP, KV dtype and expert weights on these GPUs "
                               "(capbench plan --gpus); more GPUs take longer the first time, then come from the cache")

q = Question(model=model_id, gpu=gpu_id, tp=int(tp), gpus=int(gpu_count), kv_dtype=kv_dtype, weights=weights,
             context=int(context), workload=None if custom else workload, input_tokens=int(input_tokens),
             output_tokens=int(output_tokens), slo=Slo(ttft_s=slo_ttft, tpot_s=slo_tpot / 1e3, percentile=slo_p),
             price_per_gpu_hour=price, target_rate_rps=target, search_gpus=tuple(searched or [gpu_id]))
st.caption(wording.prices(q))  # the price input is the chosen GPU's: which GPU is costed at what


@st.cache_data(show_spinner=False, max_entries=64)
def plan_for(q: Question) -> Plan:
    bar = st.progress(0.0, text="sizing the configurations")

    def progress(stage: str, done: int, total: int) -> None:
        bar.progress(min(done / max(total, 1), 1.0), text=f"{stage}: {done} of {total}")

    # as capbench plan: one search process a core, the curves drawn by them too
    plan = make_plan(q, progress, workers=os.cpu_count() or 1, curves=True)
    bar.empty()
    return plan


@st.cache_data(show_spinner="prefill/decode disaggregated shapes", max_entries=64)
def versus_for(q: Question) -> pd_versus.Versus:
    return pd_versus.compare(plan_for(q))


@st.cache_data(show_spinner="latency against load", max_entries=64)
def latency_curve(q: Question) -> pd.DataFrame:
    rec = plan_for(q).recommended
    return load.predicted(rec.config.deployment(q.model, q.context), q.request_mix(), q.slo, rec.prediction)


@st.cache_data(show_spinner="throughput against speed per user, over concurrency", max_entries=64)
def curves_for(q: Question) -> dict:
    return plan_for(q).curves()


try:
    plan = plan_for(q)
except BadInput as e:
    st.error(str(e))
    st.stop()

head = make_headline(plan, versus_for(q))
st.subheader("The answer")
(st.success if head.kind != "none" else st.error)("  \n".join(wording.headline_lines(head, 10**6, launch=False)))
if head.launch:
    st.code("\n".join(head.launch), language="bash", wrap_lines=True)
made = for_plan(plan)  # what the intervals leave open, measured for this very question
if made is not None:
    st.download_button("Download a campaign file that measures the colocated answer", made.text, made.file_name,
                       "text/yaml", key="campaign_file",
                       help="The recommended colocated deployment against BF16 KV and the shipped weights, under this "
                            "workload and SLO: `capbench campaign FILE --check`, then run it on the GPU host."
                       + (f" It reads {made.workload_name} (the fixed lengths), also offered." if
                          made.workload_name else ""))
    if made.workload_name:
        st.download_button(f"Download {made.workload_name} (its workload)", made.workload_text or "",
                           made.workload_name, "text/yaml", key="campaign_workload")

chosen, cap = plan.chosen, plan.chosen.capacity
pred = chosen.prediction
rec = plan.recommended
st.subheader(f"Your configuration: {model.name} on {tp} x {gpus[gpu_id].name}, {chosen.short_label}")
if not cap.fits:
    st.error(wording.does_not_fit(chosen))
serves = chosen.serves
m = st.columns(4)
m[0].metric("KV pool tokens", fmt(cap.kv_pool_tokens, ",d"), help="SGLang's max_total_num_tokens")
m[1].metric(f"Sequences at {int(context):,} tokens", fmt(cap.max_concurrent_sequences_at_context, ",d"))
m[2].metric("Weights per GPU", fmt(cap.weight_bytes_per_gpu / 1e9, ",.1f", " GB"))
m[3].metric("Max running requests", fmt(cap.max_running_requests, ",d"))
m = st.columns(4)
none = "does not fit" if not cap.fits else wording.NONE_MEETS
m[0].metric("Max rate within SLO (req/s)", fmt(pred.rate_rps, ",.2f") if serves else none,
            help="Per instance (one set of tp GPUs): the highest Poisson rate whose percentiles meet the SLO")
m[1].metric("Output tokens/s at that rate", fmt(pred.output_tps, ",.0f") if serves else none)
m[2].metric("$ per 1M output tokens", wording.money(chosen.usd_per_m_output, ",.2f", none))
m[3].metric(f"GPUs needed for {target:g} req/s", fmt(chosen.gpus_needed, ",d") if serves else none)
m = st.columns(4)
m[0].metric(f"Rate on {int(gpu_count)} GPUs (req/s)", fmt(chosen.rate_on_hand_rps, ",.2f") if serves else none)
m[1].metric(f"Monthly cost for {target:g} req/s", wording.money(chosen.monthly_cost, ",.0f", none))
m[2].metric(f"TPOT p{slo_p} at that rate (ms)", fmt(pred.tpot_s * 1e3, ",.1f") if serves else none)
m[3].metric("Limited by", f"{pred.limited_by}" if serves else none)
if serves:
    st.caption(wording.interval(chosen, slo_p))

four, rows = compared(plan)
st.subheader("What FP8 KV and INT4 experts buy")
st.caption(f"At {four[0].config.gpu.upper()} {four[0].config.parallelism()} (the recommended parallelism): gains "
           f"against {four[0].short_label}. Red: your choice." if four else "No configuration was simulated.")
df = pd.DataFrame(rows)
if four:
    left = right = st.container()  # one chart a row: in two columns the value labels and titles were cut off
    common.chart(left, charts.option_bars(df, "kv_pool_tokens", "KV pool tokens", gain_field="kv_pool_tokens_gain"))
    common.chart(right, charts.option_bars(df, "concurrent_seqs_at_context", f"Sequences at {int(context):,} tokens",
                                           gain_field="concurrent_seqs_at_context_gain"))
    common.chart(left, charts.option_bars(df, "output_tps", "Predicted output tokens/s at the SLO",
                                          gain_field="output_tps_gain"))
    common.chart(right, charts.option_bars(df, "usd_per_m_output", "$ per 1M output tokens", fmt=",.2f"))
    common.chart(left, charts.option_bars(df, "gpus_needed", f"GPUs for {target:g} req/s", fmt=",.0f"))
    common.chart(right, charts.option_bars(df, "monthly_cost", "Monthly cost ($)", fmt=",.0f"))
    head, body = predicted_table(plan)
    st.table(pd.DataFrame(body, columns=head).set_index("configuration"))


@st.cache_data(show_spinner="expert weight formats side by side", max_entries=64)
def formats_for(q: Question) -> tuple[list[str], list[list[str]]]:
    return formats_section(format_table.rows(q.model, q.gpu, q.tp, q.kv_dtype, q.request_mix(), q.slo, q.context,
                                             q.price_per_gpu_hour))


st.subheader(f"Expert weight formats on {gpus[gpu_id].name}")
st.caption("Each format at your TP and KV dtype: memory, KV room, and output tokens/s and $ per 1M at your SLO from "
           "the performance model (kernel tables where measured, else the roofline: `capbench formats` says which); "
           "the planner searches only formats this GPU runs with a real SGLang kernel and that ship or capbench "
           "makes.")
head, body = formats_for(q)
st.dataframe(pd.DataFrame(body, columns=head), hide_index=True, key="formats_table")
for note in plan.notes:
    st.warning(note)

if rec is not None:
    st.subheader("Latency against load")
    curve = latency_curve(q)
    common.chart(st, plancharts.latency_vs_load(curve, q.slo, f"Predicted for {rec.label}"), height=520)
    st.subheader("Every configuration that meets the SLO")
    every = pd.DataFrame(plan.rows())
    common.chart(st, plancharts.curves(curves_for(q)), height=560)
    left, right = st.columns(2)
    common.chart(left, plancharts.pareto_throughput(every), height=520)
    common.chart(right, plancharts.pareto_cost(every, slo_p), height=520)
    bests = gpu_bests(plan)
    if len(bests) > 1:
        common.chart(st, plancharts.gpu_comparison(pd.DataFrame([o.to_row() for o in bests]), target),
                     height=80 + 34 * len(bests))
    else:
        st.caption("Add GPUs to 'GPUs to search' to compare each GPU at its best configuration.")

st.subheader("Colocated vs prefill/decode disaggregated")
versus = versus_for(q)
st.table(pd.DataFrame(pd_report.versus_rows(versus)).set_index(""))
for line in pd_report.versus_lines(versus):
    st.markdown(f"- {line}")
with st.expander("Launch commands of the disaggregated answer"):
    st.code("\n".join(pd_report.launch_lines(versus)) or "no disaggregated shape serves the load", language="bash")

st.subheader("Every configuration searched, and why each lost")
every = pd.DataFrame(plan.rows())
shown = pd.DataFrame({
    "configuration": every["config"],
    "max req/s per instance": every["rate_rps"].map(lambda v: fmt(v, ",.2f") if pd.notna(v) and v else "-"),
    "output tok/s per GPU": every["output_tps_per_gpu"].map(lambda v: fmt(v, ",.0f") if pd.notna(v) and v else "-"),
    "tok/s per user": every["tps_per_user"].map(lambda v: fmt(v, ",.1f") if pd.notna(v) and v else "-"),
    "$ per 1M output tokens": every["usd_per_m_output"].map(lambda v: wording.money(v, ",.2f", "-")),
    f"GPUs for {target:g} req/s": every["gpus_needed"].map(lambda v: fmt(v, ",.0f") if pd.notna(v) and v else "-"),
    "monthly cost": every["monthly_cost"].map(lambda v: wording.money(v, ",.0f", "-")),
    "why not": every["rejected_because"].fillna(every["recommended"].map({True: "recommended", False: ""})),
})
st.dataframe(shown, hide_index=True, key="search_table", column_config={
    "configuration": st.column_config.TextColumn(width="large"), "why not": st.column_config.TextColumn(width="large")})
st.caption("Predictions: the search of `capbench plan` (the same figures as the CLI and `capbench report`): each "
           "finalist's highest Poisson rate within the SLO from capbench simulate's scheduler, simulated until it "
           "converges, with the performance model validated against published SGLang runs (`capbench validate`). "
           "Check them against measured runs (Compare page) before buying hardware.")
