"""A disaggregated deployment in virtual time, as the PD twin plays it in real time (bench/twin/pd.py): P prefill and
D decode instances behind a router that deals requests to each role in turn (each instance takes total / count of
the load). A request queues at its prefill instance (its own scheduler, PDPerfModel's prefill steps), its KV
crosses to its decode instance in the modelled transfer time plus the router's latency, lands there as cached
blocks, and that decode instance's scheduler produces every output token, the first included. Every instance runs
on its own clock; the one whose next step comes first (the one furthest behind) steps next. In front of the router
the client may cap the requests in flight across the whole deployment (bench_serving --max-concurrency, with or
without --request-rate, as simulate.play plays it for one instance): a request is sent when due and a slot is free,
and its latencies count from the send. Returns simulate.py's Point, so an SLO and a campaign read it alike.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from bench.model.fits import catalog
from bench.model.fits.capacity import capacity
from bench.model.pd import disagg
from bench.model.serving.scheduler import Request, Scheduler
from bench.model.serving.simulate import BLOCK, MIN_SECONDS, WARMUP, Point, _overlap, percentile
from bench.model.serving.workload import Workload, make_requests
from bench.model.step import interconnect
from bench.model.step.calibration import Efficiency
from bench.model.step.perfmodel import usd_per_million


def schedulers(shape: disagg.Shape, eff: Efficiency | None = None) -> tuple[Scheduler, Scheduler]:
    """(prefill, decode) schedulers of one instance each."""
    pre, dec = shape.deployment("prefill"), shape.deployment("decode")
    pcap = capacity(pre, with_ratios=False)
    pool = disagg.decode_pool(shape)
    prefill = Scheduler(disagg.PDPerfModel(shape, "prefill", eff), pcap.kv_pool_tokens_total,
                        pcap.max_running_requests, disagg.chunk(shape) * pre.dp, BLOCK, runs=True)
    decode = Scheduler(disagg.PDPerfModel(shape, "decode", eff), pool.tokens_per_rank * dec.dp,
                       pool.max_running_per_rank * dec.dp, disagg.chunk(shape) * dec.dp, BLOCK, runs=True)
    return prefill, decode


class Prefill:
    """One prefill instance: its scheduler, clock and the requests the client sent it (in send order)."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched, self.clock = sched, 0.0
        self.queue: deque[Request] = deque()
        self.shadows: dict[Request, Request] = {}

    def next_event(self) -> float:
        """When it steps next: now while it has work, else at the next request sent to it (inf: none yet)."""
        if self.sched.num_running or self.sched.waiting:
            return self.clock
        return max(self.clock, self.queue[0].arrival) if self.queue else math.inf

    def admit(self) -> None:
        while self.queue and self.queue[0].arrival <= self.clock:
            r = self.queue.popleft()
            shadow = Request(rid=r.rid, prompt_len=r.prompt_len, max_new=1, arrival=r.arrival,
                             prompt_keys=r.prompt_keys)
            self.shadows[shadow] = r
            self.sched.submit(shadow)


class Decode:
    """One decode instance: its scheduler, clock, and the KV transfers on their way to it (by landing time)."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched, self.clock = sched, 0.0
        self.handoffs: list[tuple[float, int, Request]] = []

    def next_event(self) -> float:
        if self.sched.num_running or self.sched.waiting:
            return self.clock
        return max(self.clock, self.handoffs[0][0]) if self.handoffs else math.inf


class Client:
    """The load generator in front of the router (sglang.bench_serving): a request is due at its `arrival` and sent
    when it is due and, under a concurrency cap, fewer than `cap` requests are in flight across the whole deployment
    (the client's semaphore, in due order); a request sent has its `arrival` set to the send, so its latencies count
    from there, as bench_serving counts them. Without a cap every request is sent when due."""

    def __init__(self, reqs: list[Request], prefills: list[Prefill], cap: int | None) -> None:
        self.reqs, self.prefills, self.cap, self.sent = reqs, prefills, cap, 0
        self.frees: list[float] = []  # slots freed (a request finished), not yet settled
        for _ in range(len(reqs) if cap is None else min(cap, len(reqs))):
            self.send(0.0)

    def send(self, free: float) -> None:
        """The next request in due order takes a slot freed at `free`; dealt to prefill k mod P in send order."""
        if self.sent < len(self.reqs):
            r = self.reqs[self.sent]
            r.arrival = max(r.arrival, free)
            self.prefills[self.sent % len(self.prefills)].queue.append(r)
            self.sent += 1

    def free(self, now: float, count: int) -> None:
        """`count` requests ended at `now` (finished or dropped): under a cap, their slots free."""
        if self.cap is not None:
            for _ in range(count):
                heapq.heappush(self.frees, now)

    def settle(self, now: float) -> None:
        """Send on every slot freed by `now`, earliest first: no instance can free one earlier any more."""
        while self.frees and self.frees[0] <= now:
            self.send(heapq.heappop(self.frees))


def play(shape: disagg.Shape, client: Client, decodes: list[Decode], route: dict[Request, int]) -> float:
    """Run every instance until all requests are done (route: request -> its decode instance); returns the decode
    instances' sum of running requests x step time (for the mean batch). The instance whose next step comes first
    takes it (a prefill one on a tie), so no input reaches an instance after it stepped past the input's time; one
    with nothing to do and nothing on its way (a prefill instance waiting for the client to send) waits without a
    clock. A slot a request frees is settled (the next request sent on it) once no instance can free one earlier."""
    gpu = shape.deployment("prefill").gpu
    router = interconnect.assumptions()["router_ms"] * 1e-3
    prefills = client.prefills
    running_time = 0.0
    while True:
        p = min(prefills, key=Prefill.next_event)
        d = min(decodes, key=Decode.next_event)
        tp, td = p.next_event(), d.next_event()
        if client.frees and client.frees[0] <= min(tp, td):
            client.settle(min(tp, td))
            continue
        if tp == td == math.inf:
            return running_time
        if tp <= td:
            p.clock = tp
            p.admit()
            step = p.sched.plan()
            if step is None:  # a prompt its KV pool cannot hold, with nothing running: never served
                client.free(p.clock, len(_drop(p.sched)))
                continue
            p.clock += step.duration
            _, done = p.sched.commit(step, p.clock)
            for shadow in done:
                r = p.shadows.pop(shadow)
                transfer = interconnect.kv_transfer_s(gpu, disagg.kv_bytes(shape, r.prompt_len)) + router
                heapq.heappush(decodes[route[r]].handoffs, (p.clock + transfer, id(r), r))
            continue
        d.clock = td
        while d.handoffs and d.handoffs[0][0] <= d.clock:
            _, _, r = heapq.heappop(d.handoffs)
            d.sched.cache.add_free(r.prompt_keys)
            d.sched.submit(r)
        step = d.sched.plan()
        if step is None:
            client.free(d.clock, len(_drop(d.sched)))
            continue
        running_time += d.sched.num_running * step.duration
        d.clock += step.duration
        _, done = d.sched.commit(step, d.clock)
        client.free(d.clock, len(done))


def _drop(sched: Scheduler) -> list[Request]:
    """Abort what waits in an idle scheduler that admits none of it (no step can ever take it)."""
    stuck = list(sched.waiting)
    for r in stuck:
        sched.abort(r)
    return stuck


def run(shape: disagg.Shape, wl: Workload, rate: float, n: int = 1000, seed: int = 0, eff: Efficiency | None = None,
        min_seconds: float = MIN_SECONDS, price: float | None = None, instances: tuple[int, int] = (1, 1),
        concurrency: int | None = None) -> Point:
    """simulate.run for `instances` = (P, D) prefill and decode instances of the shape: rate Poisson arrivals (at
    least min_seconds of them), request k to prefill k mod P and decode k mod D; latencies of those after the
    warm-up, output tokens/s delivered in the arrival window (each request's tokens spread over its decode, as
    simulate.run counts them). concurrency: at most that many requests in flight across the deployment (the
    client's cap, in front of the router), as simulate.play plays it: closed loop with rate inf (a request sent the
    moment another finishes), paced with a rate (sent when due and a slot is free; the wait is slot_wait_*)."""
    n_pre, n_dec = instances
    decodes = [Decode(schedulers(shape, eff)[1]) for _ in range(n_dec)]
    if 0 < rate < math.inf:
        n = max(n, math.ceil(rate * min_seconds))
    ctx = min(shape.deployment("decode").context_len, decodes[0].sched.pool)
    reqs = make_requests(wl, rate, n, seed, BLOCK, ctx)
    due = [r.arrival for r in reqs]
    client = Client(reqs, [Prefill(schedulers(shape, eff)[0]) for _ in range(n_pre)], concurrency)
    running_time = play(shape, client, decodes, {r: k % n_dec for k, r in enumerate(reqs)})
    waits = {id(r): r.arrival - t for r, t in zip(reqs, due, strict=True)} if rate < math.inf else {}
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
    wait = [waits.get(id(r), 0.0) for r in measured]
    out = tokens / window if window > 0 else 0.0
    gpus = n_pre * shape.prefill_gpus + n_dec * shape.decode_gpus
    price = shape_price(shape) if price is None else price
    busy = max((r.finish for r in done), default=0.0)
    return Point(rate=rate, achieved_rps=finished / window if window > 0 else 0.0, output_tok_s=out,
                 ttft_p50=percentile(ttft, 50), ttft_p90=percentile(ttft, 90), ttft_p99=percentile(ttft, 99),
                 tpot_p50=percentile(tpot, 50), tpot_p90=percentile(tpot, 90), tpot_p99=percentile(tpot, 99),
                 e2e_p50=percentile(e2e, 50), e2e_p90=percentile(e2e, 90), e2e_p99=percentile(e2e, 99),
                 cache_hit_rate=_hit_rate([p.sched for p in client.prefills]),
                 mean_running=running_time / busy if busy else 0.0,
                 retractions=sum(d.sched.stats["retractions"] for d in decodes),
                 rejected=n - len(done), usd_per_million=usd_per_million(price, gpus, out) or math.inf,
                 slot_wait_p50=percentile(wait, 50), slot_wait_p90=percentile(wait, 90),
                 slot_wait_p99=percentile(wait, 99))


def _hit_rate(prefills: list[Scheduler]) -> float:
    prompt = sum(p.stats["prompt_tokens"] for p in prefills)
    return sum(p.stats["cached_tokens"] for p in prefills) / prompt if prompt else 0.0


def shape_price(shape: disagg.Shape) -> float:
    return catalog.gpu(shape.gpu).price_per_gpu_hour
