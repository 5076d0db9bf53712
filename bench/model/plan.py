"""A capacity plan: for one question (model, GPU, tp, workload, SLO, price, target rate) the four-way comparison
(BF16 vs FP8 KV x native vs INT4 experts), each option's capacity, predicted throughput at the SLO, cost, GPUs
needed for the target rate, and the recommendation. The Planner page and `capbench report` both call `make_plan`,
so they show the same figures.

Predictions come from `capbench simulate`'s machinery (simulate.py: SGLang-like continuous batching on the
KV budget, step times from the roofline performance model): `search_rate` finds the highest Poisson rate at which
the SLO percentile of TTFT and TPOT holds, by bisection under the saturation throughput. "quick" fidelity (the
dashboard) simulates fewer requests per rate than "full" (the report).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

from bench.errors import BadInput
from bench.model import capacity as cap
from bench.model import catalog, simulate, workload
from bench.model.slo import SYNTAX, Slo
from bench.model.workload import Workload, fixed_workload, load_workload

HOURS_PER_MONTH = 730


def workload_names() -> list[str]:
    """Named request mixes in data/workloads (the ones `capbench simulate --workload` takes)."""
    return workload.names()


@dataclass(frozen=True)
class Question:
    model: str = "kimi-k2-thinking"
    gpu: str = "h200"
    tp: int = 8
    gpus: int | None = None  # GPUs on hand; default one instance (tp)
    kv_dtype: str = "fp8_e4m3"
    weights: str = "native"
    context: int | None = None
    workload: str | None = "chat"  # a data/workloads name or YAML path; None: fixed input/output tokens
    input_tokens: int = 2000
    output_tokens: int = 500
    slo: Slo = Slo(ttft_s=2.0, tpot_s=0.05)
    price_per_gpu_hour: float | None = None  # default: the catalog's indicative price
    target_rate_rps: float = 10.0
    fidelity: str = "quick"

    def deployment(self, **changes) -> cap.Deployment:
        q = replace(self, **changes)
        return cap.Deployment(catalog.model(q.model), catalog.gpu(q.gpu), q.tp, kv_dtype=q.kv_dtype,
                              weights=q.weights, context=q.context)

    def request_mix(self) -> Workload:
        if self.workload:
            return load_workload(self.workload)
        return fixed_workload(self.input_tokens, self.output_tokens)

    def describe_workload(self) -> str:
        if self.workload:
            wl = self.request_mix()
            return f"'{wl.name}'" + (f" ({wl.description})" if wl.description else "")
        return f"{self.input_tokens:,} input and {self.output_tokens:,} output tokens per request"

    @property
    def price(self) -> float:
        return self.price_per_gpu_hour if self.price_per_gpu_hour is not None else catalog.gpu(
            self.gpu).price_per_gpu_hour

    @property
    def gpus_on_hand(self) -> int:
        return self.gpus or self.tp

    def check(self) -> None:
        if not self.workload and (self.input_tokens < 1 or self.output_tokens < 1):
            raise BadInput("input and output tokens must be at least 1")
        if not self.slo.bounded:
            raise BadInput(f"the SLO needs at least one bound ({SYNTAX})")
        if self.target_rate_rps <= 0:
            raise BadInput(f"target rate must be positive, got {self.target_rate_rps}")
        if self.gpus is not None and (self.gpus < self.tp or self.gpus % self.tp):
            raise BadInput(f"GPU count {self.gpus} must be a multiple of tp {self.tp}")
        if self.fidelity not in FIDELITY:
            raise BadInput(f"fidelity must be one of {', '.join(FIDELITY)}")
        ctx = self.context or catalog.model(self.model).max_context
        if not self.workload and self.input_tokens + self.output_tokens > ctx:
            raise BadInput(f"input + output tokens ({self.input_tokens + self.output_tokens}) exceed the context "
                           f"length {ctx}")


@dataclass(frozen=True)
class Prediction:
    batch: int  # mean sequences running at the best rate
    rate_rps: float  # highest request rate one instance sustains within the SLO
    output_tps: float
    ttft_s: float  # at the SLO's percentile
    tpot_s: float
    limited_by: str  # what the next higher rate missed: TTFT pNN or TPOT pNN (or "search limit")


@dataclass
class Option:
    """One configuration of the four-way comparison."""

    kv_dtype: str
    weights: str
    capacity: cap.Capacity
    prediction: Prediction | None
    price: float
    tp: int
    target_rate_rps: float
    gpus_on_hand: int
    chosen: bool = False

    @property
    def label(self) -> str:
        """e.g. 'int4-g32 experts (native), fp8_e4m3 KV'."""
        experts = cap.weight_formats(catalog.model(self.capacity.model), self.weights)[0]
        return f"{experts} experts{' (native)' if self.weights == 'native' else ''}, {self.kv_dtype} KV"

    @property
    def usd_per_m_output(self) -> float | None:
        p = self.prediction
        if p is None or p.output_tps <= 0:
            return None
        return self.price / 3600 * self.tp / p.output_tps * 1e6

    @property
    def instances_needed(self) -> int | None:
        p = self.prediction
        if p is None or p.rate_rps <= 0:
            return None
        return max(1, math.ceil(self.target_rate_rps / p.rate_rps - 1e-9))

    @property
    def gpus_needed(self) -> int | None:
        n = self.instances_needed
        return None if n is None else n * self.tp

    @property
    def monthly_cost(self) -> float | None:
        g = self.gpus_needed
        return None if g is None else g * self.price * HOURS_PER_MONTH

    @property
    def rate_on_hand_rps(self) -> float | None:
        p = self.prediction
        return None if p is None else p.rate_rps * (self.gpus_on_hand // self.tp)

    def to_row(self) -> dict:
        c, p = self.capacity, self.prediction
        return {
            "config": self.label, "weights": self.weights, "kv_dtype": self.kv_dtype, "chosen": self.chosen,
            "fits": c.fits, "weights_gb_per_gpu": c.weight_bytes_per_gpu / 1e9, "kv_pool_tokens": c.kv_pool_tokens,
            "concurrent_seqs_at_context": c.max_concurrent_sequences_at_context,
            "max_running_requests": c.max_running_requests,
            "batch": p.batch if p else None, "rate_rps": p.rate_rps if p else None,
            "output_tps": p.output_tps if p else None, "ttft_s": p.ttft_s if p else None,
            "tpot_s": p.tpot_s if p else None, "limited_by": p.limited_by if p else None,
            "usd_per_m_output": self.usd_per_m_output, "gpus_needed": self.gpus_needed,
            "monthly_cost": self.monthly_cost, "rate_on_hand_rps": self.rate_on_hand_rps,
        }


@dataclass
class Plan:
    question: Question
    options: list[Option]
    context: int
    notes: list[str] = field(default_factory=list)

    @property
    def baseline(self) -> Option:
        return self.options[0]

    @property
    def chosen(self) -> Option:
        return next(o for o in self.options if o.chosen)

    @property
    def recommended(self) -> Option | None:
        """The option that meets the target rate with the fewest GPUs (then the cheapest per token)."""
        ok = [o for o in self.options if o.gpus_needed is not None]
        if not ok:
            return None
        return min(ok, key=lambda o: (o.gpus_needed, o.usd_per_m_output or math.inf, -o.capacity.kv_pool_tokens))

    def gain(self, option: Option, key: str) -> float | None:
        base, value = self.baseline.to_row()[key], option.to_row()[key]
        if base in (None, 0) or value is None:
            return None
        return value / base

    def rows(self) -> list[dict]:
        out = []
        for o in self.options:
            row = o.to_row()
            for key in ("kv_pool_tokens", "concurrent_seqs_at_context", "rate_rps", "output_tps"):
                row[f"{key}_gain"] = self.gain(o, key)
            out.append(row)
        return out


# How hard search_rate() looks: (requests per rate at least, simulated seconds of arrivals per rate, bisection
# steps). The burst that gives the starting rate offers BURST requests.
FIDELITY = {"quick": (200, 30.0, 5), "full": (1000, 300.0, 7)}
BURST = 1000
MAX_DOUBLINGS = 8


def search_rate(dep: cap.Deployment, wl: Workload, slo: Slo, fidelity: str = "quick") -> Prediction | None:
    """The highest Poisson rate at which `capbench simulate`'s scheduler meets the SLO (judged as
    `simulate --sweep` judges a rate: by its TTFT and TPOT percentiles; an overloaded server's queue shows in TTFT).
    Starts at the throughput of a burst, doubles while the SLO holds, then bisects between the last rate that met
    it and the first that missed. None when the model does not fit."""
    n, seconds, steps = FIDELITY[fidelity]
    if not cap.capacity(dep, with_ratios=False).fits:
        return None
    q = slo.percentile

    def at(rate: float) -> simulate.Point:
        return simulate.run(dep, wl, rate, n, min_seconds=seconds)

    rate = max(simulate.run(dep, wl, math.inf, BURST).achieved_rps, 0.01)
    lo, best, hi, miss = 0.0, None, None, None
    for _ in range(MAX_DOUBLINGS):
        p = at(rate)
        if not slo.met(p):
            hi, miss = rate, p
            break
        lo, best, rate = rate, p, rate * 2
    if hi is None:  # still within the SLO at the last doubling: report that rate, say why it stopped there
        return Prediction(round(best.mean_running), best.rate, best.output_tok_s, getattr(best, f"ttft_p{q}"),
                          getattr(best, f"tpot_p{q}"), "search limit")
    for _ in range(steps):
        mid = (lo + hi) / 2
        p = at(mid)
        if slo.met(p):
            lo, best = mid, p
        else:
            hi, miss = mid, p
    limited = _limit(miss, slo)
    if best is None:
        return Prediction(0, 0.0, 0.0, getattr(miss, f"ttft_p{q}"), getattr(miss, f"tpot_p{q}"), limited)
    return Prediction(round(best.mean_running), best.rate, best.output_tok_s, getattr(best, f"ttft_p{q}"),
                      getattr(best, f"tpot_p{q}"), limited)


def _limit(miss: simulate.Point, slo: Slo) -> str:
    """Which SLO bound the first rate past the best one missed (the one missed by more)."""
    q = slo.percentile
    over = {name: getattr(miss, f"{metric}_p{q}") / bound
            for name, metric, bound in (("TTFT", "ttft", slo.ttft_s), ("TPOT", "tpot", slo.tpot_s),
                                        ("E2E", "e2e", slo.e2e_s)) if bound is not None}
    return f"{max(over, key=over.get)} p{q}"


@lru_cache(maxsize=256)
def _search_cached(q: Question) -> Prediction | None:
    """search_rate for a question reduced to what the simulation depends on (price, GPUs on hand and target rate
    do not change it), so the Planner re-simulates only when the deployment, workload or SLO change."""
    return search_rate(q.deployment(), q.request_mix(), q.slo, q.fidelity)


def make_plan(q: Question, progress=None) -> Plan:
    """progress: called once per option simulated (a rich progress bar's advance, say)."""
    q.check()
    dep = q.deployment()
    q.request_mix()  # a bad workload name fails here, before any simulation
    model = catalog.model(q.model)

    def same(c: cap.Capacity) -> bool:  # 'native' and the format it names are one choice (Kimi K2 Thinking: int4)
        return c.kv_dtype == q.kv_dtype and cap.weight_formats(model, c.weights) == cap.weight_formats(model,
                                                                                                        q.weights)

    caps = cap.compare(dep)
    if not any(same(c) for c in caps):
        caps.append(cap.capacity(dep))  # a choice outside the four-way (e.g. fp8_e5m2, int4-g128): shown too
    options = []
    for c in caps:
        pred = _search_cached(replace(q, kv_dtype=c.kv_dtype, weights=c.weights, gpus=None, price_per_gpu_hour=None,
                                      target_rate_rps=1.0))
        options.append(Option(c.kv_dtype, c.weights, c, pred, q.price, q.tp, q.target_rate_rps, q.gpus_on_hand,
                              chosen=same(c)))
        if progress:
            progress()
    plan = Plan(q, options, dep.context_len)
    for o in options:
        if not o.capacity.fits:
            plan.notes.append(f"{o.label} does not fit {q.tp} x {q.gpu}.")
        elif o.prediction is not None and o.prediction.rate_rps == 0:
            plan.notes.append(f"{o.label}: even the lowest rate tried misses the SLO ({o.prediction.limited_by}).")
    return plan


def on_other_gpus(q: Question, kv_dtype: str, weights: str, progress=None) -> list[Option]:
    """One configuration at the question's tp on every other catalog GPU, at the catalog's prices: what the same
    load would need and cost there."""
    out = []
    for gpu_id in sorted(catalog.gpus()):
        if gpu_id == q.gpu:
            continue
        other = replace(q, gpu=gpu_id, kv_dtype=kv_dtype, weights=weights, gpus=None, price_per_gpu_hour=None)
        c = cap.capacity(other.deployment(), with_ratios=False)
        pred = _search_cached(replace(other, target_rate_rps=1.0)) if c.fits else None
        out.append(Option(kv_dtype, weights, c, pred, other.price, q.tp, q.target_rate_rps, q.tp))
        if progress:
            progress()
    return out
