"""What the report and the Planner say in words: the question, the answer, what FP8 KV and INT4 experts save and
what they risk (quality: the drift runs' result, or "not yet checked"), why a configuration does not fit, and
figures written with their units, or plainly when there is none ("no rate meets the SLO", never "$n/a")."""

from __future__ import annotations

import pandas as pd

from bench.model import HOURS_PER_MONTH, Option, Plan, Question, capacity, catalog

NONE_MEETS = "no rate meets the SLO"


def money(v: float | None, spec: str = ",.0f", none: str = NONE_MEETS) -> str:
    return none if v is None or pd.isna(v) else f"${format(v, spec)}"


def num(v: float | None, spec: str = ",.0f", unit: str = "", none: str = "-") -> str:
    return none if v is None or pd.isna(v) else f"{format(v, spec)}{unit}"


def experts(o: Option) -> str:
    return capacity.weight_formats(catalog.model(o.model), o.weights)[0]


def converted(o: Option) -> bool:
    """The expert weights are not the checkpoint's own: capbench converts them (a quality risk to check)."""
    return experts(o) != capacity.weight_formats(catalog.model(o.model), "native")[0]


def quality(drift: pd.DataFrame | None, model: str, what: str) -> str:
    """The drift runs' word on `what` ('fp8 KV' or 'int4 experts') for `model`, or 'not yet checked'."""
    key = {"fp8 KV": "kv=fp8", "int4 experts": "weights=int4"}[what]
    family = model.split("-")[0]
    rows = pd.DataFrame() if drift is None or drift.empty or "target_b" not in drift else drift[
        drift.apply(lambda r: any(key in str(t) and family in str(t).lower() for t in (r.target_a, r.target_b)),
                    axis=1)]
    if rows.empty:
        return (f"quality not yet checked: run `capbench drift --target <BF16 server> --target <{what} server>` "
                "before rollout")
    r = rows.iloc[0]
    return (f"quality checked by capbench drift (run {r.run_id}, {r.prompts:.0f} prompts): "
            f"{r.token_agreement:.1%} of tokens agree, {r.exact_match_rate:.0%} of answers identical")


def does_not_fit(o: Option) -> str:
    """Why a configuration does not fit and what would: more GPUs or INT4 experts; FP8 KV only when the weights
    fit and the KV cache is what runs out."""
    c = o.capacity
    weights_only = c.kv_budget_bytes_per_gpu <= 0
    fixes = []
    for tp in (2 * o.tp, 4 * o.tp):
        try:
            dep = capacity.Deployment(catalog.model(o.model), catalog.gpu(o.config.gpu), tp, kv_dtype=o.kv_dtype,
                                      weights=o.weights)
            if capacity.capacity(dep, with_ratios=False).fits:
                fixes.append(f"spread them over {tp} GPUs (tp {tp})")
                break
        except Exception:  # noqa: BLE001 - a tp the model or GPU cannot take is simply not offered
            continue
    if "int4" not in experts(o):
        fixes.append("use INT4 experts (a quality risk to check with capbench drift)")
    if not weights_only and o.kv_dtype == "bf16":
        fixes.append("use an FP8 KV cache")
    what = (f"the weights alone need {c.weight_bytes_per_gpu / 1e9:,.1f} GB per GPU, "
            f"{c.short_by_bytes_per_gpu / 1e9:,.1f} GB more than each GPU has for them" if weights_only else
            f"after the weights ({c.weight_bytes_per_gpu / 1e9:,.1f} GB per GPU) no room is left for a KV cache page")
    return f"Does not fit: {what}. " + ("To fit: " + "; or ".join(fixes) + "." if fixes else "")


def savings(plan: Plan, drift: pd.DataFrame | None = None) -> list[str]:
    """What FP8 KV and INT4 experts save at the recommended GPU and parallelism, each with its risk."""
    rec = plan.recommended
    if rec is None:
        return []
    four = plan.four_way()
    out = []
    bf16 = next((o for o in four if o.weights == rec.weights and o.kv_dtype == "bf16"), None)
    fp8 = next((o for o in four if o.weights == rec.weights and o.kv_dtype != "bf16"), None)
    if bf16 and fp8:
        out.append(_saving("FP8 KV cache", bf16, fp8, quality(drift, plan.question.model, "fp8 KV"),
                           fp8 is rec or bf16 is rec))
    native = next((o for o in four if o.kv_dtype == rec.kv_dtype and not converted(o)), None)
    conv = next((o for o in four if o.kv_dtype == rec.kv_dtype and converted(o)), None)
    if native and conv:
        risk = quality(drift, plan.question.model, "int4 experts") if "int4" in experts(conv) else \
            "capbench converts them; check quality with capbench drift"
        out.append(_saving(f"{experts(conv).upper()} experts (converted from the checkpoint's "
                           f"{experts(native).upper()})", native, conv, risk, True))
    return out


def _saving(what: str, before: Option, after: Option, risk: str, relevant: bool) -> str:
    a, b = before.monthly_cost, after.monthly_cost
    gains = []
    if before.capacity.kv_pool_tokens:
        gains.append(f"{after.capacity.kv_pool_tokens / before.capacity.kv_pool_tokens:.2f}x the KV cache tokens")
    if before.serves and after.serves:
        gains.append(f"{after.prediction.rate_rps / before.prediction.rate_rps:.2f}x the requests/s per instance")
    gain = f" ({', '.join(gains)})" if gains else ""
    if a is None and b is None:
        return f"{what}: neither with nor without it does any rate meet the SLO on {after.config.gpu} " \
               f"{after.config.parallelism()}; {risk}"
    if a is None:
        return f"{what}: without it no rate meets the SLO; with it {after.gpus_needed} GPUs serve the load " \
               f"({money(b)} a month){gain}; {risk}"
    if b is None:
        return f"{what}: no saving: with it no rate meets the SLO on this GPU and parallelism"
    if b > a:
        return (f"{what}: would cost {money(b - a)} a month more ({before.gpus_needed} -> {after.gpus_needed} GPUs, "
                f"{money(a)} -> {money(b)}){gain}: not worth it here")
    if b == a:
        return (f"{what}: no monthly saving at this load (the same {after.gpus_needed} GPUs, {money(b)} a month)"
                f"{gain}, only headroom for more load or longer contexts; {risk}" +
                ("; without a saving, the checkpoint's own weights are the safer choice" if "converted" in what
                 else ""))
    return (f"{what}: saves {money(a - b)} a month ({before.gpus_needed} -> {after.gpus_needed} GPUs, "
            f"{money(a)} -> {money(b)}){gain}; {risk}")


def question_text(q: Question) -> str:
    return (f"How many GPUs does {catalog.model(q.model).name} need on SGLang 0.5.23 to serve "
            f"{q.target_rate_rps:g} requests/s of {q.describe_workload()} within {q.slo.describe()} "
            f"({q.gpu.upper()} at ${q.price:.2f} per GPU-hour, other GPUs at catalog prices), and what do an FP8 "
            "KV cache and INT4 expert weights save?")


def recommendation(plan: Plan) -> str:
    rec = plan.recommended
    if rec is None:
        return ("No configuration searched serves this workload within the SLO: relax the SLO, shorten the "
                "requests, or search more GPUs (each rejected configuration below says why it missed).")
    return (f"Deploy {rec.gpus_needed} x {rec.config.gpu.upper()} as {rec.instances_needed} SGLang instance(s) of "
            f"{rec.config.parallelism()} with {experts(rec).upper()} experts"
            f"{' (converted)' if converted(rec) else ''} and a {rec.kv_dtype.replace('_e4m3', '').upper()} KV "
            f"cache: {money(rec.monthly_cost)} a month ({HOURS_PER_MONTH} h at ${rec.price:.2f}/GPU-hour), "
            f"{money(rec.usd_per_m_output, ',.2f')} per 1M output tokens; each instance serves up to "
            f"{rec.prediction.rate_rps:,.2f} requests/s within the SLO (then {rec.prediction.limited_by} "
            "passes its bound).")
