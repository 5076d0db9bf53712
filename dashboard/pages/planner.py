"""Planner: a deployment and a workload in, capacity, predicted throughput at the SLO, cost, GPUs needed for a
target rate, and the four-way comparison (BF16 vs FP8 KV, native vs INT4 experts) out. Needs no DB."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from bench.errors import BadInput
from bench.model import Plan, Question, Slo, capacity, catalog, make_plan, workload_names
from bench.model import launch as sglang_cmd
from bench.report import charts, compared
from dashboard.common import fmt

st.title("Planner")
st.caption("SGLang 0.5.23's memory arithmetic and capbench simulate's scheduler on the roofline performance model: "
           "no GPU, no runs needed.")

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


@st.cache_data(show_spinner=False, max_entries=64)
def plan_for(q: Question) -> Plan:
    bar = st.progress(0.0, text="sizing the configurations")

    def progress(stage: str, done: int, total: int) -> None:
        bar.progress(min(done / max(total, 1), 1.0), text=f"{stage}: {done} of {total}")

    plan = make_plan(q, progress)
    bar.empty()
    return plan


try:
    plan = plan_for(q)
except BadInput as e:
    st.error(str(e))
    st.stop()

chosen, cap = plan.chosen, plan.chosen.capacity
pred = chosen.prediction
st.subheader(f"{model.name} on {tp} x {gpus[gpu_id].name}: {chosen.label}")
if not cap.fits:
    st.error(f"Does not fit: short by {cap.short_by_bytes_per_gpu / 1e9:.1f} GB per GPU. Raise tp or use INT4 "
             "experts / FP8 KV.")
m = st.columns(4)
m[0].metric("KV pool tokens", fmt(cap.kv_pool_tokens, ",d"), help="SGLang's max_total_num_tokens")
m[1].metric(f"Sequences at {int(context):,} tokens", fmt(cap.max_concurrent_sequences_at_context, ",d"))
m[2].metric("Weights per GPU", fmt(cap.weight_bytes_per_gpu / 1e9, ",.1f", " GB"))
m[3].metric("Max running requests", fmt(cap.max_running_requests, ",d"))
m = st.columns(4)
m[0].metric("Max rate in SLO, per instance (req/s)", fmt(pred.rate_rps if pred else None, ",.2f"))
m[1].metric("Predicted output tokens/s (goodput)", fmt(pred.output_tps if pred else None, ",.0f"))
m[2].metric("$ per 1M output tokens", fmt(chosen.usd_per_m_output, ",.3f"))
m[3].metric(f"GPUs needed for {target:g} req/s", fmt(chosen.gpus_needed, ",d"))
m = st.columns(4)
m[0].metric(f"Rate on {int(gpu_count)} GPUs (req/s)", fmt(chosen.rate_on_hand_rps, ",.2f"))
m[1].metric("Monthly cost for the target", "$" + fmt(chosen.monthly_cost, ",.0f"))
m[2].metric(f"TPOT p{slo_p} at that rate (ms)", fmt(pred.tpot_s * 1e3 if pred else None, ",.1f"))
m[3].metric("Limited by", pred.limited_by if pred else "does not fit")

four, rows = compared(plan)
st.subheader("What FP8 KV and INT4 experts buy")
st.caption(f"At {four[0].config.gpu} {four[0].config.parallelism()} (the recommended parallelism): gains against "
           f"{four[0].short_label}. Red: your choice." if four else "No configuration was simulated.")
df = pd.DataFrame(rows)
left, right = st.columns(2)
left.altair_chart(charts.option_bars(df, "kv_pool_tokens", "KV pool tokens", gain_field="kv_pool_tokens_gain"))
right.altair_chart(charts.option_bars(df, "concurrent_seqs_at_context", f"Sequences at {int(context):,} tokens",
                                      gain_field="concurrent_seqs_at_context_gain"))
left.altair_chart(charts.option_bars(df, "output_tps", "Predicted output tokens/s at the SLO",
                                     gain_field="output_tps_gain"))
right.altair_chart(charts.option_bars(df, "usd_per_m_output", "$ per 1M output tokens", fmt=",.3f"))
left.altair_chart(charts.option_bars(df, "gpus_needed", f"GPUs for {target:g} req/s", fmt=",.0f"))
right.altair_chart(charts.option_bars(df, "monthly_cost", "Monthly cost ($)", fmt=",.0f"))
table = df[["config", "fits", "weights_gb_per_gpu", "kv_pool_tokens", "kv_pool_tokens_gain",
            "concurrent_seqs_at_context", "batch", "rate_rps", "output_tps", "tpot_s", "ttft_s", "limited_by",
            "usd_per_m_output", "gpus_needed", "monthly_cost"]]
st.dataframe(table.round(3), hide_index=True, key="options_table")
for note in plan.notes:
    st.warning(note)
st.subheader("Every configuration searched")
every = pd.DataFrame(plan.rows())
st.dataframe(every[["config", "rate_rps", "output_tps_per_gpu", "tps_per_user", "usd_per_m_output", "gpus_needed",
                    "monthly_cost", "rejected_because"]].round(3), hide_index=True, key="search_table")

rec = plan.recommended
st.subheader("Recommendation")
if rec is None:
    st.error("No configuration searched serves this workload within the SLO: relax the SLO, shorten the requests, "
             "or search more GPUs (the table below says why each configuration lost).")
else:
    saving = (chosen.monthly_cost - rec.monthly_cost) if chosen.monthly_cost and rec.monthly_cost else None
    st.success(f"{rec.gpus_needed} x {rec.config.gpu} ({rec.instances_needed} instance(s) of "
               f"{rec.config.parallelism()}) with {rec.short_label}: ${fmt(rec.monthly_cost, ',.0f')} a month for "
               f"{target:g} req/s, ${fmt(rec.usd_per_m_output, ',.2f')} per 1M output tokens"
               + (f", ${fmt(saving, ',.0f')} a month less than your configuration." if saving else "."))
    single, multi = sglang_cmd.commands(model_id, rec.config.gpu, rec.tp, rec.kv_dtype, rec.weights, int(context))
    if single:
        st.code(single, language="bash", wrap_lines=True)
    with st.expander("Multi-node (one instance over several nodes)", expanded=single is None):
        st.code("\n".join(multi), language="bash", wrap_lines=True)
st.caption("Predictions: the search of `capbench plan` (the same figures as the CLI and `capbench report`): each "
           "finalist's highest Poisson rate within the SLO from capbench simulate's scheduler, simulated until it "
           "converges, with the performance model validated against published SGLang runs (`capbench validate`). "
           "Check them against measured runs (Compare page) before buying hardware.")
