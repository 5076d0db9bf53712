"""A capacity plan: for a model, workload, SLO, target load and prices, the search over deployments that the CLI
(`capbench plan`), the Planner and the report all use, so they show the same figures.

Searched: every GPU of the catalog (or those asked for), tensor parallelism from the smallest power of two that holds
the weights up to two nodes, DP attention off or over all tp GPUs, EP off or over all tp GPUs, BF16 or FP8 KV, every
expert format the GPU runs with a real SGLang kernel and the model can be had in (fits/formats.py: shipped by its
vendor, published, or made by `capbench quantize-experts`; "not obtainable" formats are never searched), and the
replicas the target load needs. Each configuration is first sized (SGLang's memory arithmetic: rejected when the weights
do not fit or the KV pool cannot hold the workload's longest request), then screened by a burst (its saturation
throughput gives an optimistic $ per 1M tokens), and the finalists (the asked-for configuration, the cheapest by the
screen, the best of each GPU, and the KV-dtype x weights variants of the best) get the converged highest rate within the
SLO (rate.py). The recommendation is the finalist that serves the target load for the least money a month.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace

from bench.errors import BadInput
from bench.model.advice import curve, notes, prices
from bench.model.advice.launch import expert_ep
from bench.model.advice.option import HOURS_PER_MONTH, Config, Option, obtainable, unobtainable
from bench.model.evidence import corpus
from bench.model.fits import backend, catalog, formats
from bench.model.fits.capacity import capacity
from bench.model.serving import workload
from bench.model.serving.rate import Prediction, answer_key, closed_loop, saturation_tps, search_rate
from bench.model.serving.slo import SYNTAX, Slo
from bench.model.serving.workload import Workload, fixed_workload, load_workload
from bench.model.step import kernels

__all__ = ["HOURS_PER_MONTH", "Config", "Option", "Plan", "Prediction", "Question", "make_plan", "workload_names"]
FINALISTS = 6  # cheapest configurations by the screen that are simulated, besides the asked-for one and each GPU's best
SCREEN_REQUESTS = 300


def workload_names() -> list[str]:
    """Named request mixes in data/workloads the simulator takes."""
    return workload.names()


@dataclass(frozen=True)
class Question:
    model: str = "kimi-k2-thinking"
    gpu: str = "h200"  # the GPU you asked about (its price may be yours); others are searched at catalog prices
    tp: int = 8  # your configuration: shown beside the search, never left out of it
    gpus: int | None = None  # GPUs on hand of `gpu`: what they serve is shown
    kv_dtype: str = "fp8_e4m3"
    weights: str = "native"
    context: int | None = None
    workload: str | None = "chat"  # a data/workloads name or YAML path; None: fixed input/output tokens
    input_tokens: int = 2000
    output_tokens: int = 500
    slo: Slo = Slo(ttft_s=2.0, tpot_s=0.05)
    price_per_gpu_hour: float | None = None  # for `gpu`; default: the catalog's indicative price
    target_rate_rps: float = 10.0
    search_gpus: tuple[str, ...] | None = None  # None: every GPU in the catalog
    dp: int = 1
    ep: int = 1
    max_concurrency: int | None = None  # the client keeps at most this many requests in flight to each instance
    gpu_prices: tuple[tuple[str, float], ...] = ()  # (gpu, $ per GPU-hour) given for GPUs other than `gpu`

    @property
    def chosen(self) -> Config:
        return Config(self.gpu, self.tp, self.dp, max(self.ep, expert_ep(self.model, self.tp, self.weights)),
                      self.kv_dtype, self.weights)

    def deployment(self, **changes):
        q = replace(self, **changes)
        return q.chosen.deployment(q.model, q.context)

    def request_mix(self) -> Workload:
        if self.workload:
            return load_workload(self.workload)
        return fixed_workload(self.input_tokens, self.output_tokens)

    def describe_workload(self) -> str:
        if self.workload:
            return workload.describe(self.request_mix())
        return f"{self.input_tokens:,} input and {self.output_tokens:,} output tokens per request"

    def describe_cap(self) -> str:
        """The concurrency cap in words ('' without one): the plan's answers hold only under it."""
        if self.max_concurrency is None:
            return ""
        return (f", at most {self.max_concurrency} requests in flight to each instance (arrivals wait for a free "
                "slot; the wait counts in TTFT)")

    def price_of(self, gpu: str) -> float:
        return prices.price_of(self, gpu)

    @property
    def price(self) -> float:
        return self.price_of(self.gpu)

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
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise BadInput(f"max concurrency must be at least 1, got {self.max_concurrency}")
        if self.gpus is not None and (self.gpus < self.tp or self.gpus % self.tp):
            raise BadInput(f"GPU count {self.gpus} must be a multiple of tp {self.tp}")
        for g in self.search_gpus or ():
            catalog.gpu(g)
        prices.check(self)
        self.deployment()  # validates model, GPU, tp, dp, ep, KV dtype, weights, context
        ctx = self.context or catalog.model(self.model).max_context
        if not self.workload and self.input_tokens + self.output_tokens > ctx:
            raise BadInput(f"input + output tokens ({self.input_tokens + self.output_tokens}) exceed the context "
                           f"length {ctx}")


@dataclass
class Plan:
    question: Question
    options: list[Option]
    context: int
    notes: list[str] = field(default_factory=list)
    _curves: dict | None = field(default=None, repr=False, compare=False)

    @property
    def chosen(self) -> Option:
        return next(o for o in self.options if o.chosen)

    @property
    def recommended(self) -> Option | None:
        return next((o for o in self.options if o.recommended), None)

    @property
    def simulated(self) -> list[Option]:
        return [o for o in self.options if o.simulated]

    def four_way(self, around: Option | None = None) -> list[Option]:
        """The KV dtype x expert weights variants at one GPU and parallelism (the recommended one's by default):
        what FP8 KV and INT4 experts buy. The first is the BF16-KV, native-weights baseline."""
        o = around or self.recommended or self.chosen
        c = o.config
        same = [x for x in self.simulated if (x.config.gpu, x.config.tp, x.config.dp, x.config.ep) ==
                (c.gpu, c.tp, c.dp, c.ep) and x.config.attention is None]
        return sorted(same, key=lambda x: (x.weights != "native", x.kv_dtype != "bf16"))

    def by_gpu(self) -> list[Option]:
        """The cheapest simulated option of each GPU that serves the load (the GPU comparison)."""
        best: dict[str, Option] = {}
        for o in self.simulated:
            g = o.config.gpu
            if o.monthly_cost is not None and (g not in best or o.monthly_cost < best[g].monthly_cost):
                best[g] = o
        return sorted(best.values(), key=lambda o: o.monthly_cost)

    def gain(self, option: Option, base: Option, key: str) -> float | None:
        a, b = option.to_row()[key], base.to_row()[key]
        return None if a is None or not b else a / b

    def rows(self) -> list[dict]:
        return [o.to_row() for o in self.options]

    def curves(self) -> dict:
        """Each configuration that serves the load as a curve over concurrency (bench/model/advice/curve.py), the Pareto
        front over all their points, the published points of the same configurations, and the SLO's tokens/s per
        user (1 / its TPOT bound). Computed once, on first use."""
        if self._curves is None:
            wl, points, pub = self.question.request_mix(), [], []
            for o in self.simulated:
                if o.serves:
                    dep = o.config.deployment(self.question.model, self.question.context)
                    points += curve.curve(o.label, dep, wl)
                    pub += [{"config": o.label, **x} for x in curve.published(corpus.load(), dep)]
            tpot = self.question.slo.tpot_s
            self._curves = {"points": [p.to_dict() for p in curve.front(points)], "published": pub,
                            "slo_tps_per_user": 1 / tpot if tpot else None}
        return self._curves


def _configs(q: Question) -> list[Config]:
    model = catalog.model(q.model)
    out = []
    for gpu_id in q.search_gpus or sorted(catalog.gpus()):
        gpu = catalog.gpu(gpu_id)
        for tp in (1, 2, 4, 8, 16, 32):
            if tp > 2 * gpu.gpus_per_node:
                break
            for dp in ((1, tp) if tp > 1 else (1,)):
                for ep in ((1, tp) if tp > 1 else (1,)):
                    for kv in ("bf16", "fp8_e4m3"):
                        for w in formats.searched(model, gpu):  # each with the EP its scale groups need
                            out.append(Config(gpu_id, tp, dp, max(ep, expert_ep(q.model, tp, w)), kv, w))
    if q.chosen not in out:
        out.append(q.chosen)
    return list(dict.fromkeys(out))


def _backends(q: Question, b: Config) -> list[Config]:
    """The FP8-KV variants of a configuration on every other SGLang backend that keeps calibrated FP8 scales
    (bench/model/fits/backend.py), each priced with its own kernel table (the roofline, said, where it has none)."""
    model, gpu = catalog.model(q.model), catalog.gpu(b.gpu)
    out = []
    for kv in ("fp8_e4m3",):
        default = backend.launch_backend(model, gpu, kv, b.tp)
        searched = set(formats.searched(model, gpu))  # the asked-for weights too, when the search offers them
        for w in sorted({b.weights} | ({q.weights} & searched)):  # a set's order changes with the process
            base = replace(b, kv_dtype=kv, weights=w, attention=None)
            out += [replace(base, attention=name) for name in backend.candidates(model, gpu, kv) if name != default]
    return out


def _longest(wl: Workload) -> int:
    """The longest request (prompt + answer) the workload asks for, from its length bounds."""
    def top(lengths) -> int:
        p = lengths.params
        return int(p.get("max") or p.get("value") or max((b[1] for b in p.get("bins", [])), default=0) or 0)

    base = int(wl.options.get("system_tokens", 0))
    if wl.type in ("multi_turn", "agentic_coding"):
        return 0  # sessions grow with their turns: bounded by the context, not checked here
    return base + top(wl.input) + top(wl.output)


def _size(q: Question, cfg: Config, wl: Workload, longest: int) -> Option:
    dep = cfg.deployment(q.model, q.context)
    c = capacity(dep, with_ratios=False)
    o = Option(cfg, q.model, c, q.price_of(cfg.gpu), q.target_rate_rps, chosen=cfg == q.chosen,
               gpus_on_hand=q.gpus_on_hand if cfg.gpu == q.gpu else None)
    if not c.fits:
        o.rejected_because = (f"the weights do not fit: {c.weight_bytes_per_gpu / 1e9:,.1f} GB per GPU, short by "
                              f"{c.short_by_bytes_per_gpu / 1e9:,.1f} GB")
    elif longest and c.kv_pool_tokens_total < longest:
        o.rejected_because = (f"KV pool of {c.kv_pool_tokens_total:,} tokens cannot hold the workload's longest "
                              f"request ({longest:,} tokens)")
    return o


def _screen(args: tuple) -> float:
    q, cfg, wl = args
    return saturation_tps(cfg.deployment(q.model, q.context), wl, SCREEN_REQUESTS)


def _simulate(args: tuple) -> Prediction | None:
    q, cfg, wl = args
    return search_rate(cfg.deployment(q.model, q.context), wl, q.slo, cap=q.max_concurrency)


def _curve_point(args: tuple) -> None:
    q, cfg, wl, c, n = args
    closed_loop(cfg.deployment(q.model, q.context), wl, c, n)  # kept in the answers' cache for Plan.curves()


def _map(fn, jobs: list, pool: ProcessPoolExecutor | None, tick: Callable[[], None]) -> list:
    out = []
    for r in pool.map(fn, jobs) if pool and len(jobs) > 1 else map(fn, jobs):
        out.append(r)
        tick()
    return out


def _front(opts: list[Option], better: Callable[[Option, Option], bool]) -> set[int]:
    return {id(o) for o in opts if not any(better(x, o) for x in opts if x is not o)}


def make_plan(q: Question, progress: Callable[[str, int, int], None] | None = None, workers: int = 1,
              curves: bool = False) -> Plan:
    """progress(stage, done, total) as the search advances; workers: processes, forked after reading the tables;
    curves: the caller draws Plan.curves(), so the workers run their points too (the same figures, in the cache)."""
    q.check()
    if workers <= 1:
        return _make_plan(q, progress, None)
    kernels.load_tables()
    with ProcessPoolExecutor(workers) as pool:
        plan = _make_plan(q, progress, pool)
        if curves:
            wl = q.request_mix()
            jobs = [(q, o.config, wl, c, n) for o in plan.simulated if o.serves
                    for c, n in curve.runs(o.config.deployment(q.model, q.context))]
            done = iter(range(1, len(jobs) + 1))
            _map(_curve_point, jobs, pool, lambda: (progress or (lambda *_: None))("drawing curves", next(done),
                                                                                   len(jobs)))
        return plan


def _make_plan(q: Question, progress: Callable[[str, int, int], None] | None, pool: ProcessPoolExecutor | None) -> Plan:
    wl = q.request_mix()
    say = progress or (lambda *_: None)
    longest = _longest(wl)
    options = [_size(q, cfg, wl, longest) for cfg in _configs(q)]
    alive = [o for o in options if o.rejected_because is None]
    done = [0]

    def tick(stage: str, total: int) -> Callable[[], None]:
        def f() -> None:
            done[0] += 1
            say(stage, done[0], total)
        return f

    for o, tps in zip(alive, _map(_screen, [(q, o.config, wl) for o in alive], pool,
                                  tick("screening", len(alive))), strict=True):
        o.saturation_tps = tps

    def optimistic(o: Option) -> float:
        return o.price * o.tp / o.saturation_tps if o.saturation_tps else math.inf

    ranked = sorted(alive, key=optimistic)
    picks = ranked[:FINALISTS] + [o for o in alive if o.chosen]
    for gpu in {o.config.gpu for o in alive}:
        picks += [o for o in ranked if o.config.gpu == gpu][:1]
    if ranked:
        b = ranked[0].config
        picks += [o for o in alive if (o.config.gpu, o.config.tp, o.config.dp, o.config.ep) ==
                  (b.gpu, b.tp, b.dp, b.ep)]
    finalists = list({id(o): o for o in picks}.values())

    def simulate_all(opts: list[Option]) -> None:
        done[0] = 0
        keys = [answer_key(o.config.deployment(q.model, q.context), wl, q.slo, q.max_concurrency) for o in opts]
        first: dict[str, Option] = {}  # one search per answer (two workers would both run a shared one)
        for k, o in zip(keys, opts, strict=True):
            first.setdefault(k, o)
        preds = dict(zip(first, _map(_simulate, [(q, o.config, wl) for o in first.values()], pool,
                                     tick("simulating finalists", len(first))), strict=True))
        for o, k in zip(opts, keys, strict=True):
            o.prediction = pred = preds[k]
            if pred is not None and pred.rate_rps == 0:
                o.rejected_because = (f"no rate meets the SLO: {pred.limited_by} is {_seconds(pred, q.slo)} even "
                                      "at the lowest rate tried")

    simulate_all(finalists)
    for _ in range(3):  # the KV dtype x weights variants of the cheapest, so the four-way is complete
        serving = [o for o in finalists if o.serves and obtainable(q.model, o.config)]
        if not serving:
            break
        b = min(serving, key=lambda o: (o.monthly_cost, o.gpus_needed, o.usd_per_m_output)).config
        more = [o for o in alive if o not in finalists and (o.config.gpu, o.config.tp, o.config.dp, o.config.ep) ==
                (b.gpu, b.tp, b.dp, b.ep)]
        if not any(o.config.attention for o in finalists):  # each backend that keeps FP8 scales, own table
            extra = [_size(q, c, wl, longest) for c in _backends(q, b)]
            extra = [o for o in extra if o.rejected_because is None]
            options += extra
            more += extra
        if not more:
            break
        simulate_all(more)
        finalists += more
    serving = [o for o in finalists if o.serves and obtainable(q.model, o.config)]
    if serving:
        # a pool that holds no sequence at the asked context is recommended only when no configuration's does
        holds = [o for o in serving if o.capacity.max_concurrent_sequences_at_context >= 1]
        best = min(holds or serving, key=lambda o: (o.monthly_cost, o.gpus_needed, o.usd_per_m_output))
        best.recommended = True
        cheapest = best.usd_per_m_output
        for o in alive:
            if not o.simulated and o.rejected_because is None:
                o.rejected_because = (f"screened out: even at saturation ${optimistic(o) / 3600 * 1e6:,.2f} per 1M "
                                      f"output tokens, the recommended serves at ${cheapest:,.2f} within the SLO")
        front = _front(serving, lambda a, b: a.output_tps_per_gpu >= b.output_tps_per_gpu and
                       a.prediction.tps_per_user >= b.prediction.tps_per_user and
                       (a.output_tps_per_gpu, a.prediction.tps_per_user) != (b.output_tps_per_gpu,
                                                                              b.prediction.tps_per_user))
        front_cost = _front(serving, lambda a, b: a.usd_per_m_output <= b.usd_per_m_output and
                            a.prediction.e2e_s <= b.prediction.e2e_s and
                            (a.usd_per_m_output, a.prediction.e2e_s) != (b.usd_per_m_output, b.prediction.e2e_s))
        for o in serving:
            o.pareto, o.pareto_cost = id(o) in front, id(o) in front_cost
    plan = Plan(q, options, q.context or catalog.model(q.model).max_context)
    if not serving:
        plan.notes.append("No configuration searched serves this workload within the SLO: relax the SLO, shorten "
                          "the requests, or look at the rejections below.")
    chosen = plan.chosen
    if not obtainable(q.model, chosen.config):
        plan.notes.append(f"Your configuration ({chosen.label}) is shown but never recommended: "
                          f"{unobtainable(q.model, chosen.config)}.")
    if chosen.rejected_because:
        plan.notes.append(f"Your configuration ({chosen.label}): {chosen.rejected_because}.")
    plan.notes += notes.interval_notes(plan.recommended, plan.simulated, chosen, q.target_rate_rps)
    plan.notes.append(notes.fp8_note(q.model, q.context, (plan.recommended or chosen).config))
    plan.notes += notes.format_notes(q.model, q.search_gpus or sorted(catalog.gpus()))
    return plan


def _seconds(pred: Prediction, slo: Slo) -> str:
    name = pred.limited_by.split()[0].lower()
    value = {"ttft": pred.ttft_s, "tpot": pred.tpot_s, "e2e": pred.e2e_s}.get(name)
    return "-" if value is None else (f"{value * 1e3:,.0f} ms" if value < 1 else f"{value:,.1f} s")
