"""The one answer to a plan's question: the cheapest deployment that serves the load, colocated or prefill/decode
disaggregated, with its interval, what FP8 KV and the expert format buy (each saving counted once: KV dtype first,
then the expert format, so the steps add up to the whole), the risks a near-equal alternative would not take, the
launch lines of every role, and the runner-up of the other kind. The CLI, the Planner and the reports print it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from bench.model.advice.launch import patch_flags
from bench.model.advice.option import Option
from bench.model.advice.plan import Plan
from bench.model.evidence import corpus
from bench.model.fits import catalog, formats
from bench.model.fits.capacity import weight_formats
from bench.model.pd import launch as pd_launch
from bench.model.pd.versus import Versus

NEAR = 0.15  # an alternative within 15 % of the recommended cost is near enough to name when it is safer


@dataclass(frozen=True)
class Saving:
    """One step of the decomposition: the cheapest option with `what` against the cheapest without it."""
    what: str  # "FP8 KV cache" or "INT4-G32 experts"
    before: str  # label of the cheapest option without it (the previous step)
    after: str
    saves_usd: float  # a month; negative: costs more
    kv_tokens_ratio: float
    rate_ratio: float  # requests/s per instance


@dataclass
class Headline:
    question: str
    kind: str  # "colocated" | "disaggregated" | "none"
    summary: str  # the deployment in words
    gpus: int | None = None
    monthly_cost: float | None = None
    usd_per_m_output: float | None = None
    gpus_range: tuple[int, int] | None = None
    cost_range: tuple[float, float] | None = None
    interval_basis: str = ""  # what the range is: an 80 % interval from N cases, or uncalibrated bounds
    savings: list[Saving] = field(default_factory=list)
    risks: list[str] = field(default_factory=list)
    runner_up: str = ""
    launch: list[str] = field(default_factory=list)  # every role's lines, "# where" comments between roles

    def to_json(self) -> dict:
        return asdict(self)


def make_headline(plan: Plan, versus: Versus | None = None) -> Headline:
    q = plan.question
    mix = f"'{q.workload}'" if q.workload else q.describe_workload()  # the name: the first screen is short
    question = (f"{catalog.model(q.model).name}, {mix}, {q.target_rate_rps:g} req/s{q.describe_cap()} within "
                f"{q.slo.describe()}")
    rec = plan.recommended
    pd_answer = versus.disaggregated if versus is not None else None
    if versus is not None and versus.winner == "disaggregated" and pd_answer is not None:
        h = _disaggregated(question, versus)
        h.runner_up = (f"Colocated runner-up: {_option_words(rec)}: {rec.gpus_needed} GPUs, "
                       f"${rec.monthly_cost:,.0f} a month" if rec is not None else "No colocated configuration "
                       "serves it.")
    elif rec is not None:
        h = _colocated(question, plan, rec)
        if versus is None:
            h.runner_up = "Prefill/decode disaggregation: not searched (--no-pd)."
        elif pd_answer is None:
            h.runner_up = "Disaggregated: no prefill/decode shape serves it."
        else:
            h.runner_up = (f"Disaggregated runner-up: {pd_answer.ratio} ({pd_answer.gpus_needed} GPUs), "
                           f"${pd_answer.monthly_cost:,.0f} a month")
    else:
        return Headline(question, "none", "No configuration searched serves this load within the SLO: relax the "
                        "SLO, shorten the requests or search more GPUs (the tables say why each missed).")
    h.savings = savings(plan) if h.kind == "colocated" else []  # PD's own formats: --details compares them
    if versus is not None and rec is not None and pd_answer is not None and versus.interval is not None:
        ci = rec.interval()
        if ci is not None:
            (c0, c1), (d0, d1) = ci["monthly_cost"], versus.interval["monthly_cost"]
            if not (c1 < d0 or d1 < c0):
                other = (f"colocated ${c0:,.0f}-${c1:,.0f}" if h.kind == "disaggregated" else
                         f"disaggregated ${d0:,.0f}-${d1:,.0f}")
                h.risks.append(f"the cost ranges overlap ({other}): measure both")
    return h


def _option_words(o: Option) -> str:
    experts = weight_formats(catalog.model(o.model), o.weights)[0].upper()
    shipped = f" ({_source(o)})"
    kv = "FP8" if o.kv_dtype.startswith("fp8") else "BF16"
    c = o.config
    return f"{o.instances_needed} x {c.gpu.upper()} {c.parallelism()}, {experts} experts{shipped}, {kv} KV"


def _source(o: Option) -> str:
    """Where the experts come from: shipped with the model, a published checkpoint (named), or capbench's conversion."""
    if o.weights == "native":
        return "shipped"
    src = formats.source_of(catalog.model(o.model), o.weights)
    return src.hf if src is not None and src.kind == "shipped" else "converted by capbench"


def _colocated(question: str, plan: Plan, rec: Option) -> Headline:
    iv = rec.interval()
    h = Headline(question, "colocated", _option_words(rec), rec.gpus_needed, rec.monthly_cost, rec.usd_per_m_output,
                 launch=rec.launch())
    if iv is not None:
        h.gpus_range, h.cost_range = tuple(iv["gpus_needed"]), tuple(iv["monthly_cost"])
        n = iv["cases"]
        h.interval_basis = f"80 % interval, {n} published case{'' if n == 1 else 's'}"
    h.risks = risks(plan, rec)
    if iv is not None and iv["evidence"]:  # thin evidence, in its first clause (the rest: --details)
        h.risks.append(iv["evidence"].split(";")[0].split(": ")[0])
    return h


def _disaggregated(question: str, v: Versus) -> Headline:
    d = v.disaggregated
    s = d.shape
    experts = weight_formats(catalog.model(s.model), s.weights)[0].upper()
    summary = (f"prefill/decode disaggregated on {s.gpu.upper()}: {d.prefill_instances} prefill x {s.prefill_gpus} "
               f"GPUs, {d.decode_instances} decode x {s.decode_gpus} GPUs (DP attention + EP), {experts} experts, "
               f"{'FP8' if s.kv_dtype.startswith('fp8') else 'BF16'} KV, a router")
    h = Headline(question, "disaggregated", summary, d.gpus_needed, d.monthly_cost, d.usd_per_m_output)
    if v.interval is not None:
        h.gpus_range, h.cost_range = tuple(v.interval["gpus_needed"]), tuple(v.interval["monthly_cost"])
        h.interval_basis = "bounds, not a calibrated interval"
    cases = [c for c in corpus.load() if c.kind == "disaggregated"]
    h.risks = [f"PD figures come from an analytic model checked on {len(cases)} published PD runs: a first estimate"]
    h.launch = [line for c in pd_launch.commands(d, patches=patch_flags(s.kv_dtype))
                for line in (f"# {'router' if c.role == 'router' else f'{c.role} {c.instance} node {c.node}'}",
                             c.command)]
    return h


def _cheapest(options: list[Option], keep) -> Option | None:
    return min((o for o in options if keep(o)), key=lambda o: (o.monthly_cost, o.gpus_needed), default=None)


def savings(plan: Plan) -> list[Saving]:
    """What the recommendation's KV dtype and expert format buy, counted once: from the cheapest option on its GPU
    with BF16 KV and the shipped experts, to the cheapest with its KV dtype and the shipped experts, to it."""
    rec = plan.recommended
    if rec is None:
        return []
    same_gpu = [o for o in plan.simulated if o.serves and o.config.gpu == rec.config.gpu]
    base = _cheapest(same_gpu, lambda o: o.kv_dtype == "bf16" and o.weights == "native")
    mid = _cheapest(same_gpu, lambda o: o.kv_dtype == rec.kv_dtype and o.weights == "native")
    steps = []
    if rec.kv_dtype != "bf16" and base is not None and mid is not None:
        steps.append(_step("FP8 KV cache", base, mid))
    if rec.weights != "native" and mid is not None:
        steps.append(_step(f"{weight_formats(catalog.model(rec.model), rec.weights)[0].upper()} experts", mid, rec))
    return steps


def _step(what: str, before: Option, after: Option) -> Saving:
    return Saving(what, before.label, after.label, before.monthly_cost - after.monthly_cost,
                  after.capacity.kv_pool_tokens_total / max(before.capacity.kv_pool_tokens_total, 1),
                  after.prediction.rate_rps / before.prediction.rate_rps)


def risks(plan: Plan, rec: Option) -> list[str]:
    """What the recommendation risks that a near-equal alternative does not: converted experts or a regime with
    fewer published cases; a rate the simulator did not converge on; a KV pool that holds no sequence at the asked
    context."""
    out = []
    iv = rec.interval() or {}
    cases = iv.get("cases", 0)
    safer = [o for o in plan.simulated if o.serves and o is not rec and o.weights == "native"
             and o.monthly_cost <= rec.monthly_cost * (1 + NEAR)
             and o.capacity.max_concurrent_sequences_at_context >= 1]
    if rec.weights != "native" or cases == 0:
        alt = min(safer, key=lambda o: (-(o.interval() or {}).get("cases", 0), o.monthly_cost), default=None)
        if alt is not None and (alt.interval() or {}).get("cases", 0) > cases:
            more = alt.monthly_cost / rec.monthly_cost - 1
            what = (f"{weight_formats(catalog.model(rec.model), rec.weights)[0].upper()} experts ({_source(rec)})"
                    if rec.weights != "native" else "this regime")
            out.append(f"{_option_words(alt)} costs {more:.0%} more and has {(alt.interval() or {})['cases']} "
                       f"published cases; {what}: {cases}")
    p = rec.prediction
    if p is not None and not p.converged:
        out.append(f"its rate within the SLO moved {p.change:.0%} when the simulated arrivals last doubled (to "
                   f"{p.horizon_s:,.0f} s): not converged, so measure it before buying")
    c = rec.capacity
    if c.max_concurrent_sequences_at_context < 1:
        out.append(f"its KV pool ({c.kv_pool_tokens_total:,} tokens) holds no sequence at the {c.context:,}-token "
                   "context: no configuration searched does")
    return out
