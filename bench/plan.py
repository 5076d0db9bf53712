"""A capacity plan: for one question (model, GPU, tp, workload, SLO, price, target rate) the four-way comparison
(BF16 vs FP8 KV x native vs INT4 experts), each option's capacity, predicted throughput at the SLO, cost, GPUs
needed for the target rate, and the recommendation with its SGLang launch commands.

The Planner page and `capbench report` both call `make_plan`, so they show the same figures.

Prediction (`predict`): the steady state of continuous batching on one instance, from the roofline performance
model (bench/perfmodel.py). With N sequences decoding, every step also prefills the prompts of the requests that
arrive meanwhile (N * input / output tokens per step, SGLang's mixed chunked prefill), so
    step time t(N) = PerfModel.step_time(N decoding, their KV, N*I/O prefill tokens), TPOT = t(N),
    rate(N) = N / (O * t(N)), TTFT = prefill of one prompt in 8k chunks + one step.
The operating point is the largest N whose TPOT and TTFT meet the SLO and whose sequences fit the KV pool and
max_running_requests. Queueing delay near saturation is not in this estimate; `capbench simulate` (the
scheduler, when present) runs the full queue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from bench import capacity as cap
from bench import catalog
from bench.errors import BadInput
from bench.perfmodel import PerfModel, prefill_pairs

HOURS_PER_MONTH = 730
CHUNKED_PREFILL = 8192
# Request mixes for planning: (input tokens, output tokens). loadgen's workloads generate real traffic.
WORKLOADS = {
    "chat": (2000, 500),
    "long-context RAG": (32000, 800),
    "agentic coding": (16000, 1200),
    "reasoning": (1500, 6000),
}


@dataclass(frozen=True)
class Question:
    model: str = "kimi-k2-thinking"
    gpu: str = "h200"
    tp: int = 8
    gpus: int | None = None  # GPUs on hand; default one instance (tp)
    kv_dtype: str = "fp8_e4m3"
    weights: str = "native"
    context: int | None = None
    input_tokens: int = 2000
    output_tokens: int = 500
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.05
    price_per_gpu_hour: float | None = None  # default: the catalog's indicative price
    target_rate_rps: float = 10.0
    page_size: int = 1

    def deployment(self, **changes) -> cap.Deployment:
        q = replace(self, **changes)
        return cap.Deployment(catalog.model(q.model), catalog.gpu(q.gpu), q.tp, kv_dtype=q.kv_dtype,
                              weights=q.weights, context=q.context, page_size=q.page_size)

    @property
    def price(self) -> float:
        return self.price_per_gpu_hour if self.price_per_gpu_hour is not None else catalog.gpu(
            self.gpu).price_per_gpu_hour

    @property
    def gpus_on_hand(self) -> int:
        return self.gpus or self.tp

    def check(self) -> None:
        if self.input_tokens < 1 or self.output_tokens < 1:
            raise BadInput("input and output tokens must be at least 1")
        if self.slo_ttft_s <= 0 or self.slo_tpot_s <= 0:
            raise BadInput("SLO bounds must be positive seconds")
        if self.target_rate_rps <= 0:
            raise BadInput(f"target rate must be positive, got {self.target_rate_rps}")
        if self.gpus is not None and (self.gpus < self.tp or self.gpus % self.tp):
            raise BadInput(f"GPU count {self.gpus} must be a multiple of tp {self.tp}")
        ctx = self.context or catalog.model(self.model).max_context
        if self.input_tokens + self.output_tokens > ctx:
            raise BadInput(f"input + output tokens ({self.input_tokens + self.output_tokens}) exceed the context "
                           f"length {ctx}")


@dataclass(frozen=True)
class Prediction:
    batch: int  # sequences decoding at the operating point
    rate_rps: float  # highest request rate one instance sustains within the SLO
    output_tps: float
    ttft_s: float
    tpot_s: float
    limited_by: str


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


class SteadyState:
    """Continuous batching of one instance in steady state with n sequences decoding (module docstring)."""

    def __init__(self, dep: cap.Deployment, input_tokens: int, output_tokens: int,
                 capacity: cap.Capacity | None = None):
        self.capacity = capacity or cap.capacity(dep, with_ratios=False)
        self.i, self.o = input_tokens, output_tokens
        self.pm = PerfModel(dep) if self.capacity.fits else None
        self.kv_limit = max(0, self.capacity.kv_pool_tokens_total // (input_tokens + output_tokens))
        self.limit = min(self.capacity.max_running_requests, self.kv_limit) if self.capacity.fits else 0
        self.ttft_alone = self.pm.prefill_time(input_tokens, chunk=CHUNKED_PREFILL) if self.pm else math.inf

    def point(self, n: int) -> tuple[float, float, float]:
        """(TPOT = step time, request rate, TTFT) with n sequences decoding."""
        prefill = n * self.i / self.o
        chunk = max(1, round(min(prefill, CHUNKED_PREFILL)))
        t = self.pm.step_time(n, n * (self.i + self.o // 2), chunk, prefill_pairs(chunk, self.i // 2), self.i)
        return t, n / (self.o * t), self.ttft_alone + t

    def at_rate(self, rate_rps: float) -> dict | None:
        """Predicted figures at an offered rate: below saturation the batch that sustains it, past it the
        largest batch that fits (the queue then grows without bound: saturated=True)."""
        if self.limit < 1 or rate_rps <= 0:
            return None
        lo, hi = 1, self.limit
        if self.point(hi)[1] < rate_rps:
            n, saturated = hi, True
        else:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if self.point(mid)[1] < rate_rps else (lo, mid)
            n, saturated = hi, False
        t, rate, ttft = self.point(n)
        served = rate if saturated else rate_rps
        return {"batch": n, "rate_rps": served, "output_tps": served * self.o, "tpot_s": t, "ttft_s": ttft,
                "saturated": saturated}


def predict(dep: cap.Deployment, input_tokens: int, output_tokens: int, slo_ttft_s: float,
            slo_tpot_s: float, capacity: cap.Capacity | None = None) -> Prediction | None:
    """The highest steady-state rate one instance sustains within the SLO (see the module docstring).
    None when the model does not fit; rate 0 when even one request misses the SLO."""
    s = SteadyState(dep, input_tokens, output_tokens, capacity)
    if s.limit < 1:
        return None

    def meets(n: int) -> bool:
        t, _, ttft = s.point(n)
        return t <= slo_tpot_s and ttft <= slo_ttft_s

    if not meets(1):
        t, _, ttft = s.point(1)
        return Prediction(0, 0.0, 0.0, ttft, t, "TTFT SLO" if ttft > slo_ttft_s else "TPOT SLO")
    lo, hi = 1, s.limit  # step time grows with n: bisect for the last n that meets the SLO
    if meets(hi):
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    n = lo
    t, rate, ttft = s.point(n)
    if n == s.limit:
        limited = "KV cache" if s.kv_limit <= s.capacity.max_running_requests else "max_running_requests"
    else:
        limited = "TPOT SLO" if s.point(n + 1)[0] > slo_tpot_s else "TTFT SLO"
    return Prediction(n, rate, rate * output_tokens, ttft, t, limited)


def make_plan(q: Question) -> Plan:
    q.check()
    dep = q.deployment()
    caps = cap.compare(dep)
    if not any(c.kv_dtype == q.kv_dtype and c.weights == q.weights for c in caps):
        caps.append(cap.capacity(dep))  # a choice outside the four-way (e.g. fp8_e5m2, int4-g128): shown too
    options = []
    for c in caps:
        d = replace(dep, kv_dtype=c.kv_dtype, weights=c.weights)
        pred = predict(d, q.input_tokens, q.output_tokens, q.slo_ttft_s, q.slo_tpot_s, c)
        options.append(Option(c.kv_dtype, c.weights, c, pred, q.price, q.tp, q.target_rate_rps, q.gpus_on_hand,
                              chosen=(c.kv_dtype == q.kv_dtype and c.weights == q.weights)))
    plan = Plan(q, options, dep.context_len)
    for o in options:
        if not o.capacity.fits:
            plan.notes.append(f"{o.label} does not fit {q.tp} x {q.gpu}.")
        elif o.prediction is not None and o.prediction.rate_rps == 0:
            plan.notes.append(f"{o.label}: even one request misses the SLO ({o.prediction.limited_by}).")
    return plan
