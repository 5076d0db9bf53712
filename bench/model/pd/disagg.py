"""Prefill/decode disaggregation: P prefill instances and D decode instances of one model, each instance DP attention +
DeepEP expert parallelism over all its GPUs (one to several nodes), the KV cache moving from prefill to decode over
the NIC, and a router in front (SGLang's --disaggregation-mode, sglang-router --pd-disaggregation).

What one instance of each role sustains comes from the same step times as colocated serving (perfmodel.py), with
the MoE's communication replaced by DeepEP's all-to-all (interconnect.py: normal kernels on prefill, low-latency
kernels on decode) and EPLB's redundant experts taking weight memory from each decode rank's KV pool:
- decode: the batch per rank is the largest that (a) the rank's KV pool holds at the requests' full length
  (prompt + output), (b) SGLang's max running requests allow, and (c) keeps a decode step within the TPOT bound.
  An instance then serves batch * ranks / (output tokens * step) requests per second.
- prefill: each rank fills a chunk of `chunk` tokens per step; a request waits in its rank's queue (the p-quantile
  wait of an M/M/1 queue, a conservative stand-in), then is prefilled, then its KV crosses the NIC. An instance
  serves the highest rate whose TTFT (wait + prefill + transfer + router) meets the bound, capped by what its NICs
  can move.
- P and D for a target load are ceil(target / each role's rate): the ratio follows from the workload.

Colocated serving, for the comparison in words and the property tests (search.py), is the same instance time-sharing
both phases: prefill takes a share f = rate * prefill seconds per request of each second, and every decode step is
stretched by 1 / (1 - f), the interference PD removes; not the simulator the colocated plan uses (the Planner says
which figure comes from which).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from functools import cache

from bench.model.advice.option import HOURS_PER_MONTH
from bench.model.fits import catalog
from bench.model.fits.capacity import Deployment, capacity, cell_bytes, mem_fraction_static, memory_tier, weight_bytes
from bench.model.serving import queues
from bench.model.serving.slo import Slo
from bench.model.serving.workload import Workload, draw
from bench.model.step import Efficiency, PerfModel, interconnect, load_efficiency, usd_per_million

SAMPLES = 4000


@dataclass(frozen=True)
class Lengths:
    """Mean prompt tokens, of which cached (a shared prefix hot on every prefill instance), mean output tokens,
    and the longest request (prompt + output) a decode rank must hold."""

    prompt: float
    cached: float
    output: float
    longest: int

    @property
    def new(self) -> float:
        return max(self.prompt - self.cached, 1.0)


def lengths(wl: Workload, seed: int = 0) -> Lengths:
    """The workload's mean lengths, drawn as the simulator draws them."""
    rng = random.Random(seed)
    system = int(wl.options.get("system_tokens", 0))
    ins = [draw(wl.input, rng) for _ in range(SAMPLES)]
    outs = [draw(wl.output, rng) for _ in range(SAMPLES)]
    cached = system if wl.type == "shared_prefix" else 0
    return Lengths(system + sum(ins) / SAMPLES, cached, sum(outs) / SAMPLES, system + max(ins) + max(outs))


def pd_mem_fraction(model: str, gpu: str) -> float:
    """--mem-fraction-static for every PD instance: SGLang's default for one node without DP attention. With DP
    attention its default grows the CUDA-graph reserve with the DP size (max_bs * dp * 3 MB: 98 GB at dp64), which
    wide-EP deployments override; the launch commands pass this value so the plan and the servers agree."""
    g = catalog.gpu(gpu)
    return mem_fraction_static(catalog.model(model), g, g.gpus_per_node, 1)


def redundant_experts(experts: int, gpus: int) -> int:
    """EPLB's redundant experts: enough for an equal count on every GPU, at least one more per GPU when the experts
    already divide evenly (as published: DeepSeek 256 + 32 on 72 GPUs, Kimi K2 384 + 96 on 96 GPUs)."""
    if gpus <= 1:
        return 0
    per = math.ceil(experts / gpus) + (1 if experts % gpus == 0 else 0)
    return per * gpus - experts


@dataclass(frozen=True)
class Shape:
    """One disaggregated deployment: instance sizes (GPUs; each instance is DP attention + EP over all of them)."""

    model: str
    gpu: str
    prefill_gpus: int
    decode_gpus: int
    kv_dtype: str = "fp8_e4m3"
    weights: str = "native"
    eplb: bool = True
    context: int | None = None
    prefill_dp_attention: bool = True  # False: the prefill instance's attention is tensor-parallel (long prompts)
    two_batch_overlap: bool = True  # SGLang --enable-two-batch-overlap: the all-to-all hides under the compute
    mem_fraction: tuple[float | None, float | None] = (None, None)  # (prefill, decode) --mem-fraction-static
    max_running: tuple[int | None, int | None] = (None, None)  # (prefill, decode) --max-running-requests

    def dp(self, role: str) -> int:  # DP attention over every GPU, but 1 where the prefill's attention is TP
        return 1 if role == "prefill" and not self.prefill_dp_attention else self.gpus(role)

    def gpus(self, role: str) -> int:
        return self.prefill_gpus if role == "prefill" else self.decode_gpus

    def deployment(self, role: str) -> Deployment:
        g, dp = self.gpus(role), self.dp(role)
        m, gpu = catalog.model(self.model), catalog.gpu(self.gpu)
        k = 0 if role == "prefill" else 1
        return Deployment(m, gpu, g, dp, self.kv_dtype, self.weights, self.context,
                          mem_fraction=self.mem_fraction[k] or pd_mem_fraction(self.model, self.gpu), ep=g,
                          max_running=self.max_running[k])

    def redundant(self, role: str) -> int:
        return redundant_experts(catalog.model(self.model).routed_experts, self.gpus(role)) if self.eplb else 0

    @property
    def label(self) -> str:
        per = catalog.gpu(self.gpu).gpus_per_node
        def part(g: int, dp: bool = True) -> str:
            return f"{g} GPUs ({max(1, g // per)} node{'s' if g > per else ''}) {f'dp{g}' if dp else f'tp{g}'} ep{g}"
        return (f"{self.gpu} PD: prefill {part(self.prefill_gpus, self.prefill_dp_attention)}, decode "
                f"{part(self.decode_gpus)}, {self.kv_dtype} KV")


@dataclass(frozen=True)
class Pool:
    """A decode rank's KV pool after EPLB's redundant experts took their weight memory."""

    tokens_per_rank: int
    max_running_per_rank: int
    fits: bool


@cache
def decode_pool(shape: Shape) -> Pool:
    dep = shape.deployment("decode")
    c, m = capacity(dep, with_ratios=False), dep.model
    extra = weight_bytes(m, shape.weights, dep.tp, dep.dp).routed_experts * shape.redundant("decode") / m.routed_experts
    tokens = max(0, c.kv_pool_tokens - math.ceil(extra / cell_bytes(m, shape.kv_dtype, 1)))
    tokens = tokens // dep.page_size * dep.page_size
    running = c.max_running_requests // dep.dp if c.fits else 0
    return Pool(tokens, running, c.fits and tokens > 0)


def _efficiency(shape: Shape, eff: Efficiency | None) -> Efficiency:
    e = eff or load_efficiency(shape.gpu)
    return replace(e, ep_skew=e.ep_skew * interconnect.assumptions()["eplb_skew"]) if shape.eplb else e


class PDPerfModel(PerfModel):
    """Step times of one PD instance (what the twin's schedulers run too): PerfModel's terms, with DeepEP's
    all-to-all (normal kernels on prefill, low-latency on decode) as the MoE's communication, hidden under the
    compute by two-batch overlap. No CPU floor per streamed token: PD deployments stream from the router."""

    def __init__(self, shape: Shape, role: str, eff: Efficiency | None = None) -> None:
        super().__init__(shape.deployment(role), _efficiency(shape, eff))
        self.shape, self.role = shape, role

    def step_time(self, decode_batch: int, decode_ctx: int, prefill_tokens: int = 0, prefill_attn: float = 0.0,
                  prefill_ctx: int = 0, busiest: tuple[int, float] | None = None) -> float:
        if self.role == "decode":  # the KV arrived by transfer: SGLang's decode server runs no extend for it
            if decode_batch <= 0:
                return self.overhead_s if prefill_tokens > 0 else 0.0
            prefill_tokens, prefill_attn, prefill_ctx = 0, 0.0, 0
        if decode_batch <= 0 and prefill_tokens <= 0:
            return 0.0
        parts = self.parts(decode_batch, decode_ctx, prefill_tokens, prefill_attn, prefill_ctx, busiest=busiest)
        dep, m = self.dep, self.dep.model
        attention_allreduce = parts["comm"] / 2 if dep.dp == 1 else 0.0  # TP attention keeps its all-reduce
        per_rank = (decode_batch * self.verify + prefill_tokens) / dep.tp
        parts["comm"] = attention_allreduce + m.moe_layers * interconnect.all_to_all_s(
            dep.gpu, dep.ep, per_rank, m.hidden_size, m.experts_per_token,
            "normal" if self.role == "prefill" else "low_latency")
        return _step(self, parts, self.shape.two_batch_overlap)


@cache
def _perf(shape: Shape, role: str, eff: Efficiency | None) -> PDPerfModel:
    return PDPerfModel(shape, role, eff)


def decode_step_s(shape: Shape, batch_per_rank: int, context: float, eff: Efficiency | None = None) -> float:
    """One decode step of every rank holding batch_per_rank requests of `context` tokens (low-latency all-to-all)."""
    total = batch_per_rank * shape.dp("decode")
    return _perf(shape, "decode", eff).step_time(total, int(total * context))


def _step(pm: PerfModel, parts: dict[str, float], overlap: bool) -> float:
    """A step's seconds; with two-batch overlap the communication runs beside the compute of the other micro-batch
    and only what sticks out past it counts."""
    if not overlap:
        return pm._time(parts)
    comm, parts = parts["comm"], {**parts, "comm": 0.0}
    core = pm._time(parts)
    return core + max(0.0, comm - (core - parts["overhead"]))


def chunk(shape: Shape) -> int:
    """Prefill tokens one prefill queue takes per step: SGLang's chunked prefill size of this GPU's memory tier, per
    DP rank with DP attention (each rank its own queue), per instance without."""
    return memory_tier(catalog.gpu(shape.gpu), 8)[0]


def prefill_step_s(shape: Shape, tokens: int, ln: Lengths, eff: Efficiency | None = None) -> float:
    """One prefill step with `tokens` new tokens in each queue (every DP rank, or the whole TP instance) of prompts
    like ln (normal all-to-all of each rank's share of the tokens)."""
    total = tokens * shape.dp("prefill")
    pairs = total * (ln.cached + (ln.new + 1) / 2)  # each new token attends to the cached prefix and half its own
    return _perf(shape, "prefill", eff).step_time(0, 0, total, pairs, int(total * (ln.cached / ln.new + 1)))


def kv_bytes(shape: Shape, tokens: float) -> float:
    """The KV of `tokens` tokens as it crosses from prefill to decode (one copy: the MLA latent, or all KV heads)."""
    return cell_bytes(catalog.model(shape.model), shape.kv_dtype, 1) * tokens


@dataclass
class Answer:
    """What one shape serves, per instance of each role, and what a target load then needs."""

    shape: Shape
    lengths: Lengths
    price: float  # $ per GPU-hour
    target_rps: float
    prefill_rps: float  # one prefill instance within the TTFT bound (and its NICs)
    decode_rps: float  # one decode instance within the TPOT bound and its KV pool
    batch_per_rank: int
    kv_tokens_per_rank: int  # the KV that batch holds at the requests' full length
    kv_pool_per_rank: int
    ttft_s: float  # at the SLO's percentile, at the prefill rate above
    tpot_s: float
    transfer_s: float
    prefill_limited_by: str
    decode_limited_by: str
    rejected_because: str | None = None

    @property
    def serves(self) -> bool:
        return self.rejected_because is None and self.prefill_rps > 0 and self.decode_rps > 0

    @property
    def prefill_instances(self) -> int:
        return max(1, math.ceil(self.target_rps / self.prefill_rps - 1e-9)) if self.serves else 0

    @property
    def decode_instances(self) -> int:
        return max(1, math.ceil(self.target_rps / self.decode_rps - 1e-9)) if self.serves else 0

    def served(self, prefill_instances: int, decode_instances: int) -> tuple[float, float]:
        """(requests/s, output tokens/s) of this shape with these instance counts: the slower role sets the pace."""
        rate = min(prefill_instances * self.prefill_rps, decode_instances * self.decode_rps)
        return rate, rate * self.lengths.output

    @property
    def gpus_needed(self) -> int:
        return self.prefill_instances * self.shape.prefill_gpus + self.decode_instances * self.shape.decode_gpus

    @property
    def monthly_cost(self) -> float | None:
        return self.gpus_needed * self.price * HOURS_PER_MONTH if self.serves else None

    @property
    def gpus_per_rps(self) -> float:
        """GPUs per request/s at the ideal P:D ratio (no rounding to whole instances)."""
        if not self.serves:
            return math.inf
        return self.shape.prefill_gpus / self.prefill_rps + self.shape.decode_gpus / self.decode_rps

    @property
    def usd_per_m_output(self) -> float | None:
        """$ per 1M output tokens of the instances the target needs, run at the highest rate they serve within the
        SLO (as a colocated option's figure is: its instance at its highest rate)."""
        if not self.serves:
            return None
        _, tps = self.served(self.prefill_instances, self.decode_instances)
        return usd_per_million(self.price, self.gpus_needed, tps)

    @property
    def ratio(self) -> str:
        return f"{self.prefill_instances}P:{self.decode_instances}D" if self.serves else "-"

    def to_row(self) -> dict:
        s = self.shape
        return {"config": s.label, "gpu": s.gpu, "prefill_gpus": s.prefill_gpus, "decode_gpus": s.decode_gpus,
                "kv_dtype": s.kv_dtype, "weights": s.weights, "eplb_redundant_experts": s.redundant("decode"),
                "prefill_instances": self.prefill_instances, "decode_instances": self.decode_instances,
                "ratio": self.ratio, "prefill_rps_per_instance": self.prefill_rps,
                "decode_rps_per_instance": self.decode_rps, "decode_batch_per_rank": self.batch_per_rank,
                "kv_tokens_per_rank": self.kv_tokens_per_rank, "kv_pool_per_rank": self.kv_pool_per_rank,
                "ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "kv_transfer_s": self.transfer_s,
                "prefill_limited_by": self.prefill_limited_by, "decode_limited_by": self.decode_limited_by,
                "gpus_total": self.gpus_needed if self.serves else None, "monthly_cost": self.monthly_cost,
                "usd_per_m_output": self.usd_per_m_output, "price_per_gpu_hour": self.price,
                "rejected_because": self.rejected_because}


def batch_candidates(cap: int) -> list[int]:
    """Decode batches per rank tried: 32 steps up to the cap (the colocated comparison tries the same)."""
    return sorted({max(1, cap * k // 32) for k in range(1, 33)}) if cap >= 1 else []


def decode_batch(shape: Shape, ln: Lengths, slo: Slo, eff: Efficiency | None = None,
                 in_flight: int | None = None) -> tuple[int, float, str]:
    """(batch per rank, step seconds, what limits it): of the batches the KV pool, max running requests and a
    client's cap of `in_flight` requests per decode instance allow, the one with the most output tokens/s whose
    step meets the TPOT bound (past the CUDA-graph size a bigger batch can be slower); 0 when not even one request
    meets them."""
    pool = decode_pool(shape)
    seq = ln.prompt + ln.output
    by_kv = int(pool.tokens_per_rank // seq) if pool.fits else 0
    cap = min(by_kv, pool.max_running_per_rank)
    by_client = math.ceil(in_flight / shape.dp("decode")) if in_flight else cap
    capped, cap = by_client < cap, min(cap, by_client)
    ctx = ln.prompt + ln.output / 2
    best, best_step = 0, 0.0
    for b in batch_candidates(cap):
        step = decode_step_s(shape, b, ctx, eff)
        if (slo.tpot_s is None or step <= slo.tpot_s) and (best == 0 or b / step > best / best_step):
            best, best_step = b, step
    if best == cap:
        limit = (f"concurrency cap ({in_flight} in flight)" if capped else
                 "KV pool" if by_kv <= pool.max_running_per_rank else "max running requests")
    elif best and slo.tpot_s is not None and decode_step_s(shape, min(cap, best * 2), ctx, eff) > slo.tpot_s:
        limit = f"TPOT p{slo.percentile}"
    else:
        limit = "decode efficiency"
    return best, best_step, limit if best else "KV pool"


def evaluate(shape: Shape, ln: Lengths, slo: Slo, target_rps: float, price: float | None = None,
             transfer: bool = True, eff: Efficiency | None = None, in_flight: int | None = None) -> Answer:
    """What one shape serves. transfer=False: the KV transfer and the router cost nothing (the ideal case).
    in_flight: a client's cap per decode instance (a plan's "to each instance"): the decode batch is capped, and
    the instance serves the rate at which the wait for a slot (held TTFT + output x TPOT) plus TTFT meets the TTFT
    bound (queues.py; the prefill side spent the budget first, the wait gets the rest: conservative)."""
    price = catalog.gpu(shape.gpu).price_per_gpu_hour if price is None else price
    ans = Answer(shape, ln, price, target_rps, 0.0, 0.0, 0, 0, 0, 0.0, 0.0, 0.0, "-", "-")
    pre, dec = shape.deployment("prefill"), shape.deployment("decode")
    for role, dep in (("prefill", pre), ("decode", dec)):
        c = capacity(dep, with_ratios=False)
        if not c.fits:
            ans.rejected_because = (f"the weights do not fit the {role} instance: {c.weight_bytes_per_gpu / 1e9:,.1f} "
                                    f"GB per GPU")
            return ans
    pool = decode_pool(shape)
    ans.kv_pool_per_rank = pool.tokens_per_rank
    if pool.tokens_per_rank < ln.longest:
        ans.rejected_because = (f"a decode rank's KV pool of {pool.tokens_per_rank:,} tokens (after "
                                f"{shape.redundant('decode')} redundant experts) cannot hold the longest request "
                                f"({ln.longest:,} tokens)")
        return ans
    batch, step, ans.decode_limited_by = decode_batch(shape, ln, slo, eff, in_flight)
    if batch < 1:
        ans.rejected_because = (f"no decode batch meets the TPOT bound ({slo.tpot_s * 1e3:,.0f} ms)" if slo.tpot_s
                                else "a decode rank holds no request")
        return ans
    ans.batch_per_rank, ans.tpot_s = batch, step
    ans.kv_tokens_per_rank = int(batch * (ln.prompt + ln.output))
    ans.decode_rps = batch * dec.dp / (ln.output * step)
    # prefill: each queue (a DP rank, or the whole TP instance) takes a chunk per step
    size = chunk(shape)
    pstep = prefill_step_s(shape, size, ln, eff)
    per_request = pstep * ln.new / size  # queue-seconds of prefill per request at full chunks
    first = min(size, max(1, round(ln.new)))  # a request's own time in prefill: its chunks with nothing beside them
    service = prefill_step_s(shape, first, ln, eff) * math.ceil(ln.new / size)
    a = interconnect.assumptions()
    ans.transfer_s = interconnect.kv_transfer_s(pre.gpu, kv_bytes(shape, ln.prompt)) if transfer else 0.0
    extra = ans.transfer_s + (a["router_ms"] * 1e-3 if transfer else 0.0)
    q = slo.percentile / 100

    def ttft(rho: float) -> float:
        return service + queues.mm1_wait_quantile(per_request, rho, q) + extra

    if slo.ttft_s is None:
        rho, ans.prefill_limited_by = 1.0, "prefill compute"
    elif ttft(1e-6) > slo.ttft_s:
        ans.rejected_because = (f"even an idle prefill instance misses the TTFT bound: {ttft(1e-6):,.2f} s "
                                f"(prefill {service:,.2f} s + KV transfer {ans.transfer_s * 1e3:,.0f} ms)")
        return ans
    else:
        lo, hi = 1e-6, 0.999
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if ttft(mid) <= slo.ttft_s else (lo, mid)
        rho, ans.prefill_limited_by = lo, f"TTFT p{slo.percentile}"
    ans.ttft_s = ttft(rho if rho < 1 else 0.999)
    ans.prefill_rps = rho * pre.dp / per_request  # pre.dp queues
    if transfer:
        nic = pre.tp * interconnect.nic_bytes_per_s(pre.gpu) / kv_bytes(shape, ln.prompt)
        if nic < ans.prefill_rps:
            ans.prefill_rps, ans.prefill_limited_by = nic, "KV transfer (NIC)"
    if in_flight:
        hold = ans.ttft_s + ln.output * step
        rate = queues.capped_rate(in_flight, hold, ans.ttft_s, slo.ttft_s, q)
        if rate < ans.decode_rps:
            ans.decode_rps = rate
            ans.decode_limited_by = f"concurrency cap ({in_flight} in flight, the wait for a slot)"
            ans.ttft_s += queues.slot_wait_quantile(rate, in_flight, hold, q)
    return ans
