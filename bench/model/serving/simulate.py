"""`capbench simulate`: the twin's scheduler and performance model in virtual time, no HTTP.

A run offers n requests of a workload as a Poisson process and reports latency percentiles (TTFT from arrival
to the first token, TPOT = (finish - first token) / (output tokens - 1), end-to-end), throughput and cost.
A sweep (sweep.py) runs a grid of such rates for the curve, and takes its answer from rate.py's search.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from bench.errors import BadInput
from bench.model.fits.capacity import Deployment, capacity, memory_tier
from bench.model.serving.scheduler import Request, Scheduler
from bench.model.serving.slo import Slo
from bench.model.serving.workload import Workload, make_requests
from bench.model.step.perfmodel import Efficiency, PerfModel, cost_per_million_tokens

BLOCK = 32  # prefix-cache block: hits are rounded down to whole blocks (SGLang's radix: to tokens)
GRID = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2, 1.5)
WARMUP = 0.2  # the first 20 % of the arrival window is not measured
MIN_SECONDS = 300  # a rate point offers at least 5 minutes of arrivals, so queues have time to build


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass
class Point:
    rate: float
    achieved_rps: float
    output_tok_s: float
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    tpot_p50: float
    tpot_p90: float
    tpot_p99: float
    e2e_p50: float
    e2e_p90: float
    e2e_p99: float
    cache_hit_rate: float
    mean_running: float
    retractions: int
    rejected: int
    usd_per_million: float
    meets_slo: bool | None = None
    # with a concurrency cap and a rate: how long requests waited for a free slot before they were sent
    slot_wait_p50: float = 0.0
    slot_wait_p90: float = 0.0
    slot_wait_p99: float = 0.0

    def to_dict(self) -> dict:
        return _finite(asdict(self))


def make_scheduler(dep: Deployment, eff: Efficiency | None = None) -> Scheduler:
    cap = capacity(dep, with_ratios=False)
    if not cap.fits:
        raise BadInput(f"{dep.model.id} does not fit {dep.tp} x {dep.gpu.id} with {dep.weights} weights")
    return Scheduler(PerfModel(dep, eff), cap.kv_pool_tokens_total, cap.max_running_requests,
                     memory_tier(dep.gpu, dep.tp)[0], BLOCK, runs=True)


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    """Fraction of [a, b] inside [lo, hi] (a request's output tokens, spread evenly over its decode)."""
    if b <= a:
        return 1.0 if lo <= b <= hi else 0.0
    return max(0.0, min(b, hi) - max(a, lo)) / (b - a)


def play(sched: Scheduler, reqs: list[Request], concurrency: int | None = None, paced: bool = False
         ) -> tuple[float, float]:
    """Run requests through the scheduler in virtual time until all are done. Open loop (concurrency None): each
    request is sent at its `arrival` (sorted). Closed loop: `concurrency` requests are in flight, and one is sent
    the moment another finishes (sglang.bench_serving --max-concurrency); their arrivals are set here. Both
    (paced, with a concurrency): a request is due at its `arrival` and sent when it is due and fewer than
    `concurrency` are in flight (bench_serving's --request-rate with --max-concurrency: the request waits on the
    client's semaphore, and its latency counts from when it is sent). A request reaches the scheduler the model's
    request overhead after it is sent (HTTP, tokenizing, queueing).
    Returns (sum over steps of running requests x step time, busy time)."""
    delay = sched.perf.request_overhead_s
    n = len(reqs)
    cap = n if concurrency is None else concurrency
    due = [r.arrival if concurrency is None or paced else 0.0 for r in reqs]
    t, running_time, busy = 0.0, 0.0, 0.0
    ready: list[tuple[float, int]] = []  # (time it reaches the scheduler, index), sent and on its way
    sent = in_flight = 0

    def send(now: float) -> None:  # in due order: send times never decrease, so `ready` stays sorted
        nonlocal sent, in_flight
        while sent < n and in_flight < cap:
            reqs[sent].arrival = max(due[sent], now)
            ready.append((reqs[sent].arrival + delay, sent))
            sent, in_flight = sent + 1, in_flight + 1

    send(0.0)
    head = 0
    while True:
        while head < len(ready) and ready[head][0] <= t:
            sched.submit(reqs[ready[head][1]])
            head += 1
        step = sched.decode_span(ready[head][0] - t if head < len(ready) else math.inf) or sched.plan()
        if step is None:
            if head < len(ready):
                t = ready[head][0]
                continue
            return running_time, busy
        running_time += sched.num_running * step.duration
        busy += step.duration
        t += step.duration
        _, done = sched.commit(step, t)
        if done:
            in_flight -= len(done)
            send(t)


def run(dep: Deployment, wl: Workload, rate: float, n: int = 1000, seed: int = 0,
        eff: Efficiency | None = None, min_seconds: float = MIN_SECONDS, concurrency: int | None = None) -> Point:
    """Offer max(n, rate * min_seconds) requests at `rate` per second (math.inf: n, all at once). Latencies are
    of the requests that arrive after the warm-up; throughput is what the server delivered between the end of
    the warm-up and the last arrival (so an overloaded server shows its capacity, not the offered rate)."""
    sched = make_scheduler(dep, eff)
    if 0 < rate < math.inf:
        n = max(n, math.ceil(rate * min_seconds))
    reqs = make_requests(wl, rate, n, seed, BLOCK, min(dep.context_len, sched.pool))  # each must fit alone
    due = [r.arrival for r in reqs]
    running_time, busy = play(sched, reqs, concurrency, paced=rate < math.inf)
    waits = {id(r): r.arrival - d for r, d in zip(reqs, due, strict=True)} if rate < math.inf else {}
    done = [r for r in reqs if r.state == "done"]
    last = max((r.arrival for r in reqs), default=0.0)
    if last > 0:  # steady state: the first WARMUP of the arrival window warms up, tails drain outside it
        lo, hi = last * WARMUP, last
        measured = [r for r in done if r.arrival >= lo]
        tokens = sum(r.max_new * _overlap(r.first_token, r.finish, lo, hi) for r in done)
        finished = sum(1 for r in done if lo <= r.finish <= hi)
    else:  # all at once: the whole run
        lo, hi = 0.0, max((r.finish for r in done), default=0.0)
        measured, tokens, finished = done, sum(r.max_new for r in done), len(done)
    window = hi - lo
    ttft = [r.first_token - r.arrival for r in measured]
    tpot = [(r.finish - r.first_token) / (r.max_new - 1) for r in measured if r.max_new > 1]
    e2e = [r.finish - r.arrival for r in measured]
    wait = [waits.get(id(r), 0.0) for r in measured]
    out_tok_s = tokens / window if window > 0 else 0.0
    st = sched.stats
    return Point(
        rate=rate, achieved_rps=finished / window if window > 0 else 0.0, output_tok_s=out_tok_s,
        ttft_p50=percentile(ttft, 50), ttft_p90=percentile(ttft, 90), ttft_p99=percentile(ttft, 99),
        tpot_p50=percentile(tpot, 50), tpot_p90=percentile(tpot, 90), tpot_p99=percentile(tpot, 99),
        e2e_p50=percentile(e2e, 50), e2e_p90=percentile(e2e, 90), e2e_p99=percentile(e2e, 99),
        cache_hit_rate=st["cached_tokens"] / st["prompt_tokens"] if st["prompt_tokens"] else 0.0,
        mean_running=running_time / busy if busy else 0.0, retractions=st["retractions"],
        rejected=n - len(done), usd_per_million=cost_per_million_tokens(dep, out_tok_s),
        slot_wait_p50=percentile(wait, 50), slot_wait_p90=percentile(wait, 90), slot_wait_p99=percentile(wait, 99),
    )


@dataclass
class Sweep:
    kv_dtype: str
    saturation: Point
    points: list[Point]
    best_rate: float | None  # highest rate meeting the SLO, None if even the lowest misses
    best: Point | None
    slo: Slo

    def to_dict(self) -> dict:
        return _finite(asdict(self))


def _finite(obj):
    """JSON has no inf/nan: the burst run's rate and empty percentiles become null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj
