"""Colocated vs disaggregated for one plan: the plan's cheapest colocated answer (simulated, rate.py) beside the
cheapest prefill/decode split (disagg.py's analytic model), and why one wins in the terms that decide it: the
prefill share that stretches colocated decode steps (interference), the decode batch each rank holds, the KV
transfer, and the whole instances each side must buy. The CLI, the report and the Planner print this one object.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.model.advice.option import Option
from bench.model.advice.plan import Plan
from bench.model.evidence import corpus
from bench.model.pd import disagg
from bench.model.pd import interval as pd_interval
from bench.model.pd import search as pd_search
from bench.model.pd.disagg import Answer
from bench.model.step import interconnect

MAX_NODES = 16


@dataclass
class Versus:
    colocated: Option | None
    disaggregated: Answer | None
    answers: list[Answer]  # every PD shape searched, cheapest first
    interference: float | None  # share of each second the colocated instance spends on prefill at the target
    winner: str  # "colocated" | "disaggregated" | "neither"
    why: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    interval: dict | None = None  # the disaggregated answer's (pd_interval.for_answer)

    def to_json(self) -> dict:
        c = self.colocated
        return {"winner": self.winner, "why": self.why, "evidence": self.evidence, "interference": self.interference,
                "colocated": c.to_row() if c else None,
                "disaggregated": self.disaggregated.to_row() if self.disaggregated else None,
                "disaggregated_interval": self.interval,
                "disaggregated_searched": len(self.answers),
                "disaggregated_serving": sum(a.serves for a in self.answers)}


def evidence(model: str) -> list[str]:
    """Where the disaggregated regime's figures come from, and how thin that is."""
    cases = [c for c in corpus.load() if c.kind == "disaggregated"]
    same = [c for c in cases if c.model.split("-")[0] == model.split("-")[0]]
    a = interconnect.assumptions()
    return [f"The disaggregated figures come from an analytic model checked against {len(cases)} published PD / "
            f"large-EP measurements ({len(same)} of this model family; `capbench validate` prints their errors): "
            "little evidence, read them as a first estimate.",
            "DeepEP all-to-all costs are DeepEP's published H800 measurements scaled to this GPU's links; the KV "
            f"transfer setup ({a['kv_transfer_setup_ms']:g} ms), its NIC efficiency ({a['kv_transfer_eff']:g}), the "
            f"router ({a['router_ms']:g} ms) and EPLB's effect on imbalance (x{a['eplb_skew']:g}) are assumptions."]


def _reasons(c: Option | None, d: Answer | None, share: float | None) -> list[str]:
    out = []
    if c is not None and d is not None:
        dp = c.config.dp
        per_rank = c.prediction.batch / dp if dp else c.prediction.batch
        out.append(f"Decode batch: {d.batch_per_rank} requests per decode rank ({d.decode_limited_by}) vs about "
                   f"{per_rank:,.{1 if per_rank < 10 else 0}f} per {'DP rank' if dp > 1 else 'instance'} colocated "
                   "(mean running).")
    if share is not None:
        out.append(f"Interference: colocated, prefill takes {share:.0%} of each second at the target load, "
                   f"stretching every decode step by x{1 / max(1 - share, 1e-9):.2f}; PD removes it.")
    if d is not None:
        out.append(f"KV transfer: {d.transfer_s * 1e3:,.1f} ms per request over the NIC (prompt of "
                   f"{d.lengths.prompt:,.0f} tokens), inside PD's TTFT of {d.ttft_s:,.2f} s; prefill limited by "
                   f"{d.prefill_limited_by}.")
        out.append(f"Whole instances: PD buys {d.ratio} = {d.gpus_needed} GPUs for the target "
                   f"({d.prefill_rps:,.2f} req/s per prefill instance, {d.decode_rps:,.2f} per decode instance).")
    return out


def _overlap(c: Option | None, pd: dict | None) -> list[str]:
    """Whether the evidence decides the comparison: the two answers' monthly costs at both ends of their intervals."""
    ci = c.interval() if c is not None else None
    if ci is None or pd is None:
        return []
    (c_lo, c_hi), (d_lo, d_hi) = ci["monthly_cost"], pd["monthly_cost"]
    said = (f"Monthly cost at the two ends of the intervals: colocated ${c_lo:,.0f}-${c_hi:,.0f} (80 %), "
            f"disaggregated ${d_lo:,.0f}-${d_hi:,.0f} (not calibrated)")
    if c_hi < d_lo or d_hi < c_lo:
        return [said + ": the ranges do not overlap, so the winner holds at every end the evidence allows."]
    return [said + ": they overlap, so the evidence does not decide between them; measure both before buying."]


def compare(plan: Plan, max_nodes: int = MAX_NODES, gpus: tuple[str, ...] | None = None) -> Versus:
    """The plan's colocated recommendation beside the cheapest PD shape on the asked GPU(s)."""
    q = plan.question
    ln = disagg.lengths(q.request_mix())
    search = list(gpus or q.search_gpus or (q.gpu,))
    answers = pd_search.search(q.model, search, ln, q.slo, q.target_rate_rps, max_nodes, price_of=q.price_of,
                               context=q.context, in_flight=q.max_concurrency)
    d = next((a for a in answers if a.serves), None)
    c = plan.recommended
    share = None
    if c is not None and c.config.dp == c.config.tp:  # the analytic share is for DP-attention instances
        shape = disagg.Shape(q.model, c.config.gpu, c.config.tp, c.config.tp, c.config.kv_dtype, c.config.weights)
        per_instance = q.target_rate_rps / c.instances_needed
        chunk = disagg.chunk(shape)
        cost = disagg.prefill_step_s(shape, chunk, ln) * ln.new / chunk / c.config.tp
        share = min(per_instance * cost, 0.99)
    elif c is not None:
        shape = disagg.Shape(q.model, c.config.gpu, c.config.tp, c.config.tp, c.config.kv_dtype, c.config.weights,
                             prefill_dp_attention=False)
        chunk = disagg.chunk(shape)
        cost = disagg.prefill_step_s(shape, chunk, ln) * ln.new / chunk
        share = min(q.target_rate_rps / c.instances_needed * cost, 0.99)
    if c is None and d is None:
        winner = "neither"
    elif d is None or (c is not None and c.monthly_cost <= d.monthly_cost):
        winner = "colocated"
    else:
        winner = "disaggregated"
    v = Versus(c, d, answers, share, winner, evidence=evidence(q.model),
               interval=pd_interval.for_answer(d) if d is not None else None)
    if winner != "neither":
        costs = {"colocated": c.monthly_cost if c else None, "disaggregated": d.monthly_cost if d else None}
        other = "disaggregated" if winner == "colocated" else "colocated"
        if costs[other] is None:
            head = f"{winner.capitalize()} wins: ${costs[winner]:,.0f} a month; no {other} shape serves the load."
        elif costs[other] == costs[winner]:
            head = (f"A tie at ${costs[winner]:,.0f} a month: colocated is preferred (its figures are validated, and "
                    "it has no router or KV transfer to run).")
        else:
            head = f"{winner.capitalize()} wins: ${costs[winner]:,.0f} a month vs ${costs[other]:,.0f}."
        v.why = [head, *_reasons(c, d, share), *_overlap(c, v.interval)]
    if d is None and answers:
        v.why.append(f"No PD shape serves it: {answers[0].rejected_because}.")
    if q.max_concurrency is not None:
        v.why.append(f"Both sides hold the concurrency cap ({q.max_concurrency} in flight to each instance; for PD, to "
                     "each decode instance): arrivals wait in the client for a free slot, and the wait counts in the "
                     "TTFT the SLO judges (simulated colocated; for PD in closed form, M/M/c, which errs long).")
    return v
