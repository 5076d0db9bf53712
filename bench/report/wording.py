"""What the report and the Planner say in words: the question, the answer, what FP8 KV and INT4 experts save and
what they risk (quality: the drift runs' result, or "not yet checked"), why a configuration does not fit, and
figures written with their units, or plainly when there is none ("no rate meets the SLO", never "$n/a")."""

from __future__ import annotations

import math

import pandas as pd

from bench.model import HOURS_PER_MONTH, Option, Plan, Question, capacity, catalog, formats
from bench.model import prices as gpu_prices
from bench.model.answer import Headline, Saving
from bench.report.screen import wrapped

NONE_MEETS = "no rate meets the SLO"


def money(v: float | None, spec: str = ",.0f", none: str = NONE_MEETS) -> str:
    return none if v is None or pd.isna(v) else f"${format(v, spec)}"


def num(v: float | None, spec: str = ",.0f", unit: str = "", none: str = "-") -> str:
    return none if v is None or pd.isna(v) else f"{format(v, spec)}{unit}"


def experts(o: Option) -> str:
    return capacity.weight_formats(catalog.model(o.model), o.weights)[0]


def converted(o: Option) -> bool:
    """The expert weights are not a published checkpoint's: capbench converts them (a quality risk to check)."""
    src = formats.source_of(catalog.model(o.model), o.weights)
    return src is None or src.kind == "capbench"


def quality(drift: pd.DataFrame | None, model: str, what: str) -> str:
    """The drift runs' word on `what` ('fp8 KV' or 'int4 experts') for `model`, or 'not yet checked'."""
    key = {"fp8 KV": "kv=fp8", "int4 experts": "weights=int4"}[what]
    family = model.split("-")[0]
    rows = pd.DataFrame() if drift is None or drift.empty or "target_b" not in drift else drift[
        drift.apply(lambda r: any(key in str(t) and family in str(t).lower() for t in (r.target_a, r.target_b)),
                    axis=1)]
    if rows.empty:
        return (f"quality not yet checked: run `capbench eval --suite humaneval,bfcl --target <BF16 server> --target "
                f"<{what} server>` (task suites with checkers, B against A with a 90 % interval) before rollout")
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
    """What FP8 KV and converted experts save, each with its risk. When the recommendation uses one, against the
    cheapest configuration searched without it (any parallelism on that GPU); when it does not, what switching
    the recommended configuration to it would do."""
    rec = plan.recommended
    if rec is None:
        return []
    model = plan.question.model
    four = plan.four_way()
    serving = [o for o in plan.simulated if o.serves and o.config.gpu == rec.config.gpu]

    def cheapest(keep) -> Option | None:
        return min((o for o in serving if keep(o)), key=lambda o: (o.monthly_cost, o.gpus_needed), default=None)

    out = []
    kv_risk = quality(drift, model, "fp8 KV")
    if rec.kv_dtype != "bf16":
        out.append(_saving("FP8 KV cache", cheapest(lambda o: o.kv_dtype == "bf16"), rec, kv_risk,
                           _why_none(plan, rec.config.gpu, lambda o: o.kv_dtype == "bf16")))
    else:
        fp8 = next((o for o in four if o.weights == rec.weights and o.kv_dtype != "bf16"), None)
        if fp8:
            out.append(_saving("FP8 KV cache", rec, fp8, kv_risk))
    conv = next((o for o in four if o.kv_dtype == rec.kv_dtype and converted(o)), None)
    name = experts(conv or rec).upper()
    what = f"{name} experts (converted by capbench from the checkpoint's " \
           f"{capacity.weight_formats(catalog.model(model), 'native')[0].upper()})"
    risk = quality(drift, model, "int4 experts") if "int4" in name.lower() else \
        "capbench converts them: check quality with capbench drift"
    if converted(rec):
        out.append(_saving(what, cheapest(lambda o: not converted(o)), rec, risk,
                           _why_none(plan, rec.config.gpu, lambda o: not converted(o))))
    elif conv:
        out.append(_saving(what, rec, conv, risk))
    return out


def _why_none(plan: Plan, gpu: str, keep) -> str:
    """Why no configuration on `gpu` that `keep` admits serves the load, with the counts: what did not fit, what
    was screened out on cost (with the best such figure), what missed the SLO."""
    opts = [o for o in plan.options if o.config.gpu == gpu and keep(o)]
    reasons: dict[str, list[Option]] = {}
    for o in opts:
        why = o.rejected_because or ("not simulated" if not o.simulated else NONE_MEETS)
        key = ("do not fit" if why.startswith(("the weights do not fit", "KV pool")) else
               "were screened out on cost" if why.startswith("screened out") else
               "miss the SLO" if why.startswith(("no rate", NONE_MEETS)) else "were not simulated")
        reasons.setdefault(key, []).append(o)
    parts = [f"{len(v)} {k}" for k, v in sorted(reasons.items(), key=lambda kv: -len(kv[1]))]
    screened = reasons.get("were screened out on cost")
    if screened:
        best = min(screened, key=lambda o: o.price * o.tp / o.saturation_tps if o.saturation_tps else math.inf)
        parts[[p.endswith("on cost") for p in parts].index(True)] += (
            f" (the best, {best.config.parallelism()} {best.short_label}: {best.rejected_because.split(': ', 1)[1]})")
    return (f"of the {len(opts)} configurations searched on {gpu.upper()} without it, " + "; ".join(parts)
            if opts else f"no configuration on {gpu.upper()} without it was searched")


def _saving(what: str, before: Option | None, after: Option, risk: str, none_why: str = "") -> str:
    """One sentence: `after` (with `what`) against `before` (without it; None: nothing without it serves, and
    none_why says why)."""
    if before is None:
        return (f"{what}: {none_why or 'nothing without it serves the load'}; with it "
                f"{after.gpus_needed} GPUs serve the load ({money(after.monthly_cost)} a month); {risk}")
    a, b = before.monthly_cost, after.monthly_cost
    gains = []
    if before.capacity.kv_pool_tokens and after.capacity.fits:
        gains.append(f"{after.capacity.kv_pool_tokens / before.capacity.kv_pool_tokens:.2f}x the KV cache tokens")
    if before.serves and after.serves:
        gains.append(f"{after.prediction.rate_rps / before.prediction.rate_rps:.2f}x the requests/s per instance")
    gain = f" ({', '.join(gains)})" if gains else ""
    if b is None:
        why = "its weights do not fit" if not after.capacity.fits else NONE_MEETS
        return f"{what}: no saving: on {after.config.gpu.upper()} {after.config.parallelism()} {why}"
    if a is None:
        return (f"{what}: without it {before.config.parallelism()} cannot serve the load; with it "
                f"{after.gpus_needed} GPUs do ({money(b)} a month){gain}; {risk}")
    if b > a:
        return (f"{what}: would cost {money(b - a)} a month more ({before.gpus_needed} -> {after.gpus_needed} GPUs, "
                f"{money(a)} -> {money(b)}){gain}: not worth it here")
    if b == a:
        return (f"{what}: no monthly saving at this load (the same {after.gpus_needed} GPUs, {money(b)} a month)"
                f"{gain}, only headroom for more load or longer contexts; {risk}"
                + ("; without a saving, the checkpoint's own weights are the safer choice" if "converted" in what
                   else ""))
    return (f"{what}: saves {money(a - b)} a month against {before.label} ({before.gpus_needed} -> "
            f"{after.gpus_needed} GPUs, {money(a)} -> {money(b)}){gain}; {risk}")


def _range(pair, spec: str, unit: str = "", dollars: bool = False) -> str:
    lo, hi = pair
    cur = "$" if dollars else ""
    return f"{cur}{format(lo, spec)}-{cur}{format(hi, spec)}{unit}"


def interval(o: Option, percentile: int | None = None) -> str | None:
    """The option's 80 % interval in one sentence (figures at the pessimistic end first where it matters), with
    the evidence behind it; None when it serves nothing. CLI, Planner and report all say it this way."""
    iv = o.interval()
    if iv is None:
        return None
    tag = f" p{percentile}" if percentile else ""
    n = iv["cases"]
    text = (f"80 % interval, from the model's out-of-sample error on the published corpus ({n} case"
            f"{'' if n == 1 else 's'} of {iv['regime'].rsplit(',', 1)[0]}): "
            f"{_range(iv['rate_rps'], ',.2f', ' req/s')} per instance, {_range(iv['instances'], 'd')} instances "
            f"({_range(iv['gpus_needed'], 'd')} GPUs), {_range(iv['monthly_cost'], ',.0f', dollars=True)} a month, "
            f"{_range(iv['usd_per_m_output'], ',.2f', dollars=True)} per 1M output tokens")
    if iv["ttft_s"] and iv["tpot_s"]:
        text += (f", TTFT{tag} {_range(iv['ttft_s'], ',.2f', ' s')}, TPOT{tag} "
                 f"{_range(tuple(x * 1e3 for x in iv['tpot_s']), ',.0f', ' ms')}")
    hi = iv["instances"][1]
    if hi > (o.instances_needed or 0):
        text += (f". At the pessimistic end the load needs {hi} instances ({iv['gpus_needed'][1]} GPUs, "
                 f"{money(iv['monthly_cost'][1])} a month), not {o.instances_needed}")
    if iv["evidence"]:
        text += f". {iv['evidence'][0].upper()}{iv['evidence'][1:]}"
    return text


def choice(o: Option, percentile: int | None = None) -> str:
    """The asker's own deployment in one line, with its interval and evidence: CLI ('Yours:') and report."""
    said = interval(o, percentile)
    return (f"{o.label}: {o.instances_needed} instance(s), {o.gpus_needed} GPUs, {money(o.monthly_cost)} a month, "
            f"{money(o.usd_per_m_output, ',.2f')} per 1M output tokens" + (f". {said}" if said else ""))


def prices(q: Question) -> str:
    """Which price each GPU of the question is costed at: '$ per GPU-hour: H200 $3.10 (given); the catalog's
    indicative prices (not given) for B200 $5.99', so a price given for one GPU is never taken for every GPU's."""
    costed = gpu_prices.costed(q)
    given = [f"{g.upper()} ${p:.2f}" for g, (p, mine) in costed.items() if mine]
    listed = [f"{g.upper()} ${p:.2f}" for g, (p, mine) in costed.items() if not mine]
    parts = ([", ".join(given) + " (given)"] if given else []) + \
        ([f"the catalog's indicative prices (not given) for {', '.join(listed)}"] if listed else [])
    return "$ per GPU-hour: " + "; ".join(parts)


def question_text(q: Question) -> str:
    return (f"How many GPUs does {catalog.model(q.model).name} need on SGLang 0.5.23 to serve "
            f"{q.target_rate_rps:g} requests/s of {q.describe_workload()}{q.describe_cap()} within {q.slo.describe()} "
            f"({prices(q)}), and what do an FP8 "
            "KV cache and INT4 expert weights save?")


def recommendation(plan: Plan) -> str:
    rec = plan.recommended
    if rec is None:
        return ("No configuration searched serves this workload within the SLO: relax the SLO, shorten the "
                "requests, or search more GPUs (each rejected configuration below says why it missed).")
    kv = rec.kv_dtype.replace("_e4m3", "").upper()
    kv_article = "an" if kv.startswith("F") else "a"
    return (f"Deploy {rec.gpus_needed} x {rec.config.gpu.upper()} as {rec.instances_needed} SGLang instance(s) of "
            f"{rec.config.parallelism()} with {experts(rec).upper()} experts"
            f"{' (converted)' if converted(rec) else ''} and {kv_article} {kv} KV "
            f"cache: {money(rec.monthly_cost)} a month ({HOURS_PER_MONTH} h at ${rec.price:.2f}/GPU-hour), "
            f"{money(rec.usd_per_m_output, ',.2f')} per 1M output tokens; each instance serves up to "
            f"{rec.prediction.rate_rps:,.2f} requests/s within the SLO (then {rec.prediction.limited_by} "
            f"passes its bound). {interval(rec, plan.question.slo.percentile) or ''}").strip()


def saving_words(s: Saving, then: bool = False) -> str:
    """One step of the savings decomposition in one line; then: a later step, counted from the one before it (the
    steps add up: two equal savings are two steps, not one counted twice)."""
    ratios = f"{s.kv_tokens_ratio:.2f}x KV tokens, {s.rate_ratio:.2f}x req/s an instance"
    what, more = (f"Then {s.what}", " more") if then else (s.what, "")
    if s.saves_usd > 0:
        return f"{what}: saves ${s.saves_usd:,.0f} a month{more} ({ratios})"
    if s.saves_usd < 0:
        return f"{what}: costs ${-s.saves_usd:,.0f} a month more ({ratios})"
    room = s.kv_tokens_ratio > 1 and s.rate_ratio >= 1
    return f"{what}: no saving at this load ({ratios}){': headroom' if room else ''}"


def shell_wrapped(command: str, width: int) -> list[str]:
    """A command as shell lines of at most `width` columns, joined by backslashes (never inside a word)."""
    out, cur = [], ""
    for word in command.split(" "):
        if cur and len(cur) + 1 + len(word) > width - 2:
            out.append(cur + " \\")
            cur = "  " + word
        else:
            cur = f"{cur} {word}" if cur else word
    return out + [cur]


def headline_lines(h: Headline, width: int = 100, launch: bool = True) -> list[str]:
    """The answer as the CLI's first screen prints it (at most ~15 lines of `width` columns), the Planner's top and
    the report's first section: the deployment, its figures and range, what FP8 KV and the expert format buy, the
    risks, the runner-up of the other kind, and the first launch line."""
    def wrap(text: str) -> list[str]:
        return wrapped(text, width)

    out = wrap(h.question)
    if h.kind == "none":
        return out + wrap(h.summary)
    out += wrap(f"Answer, {h.kind}: {h.summary}")
    figures = f"{h.gpus} GPUs, ${h.monthly_cost:,.0f} a month, ${h.usd_per_m_output:,.2f} per 1M output tokens"
    if h.cost_range:
        (g0, g1), (c0, c1) = h.gpus_range, h.cost_range
        figures += f"; range {g0}-{g1} GPUs, ${c0:,.0f}-${c1:,.0f} a month ({h.interval_basis})"
    out += wrap(figures)
    for i, s in enumerate(h.savings):
        out += wrap(saving_words(s, then=i > 0))
    for r in h.risks:
        out += wrap(f"Risk: {r}.")
    out += wrap(h.runner_up)
    commands = [c for c in h.launch if not c.startswith("#")]
    if launch and len(commands) == 1:
        out += ["Launch:", *shell_wrapped(commands[0], width)]
    elif launch and commands:
        out += wrap(f"Launch: {len(commands)} commands, one per node and role: --details or --json prints them.")
    return out
