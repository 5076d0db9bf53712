"""A disaggregated deployment in virtual time, as the PD twin plays it in real time (bench/twin/pd.py): P prefill and
D decode instances behind a router that deals requests to each role in turn (each instance takes total / count of
the load). A request queues at its prefill instance (its own scheduler, PDPerfModel's prefill steps), its KV
crosses to its decode instance in the modelled transfer time plus the router's latency, lands there as cached
blocks, and that decode instance's scheduler produces every output token, the first included. Every instance runs
on its own clock; the one furthest behind steps next. Returns simulate.py's Point, so an SLO and a campaign read it
alike.
"""

from __future__ import annotations

import heapq
import math

from bench.model import catalog, disagg, interconnect
from bench.model.calibration import Efficiency
from bench.model.capacity import capacity
from bench.model.perfmodel import usd_per_million
from bench.model.scheduler import Request, Scheduler
from bench.model.simulate import BLOCK, MIN_SECONDS, WARMUP, Point, _overlap, percentile
from bench.model.workload import Workload, make_requests


def schedulers(shape: disagg.Shape, eff: Efficiency | None = None) -> tuple[Scheduler, Scheduler]:
    """(prefill, decode) schedulers of one instance each."""
    pre, dec = shape.deployment("prefill"), shape.deployment("decode")
    pcap = capacity(pre, with_ratios=False)
    pool = disagg.decode_pool(shape)
    prefill = Scheduler(disagg.PDPerfModel(shape, "prefill", eff), pcap.kv_pool_tokens_total,
                        pcap.max_running_requests, disagg.chunk(shape) * pre.dp, BLOCK)
    decode = Scheduler(disagg.PDPerfModel(shape, "decode", eff), pool.tokens_per_rank * dec.dp,
                       pool.max_running_per_rank * dec.dp, disagg.chunk(shape) * dec.dp, BLOCK)
    return prefill, decode


class Prefill:
    """One prefill instance: its scheduler, clock and the requests the router dealt it (by arrival)."""

    def __init__(self, sched: Scheduler, reqs: list[Request]) -> None:
        self.sched, self.reqs, self.next, self.clock = sched, reqs, 0, 0.0
        self.shadows: dict[Request, Request] = {}

    def admit(self) -> None:
        while self.next < len(self.reqs) and self.reqs[self.next].arrival <= self.clock:
            r = self.reqs[self.next]
            shadow = Request(rid=r.rid, prompt_len=r.prompt_len, max_new=1, arrival=r.arrival,
                             prompt_keys=r.prompt_keys)
            self.shadows[shadow] = r
            self.sched.submit(shadow)
            self.next += 1


class Decode:
    """One decode instance: its scheduler, clock, and the KV transfers on their way to it (by landing time)."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched, self.clock = sched, 0.0
        self.handoffs: list[tuple[float, int, Request]] = []


def play(shape: disagg.Shape, prefills: list[Prefill], decodes: list[Decode], route: dict[Request, int]) -> float:
    """Run every instance until all requests are done (route: request -> its decode instance); returns the decode
    instances' sum of running requests x step time (for the mean batch)."""
    gpu = shape.deployment("prefill").gpu
    router = interconnect.assumptions()["router_ms"] * 1e-3
    running_time = 0.0
    while True:
        p = min(prefills, key=lambda x: x.clock)
        d = min(decodes, key=lambda x: x.clock)
        if p.clock == d.clock == math.inf:
            return running_time
        if p.clock <= d.clock:
            p.admit()
            step = p.sched.plan()
            if step is None:  # idle until its next arrival; none left: this prefill instance is done
                p.clock = p.reqs[p.next].arrival if p.next < len(p.reqs) else math.inf
                continue
            p.clock += step.duration
            _, done = p.sched.commit(step, p.clock)
            for shadow in done:
                r = p.shadows.pop(shadow)
                transfer = interconnect.kv_transfer_s(gpu, disagg.kv_bytes(shape, r.prompt_len)) + router
                heapq.heappush(decodes[route[r]].handoffs, (p.clock + transfer, id(r), r))
            continue
        while d.handoffs and d.handoffs[0][0] <= d.clock:
            _, _, r = heapq.heappop(d.handoffs)
            d.sched.cache.add_free(r.prompt_keys)
            d.sched.submit(r)
        step = d.sched.plan()
        if step is None:  # idle until the next KV lands, which no prefill makes earlier than its clock
            d.clock = min(d.handoffs[0][0] if d.handoffs else math.inf, p.clock)
            continue
        running_time += d.sched.num_running * step.duration
        d.clock += step.duration
        d.sched.commit(step, d.clock)


def run(shape: disagg.Shape, wl: Workload, rate: float, n: int = 1000, seed: int = 0, eff: Efficiency | None = None,
        min_seconds: float = MIN_SECONDS, price: float | None = None, instances: tuple[int, int] = (1, 1)) -> Point:
    """simulate.run for `instances` = (P, D) prefill and decode instances of the shape: rate Poisson arrivals (at
    least min_seconds of them), request k to prefill k mod P and decode k mod D; latencies of those after the
    warm-up, output tokens/s delivered in the arrival window (each request's tokens spread over its decode, as
    simulate.run counts them)."""
    n_pre, n_dec = instances
    decodes = [Decode(schedulers(shape, eff)[1]) for _ in range(n_dec)]
    if 0 < rate < math.inf:
        n = max(n, math.ceil(rate * min_seconds))
    ctx = min(shape.deployment("decode").context_len, decodes[0].sched.pool)
    reqs = make_requests(wl, rate, n, seed, BLOCK, ctx)
    prefills = [Prefill(schedulers(shape, eff)[0], reqs[k::n_pre]) for k in range(n_pre)]
    running_time = play(shape, prefills, decodes, {r: k % n_dec for k, r in enumerate(reqs)})
    done = [r for r in reqs if r.state == "done"]
    last = max((r.arrival for r in reqs), default=0.0)
    lo, hi = (last * WARMUP, last) if last > 0 else (0.0, max((r.finish for r in done), default=0.0))
    measured = [r for r in done if r.arrival >= lo]
    tokens = sum(r.max_new * _overlap(r.first_token, r.finish, lo, hi) for r in done) if last > 0 else \
        sum(r.max_new for r in done)
    finished = sum(1 for r in done if lo <= r.finish <= hi)
    window = hi - lo
    ttft = [r.first_token - r.arrival for r in measured]
    tpot = [(r.finish - r.first_token) / (r.max_new - 1) for r in measured if r.max_new > 1]
    e2e = [r.finish - r.arrival for r in measured]
    out = tokens / window if window > 0 else 0.0
    gpus = n_pre * shape.prefill_gpus + n_dec * shape.decode_gpus
    price = shape_price(shape) if price is None else price
    busy = max((r.finish for r in done), default=0.0)
    return Point(rate=rate, achieved_rps=finished / window if window > 0 else 0.0, output_tok_s=out,
                 ttft_p50=percentile(ttft, 50), ttft_p90=percentile(ttft, 90), ttft_p99=percentile(ttft, 99),
                 tpot_p50=percentile(tpot, 50), tpot_p90=percentile(tpot, 90), tpot_p99=percentile(tpot, 99),
                 e2e_p50=percentile(e2e, 50), e2e_p90=percentile(e2e, 90), e2e_p99=percentile(e2e, 99),
                 cache_hit_rate=_hit_rate([p.sched for p in prefills]),
                 mean_running=running_time / busy if busy else 0.0,
                 retractions=sum(d.sched.stats["retractions"] for d in decodes),
                 rejected=n - len(done), usd_per_million=usd_per_million(price, gpus, out) or math.inf)


def _hit_rate(prefills: list[Scheduler]) -> float:
    prompt = sum(p.stats["prompt_tokens"] for p in prefills)
    return sum(p.stats["cached_tokens"] for p in prefills) / prompt if prompt else 0.0


def shape_price(shape: disagg.Shape) -> float:
    return catalog.gpu(shape.gpu).price_per_gpu_hour
