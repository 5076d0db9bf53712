"""A disaggregated deployment in virtual time, as the PD twin plays it in real time (bench/twin/pd.py): requests
queue at the prefill instance (its own scheduler, PDPerfModel's prefill steps), their KV crosses to the decode
instance in the modelled transfer time plus the router's latency, lands there as cached blocks, and the decode
instance's scheduler produces every output token, the first included. The two instances run side by side, each
on its own clock; the one behind steps next. Returns simulate.py's Point, so an SLO and a campaign read it alike.
"""

from __future__ import annotations

import heapq
import math

from bench.model import catalog, disagg, interconnect
from bench.model.calibration import Efficiency
from bench.model.capacity import capacity
from bench.model.perfmodel import usd_per_million
from bench.model.scheduler import Request, Scheduler
from bench.model.simulate import BLOCK, MIN_SECONDS, WARMUP, Point, percentile
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


def play(shape: disagg.Shape, prefill: Scheduler, decode: Scheduler, reqs: list[Request]) -> float:
    """Run open-loop requests (sorted by arrival) through both instances until all are done; returns the decode
    instance's sum of running requests x step time (for the mean batch)."""
    gpu = shape.deployment("prefill").gpu
    router = interconnect.assumptions()["router_ms"] * 1e-3
    shadows: dict[Request, Request] = {}
    handoffs: list[tuple[float, int, Request]] = []
    tp = td = running_time = 0.0
    i, n = 0, len(reqs)
    while True:
        while i < n and reqs[i].arrival <= tp:
            r = reqs[i]
            shadow = Request(rid=r.rid, prompt_len=r.prompt_len, max_new=1, arrival=r.arrival,
                             prompt_keys=r.prompt_keys)
            shadows[shadow] = r
            prefill.submit(shadow)
            i += 1
        while handoffs and handoffs[0][0] <= td:
            _, _, r = heapq.heappop(handoffs)
            decode.cache.add_free(r.prompt_keys)
            decode.submit(r)
        if tp <= td:
            step = prefill.plan()
            if step is None:  # idle until the next arrival; none left: the prefill instance is done
                tp = reqs[i].arrival if i < n else math.inf
                continue
            tp += step.duration
            _, done = prefill.commit(step, tp)
            for shadow in done:
                r = shadows.pop(shadow)
                transfer = interconnect.kv_transfer_s(gpu, disagg.kv_bytes(shape, r.prompt_len)) + router
                heapq.heappush(handoffs, (tp + transfer, id(r), r))
        else:
            step = decode.plan()
            if step is None:  # idle until the next KV lands, which prefill makes no earlier than its clock
                td = min(handoffs[0][0] if handoffs else math.inf, tp)
                if td == math.inf:
                    return running_time
                continue
            running_time += decode.num_running * step.duration
            td += step.duration
            decode.commit(step, td)


def run(shape: disagg.Shape, wl: Workload, rate: float, n: int = 1000, seed: int = 0, eff: Efficiency | None = None,
        min_seconds: float = MIN_SECONDS, price: float | None = None) -> Point:
    """simulate.run for one prefill and one decode instance: rate Poisson arrivals (at least min_seconds of them),
    latencies of those after the warm-up, output tokens/s delivered in the arrival window."""
    prefill, decode = schedulers(shape, eff)
    if 0 < rate < math.inf:
        n = max(n, math.ceil(rate * min_seconds))
    ctx = min(shape.deployment("decode").context_len, decode.pool)
    reqs = make_requests(wl, rate, n, seed, BLOCK, ctx)
    running_time = play(shape, prefill, decode, reqs)
    done = [r for r in reqs if r.state == "done"]
    last = max((r.arrival for r in reqs), default=0.0)
    lo, hi = (last * WARMUP, last) if last > 0 else (0.0, max((r.finish for r in done), default=0.0))
    measured = [r for r in done if r.arrival >= lo]
    tokens = sum(r.max_new for r in done if lo <= r.finish <= hi) if last > 0 else sum(r.max_new for r in done)
    finished = sum(1 for r in done if lo <= r.finish <= hi)
    window = hi - lo
    ttft = [r.first_token - r.arrival for r in measured]
    tpot = [(r.finish - r.first_token) / (r.max_new - 1) for r in measured if r.max_new > 1]
    e2e = [r.finish - r.arrival for r in measured]
    out = tokens / window if window > 0 else 0.0
    gpus = shape.prefill_gpus + shape.decode_gpus
    price = shape_price(shape) if price is None else price
    busy = max((r.finish for r in done), default=0.0)
    return Point(rate=rate, achieved_rps=finished / window if window > 0 else 0.0, output_tok_s=out,
                 ttft_p50=percentile(ttft, 50), ttft_p90=percentile(ttft, 90), ttft_p99=percentile(ttft, 99),
                 tpot_p50=percentile(tpot, 50), tpot_p90=percentile(tpot, 90), tpot_p99=percentile(tpot, 99),
                 e2e_p50=percentile(e2e, 50), e2e_p90=percentile(e2e, 90), e2e_p99=percentile(e2e, 99),
                 cache_hit_rate=prefill.stats["cached_tokens"] / prefill.stats["prompt_tokens"]
                 if prefill.stats["prompt_tokens"] else 0.0,
                 mean_running=running_time / busy if busy else 0.0, retractions=decode.stats["retractions"],
                 rejected=n - len(done), usd_per_million=usd_per_million(price, gpus, out) or math.inf)


def shape_price(shape: disagg.Shape) -> float:
    return catalog.gpu(shape.gpu).price_per_gpu_hour
