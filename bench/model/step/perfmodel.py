"""Step times of one SGLang instance: what a forward pass reads, computes and exchanges, on one GPU of it.

Where the measured kernel tables cover the GPU (data/kernels: H100, H200, B200, GB200, B300), the GPU work of a step
is priced operator by operator (kernel_step.py: attention on the deployment's backend and KV dtype, MoE in its
expert format and EP, all-reduce from the tables for its SGLang version, times kernel_scale; the dense GEMMs by the
roofline below), plus the kernels no operator term prices and the CPU terms below; an operator no table covers is
priced by the roofline below and `unmeasured` says so. A GPU without tables (MI300X, A100) is priced by the roofline
throughout ("no kernel measurement for ...: roofline"). CAPBENCH_PERF=roofline prices every GPU by the roofline (the
before/after comparison).

The roofline:

A step serves D decoding requests (each verifying v tokens: 1, or MTP's draft tokens + 1) and P prompt tokens
of chunked prefills, T = D*v + P tokens in all, spread over the dp DP-attention groups. On one GPU it takes

  GPU  = max(mem, compute) + (1 - overlap) * min(mem, compute)       memory and compute overlap only partly
         + layers * kernels * kernel_us                              every kernel's fixed cost on the GPU
         + layers * all-reduces(T)                                   ring all-reduce: latency + bytes / bus
  step = max(GPU, layers * kernels * launch_us if not a CUDA graph) + step_overhead
  mem  = (routed experts hit * EP imbalance + attention, shared, dense and lm_head weights + KV read) / (HBM * eff)
  compute = sum of GEMM flops / (peak of their format * eff(M)) + attention flops / (BF16 peak * eff)

- Experts hit: top-k routing of T tokens over E experts touches E * (1 - (1 - k/E)^T) of them.
- GEMM efficiency grows with the rows M of each GEMM: eff_max * M / (M + m_half); W4A16 (INT4 experts) reads a
  quarter of BF16's bytes and computes on BF16 tensor cores at int4_dequant times the cost at large M.
- W4A16 MoE kernels unpack each INT4 expert weight they touch, once per tile of int4_moe_m_tile of that expert's
  tokens, at int4_moe_unpack weights per BF16 FLOP/s: the expert GEMMs last at least that long, so an INT4
  expert costs more than its bytes at any batch and more again as tokens per expert pass a tile.
- EP: the slowest of the ep ranks sets the pace: expected max of per-rank loads (Gaussian tail, sqrt(2 ln ep)).
- DP attention: attention (weights split over tp/dp, KV of its own requests) runs per group; the MoE runs over
  all tp GPUs on all tokens; the hidden states are gathered and scattered around it. Each request lives on one
  group, so a step's prefill attention lasts as long as its busiest group's: at least the largest request's chunk
  (a long prompt prefills on one group at attn_tp speed while the others wait at the gather), else an even share.
- CUDA graphs: decode batches up to SGLang's graph size replay a graph; prefill and bigger batches launch every
  kernel from the CPU, which the GPU may outrun.
- MTP (EAGLE on the model's NextN layer): each step drafts `steps` tokens with one layer (steps - 1 draft decodes
  and a draft extend over the verified tokens, each with the full lm_head), verifies steps + 1 per request as one
  step of D * (steps + 1) tokens, and keeps accept_length = 1 + p + ... + p^steps of them on average.
A request also spends request_overhead outside the GPU (HTTP, tokenizing, queueing, the first chunk): the
scheduler adds it before the request reaches the queue. And the serving processes spend stream_token_us of CPU on
each streamed token beside the GPU: a decode step of D requests lasts at least D * accept_length * stream_token_us.
"""

from __future__ import annotations

import math
import os
from functools import cache

from bench.model.fits import formats
from bench.model.fits.capacity import Deployment, capacity, cell_bytes, memory_tier, weight_bytes, weight_formats
from bench.model.step import kernels
from bench.model.step.calibration import (
    FITTED_CALIBRATION,
    Efficiency,
    kernels_per_layer,
    load_efficiency,
)
from bench.model.step.kernel_step import TIMED, KernelStep

__all__ = ["Efficiency", "FITTED_CALIBRATION", "PerfModel", "attention_priced_by", "cost_per_million_tokens",
           "expected_experts", "load_efficiency", "prefill_pairs", "summary"]


def expected_experts(experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts hit when `tokens` tokens each pick top_k of `experts` uniformly."""
    if tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def prefill_pairs(new_tokens: int, prefix: int) -> float:
    """Causal attention (query, key) pairs of a chunk of new_tokens after prefix cached tokens."""
    return new_tokens * prefix + new_tokens * (new_tokens + 1) / 2


def _tail(n: int) -> float:
    """How many standard deviations the largest of n equal loads lies above their mean (0 for one)."""
    return math.sqrt(2 * math.log(n)) if n > 1 else 0.0


@cache
def _kernels() -> dict[str, int]:
    return kernels_per_layer()


class PerfModel:
    """Step times of one instance. All figures are for one GPU; every GPU of the instance runs the same step."""

    def __init__(self, dep: Deployment, eff: Efficiency | None = None) -> None:
        self.dep, self.eff = dep, eff or load_efficiency(dep.gpu.id)
        m, g, e = dep.model, dep.gpu, self.eff
        self.layers, self.dp, self.tp, self.ep = m.layers, dep.dp, dep.tp, dep.ep
        self.attn_tp = dep.tp // dep.dp
        self.experts, self.top_k = m.routed_experts, m.experts_per_token
        self.hidden = m.hidden_size
        wb = weight_bytes(m, dep.weights, dep.tp, dep.dp)
        params = weight_bytes(m, "bf16", dep.tp, dep.dp)  # bf16 bytes / 2 = parameters
        experts_fmt, rest_fmt = weight_formats(m, dep.weights)
        self.experts_fmt, self.rest_fmt = experts_fmt, rest_fmt
        # bytes read per step (per GPU)
        self.expert_bytes = wb.routed_experts
        self.lm_bytes = wb.embeddings / 2  # the input embedding is a gather; the lm_head is read every step
        self.dense_bytes = wb.total - wb.routed_experts - wb.embeddings
        self.cell = cell_bytes(m, dep.kv_dtype, self.attn_tp)
        # flops per token (per GPU): experts over all tp GPUs, attention projections per DP group
        self.expert_flops = params.routed_experts * m.experts_per_token / m.routed_experts  # 2 * params / 2
        self.expert_width = m.moe_intermediate_size * dep.ep / dep.tp  # TP-MoE shards each expert's columns
        self.expert_params = params.routed_experts / 2  # weights of all routed experts on one GPU
        self.unpack_per_s = g.bf16_tflops * 1e12 * e.int4_moe_unpack
        self.attn_proj_flops = params.attention
        self.mlp_flops = params.shared_experts + params.dense_mlp + params.other
        self.lm_flops = params.embeddings / 2
        heads = m.attention_heads / self.attn_tp
        if m.attention == "mla":  # decode absorbs W_UK/W_UV: scores and values over the 512+64 latent
            self.decode_attn = 2 * heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim) * m.layers
            self.prefill_attn = 2 * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) * m.layers
        else:
            self.decode_attn = 2 * heads * (m.head_dim + m.v_head_dim) * m.layers
            self.prefill_attn = self.decode_attn
        self.bytes_per_s = g.hbm_tbps * 1e12 * e.hbm_eff
        self.peak = {"bf16": g.bf16_tflops * 1e12 * e.bf16_eff,
                     "fp8": (g.fp8_tflops * 1e12 * e.fp8_eff) if g.fp8_tflops else g.bf16_tflops * 1e12 * e.bf16_eff}
        # FP4 tensor cores at FP8's efficiency (uncalibrated: no FP4 measurement in the corpus yet)
        self.peak["fp4"] = g.fp4_tflops * 1e12 * e.fp8_eff if g.fp4_tflops else self.peak["fp8"]
        self.arch = g.arch
        self._compute: dict[str, str] = {}  # formats.compute by format, on this arch: asked on every GEMM
        self.attn_peak = g.bf16_tflops * 1e12 * e.prefill_attn_eff
        link_gbps = g.interconnect_gbps / 2 if dep.tp <= g.gpus_per_node else g.internode_gbps
        self.link_bytes_per_s = link_gbps * 1e9 * e.allreduce_eff
        self.kernels = _kernels()["mla" if m.attention == "mla" else "gqa"]
        self.fixed_s = self.layers * self.kernels * e.kernel_us * 1e-6
        self.launch_s = self.layers * self.kernels * e.launch_us * 1e-6
        self.overhead_s = e.step_overhead_ms * 1e-3
        self.graph_bs = memory_tier(g, dep.tp)[1]
        # MTP: draft steps per decode step, tokens verified and kept per request
        self.steps = dep.mtp_steps if dep.mtp else 0
        self.verify = self.steps + 1
        p = min(e.mtp_accept, 0.999)
        self.accept_length = dep.accept_length or ((1 - p ** (self.steps + 1)) / (1 - p) if self.steps else 1)
        self.request_overhead_s = e.request_overhead_ms * 1e-3
        self.stream_s = e.stream_token_us * 1e-6
        self.moe_layers = m.layers - m.first_dense_layers
        self._last_decode: tuple[tuple[int, int] | None, float] = (None, 0.0)
        self.fast_decode = True  # False: every decode step through parts() (the test of _decode_on_tables)
        self._decode_terms: dict[int, tuple] = {}
        self.kstep: KernelStep | None = None
        self.unmeasured: dict[str, str] = {}
        if os.environ.get("CAPBENCH_PERF") != "roofline" and kernels.versions(g.id, "moe"):
            self.kstep = KernelStep(dep, _version(dep.sglang), self._roofline_op)
            self.unmeasured = self.kstep.unmeasured
            # the kernels no table times (norms, rope, router, quantisation) keep their fixed GPU cost
            self.fixed_s = self.layers * max(self.kernels - TIMED[m.attention], 0) * e.kernel_us * 1e-6
        else:
            self.unmeasured["step"] = kernels.no_table(f"{g.id}") if not kernels.versions(g.id, "moe") else \
                "kernel tables switched off (CAPBENCH_PERF=roofline): roofline"

    @property
    def model_said(self) -> str:
        """Which model priced the steps: the kernel tables (and what they lacked) or the roofline."""
        if self.kstep is None:
            return self.unmeasured["step"]
        return "; ".join(["kernel tables", *sorted(set(self.unmeasured.values()))])

    def _roofline_op(self, name: str, a: dict) -> float:
        """One operator of one layer (all layers for lm_head) by the roofline: what the kernel step falls back to."""
        bw = self.bytes_per_s
        if "n" in a and "k" in a:  # a dense GEMM
            wbytes = a["n"] * a["k"] * (1 if a["fmt"].startswith("fp8") else 0.5 if a["fmt"].startswith(("int4",
                                                                                                            "nvfp4",
                                                                                                            "mxfp4"))
                                        else 2)
            return max(wbytes / bw, self._gemm_s(2 * a["rows"] * a["n"] * a["k"], a["rows"], a["fmt"]))
        if name == "attention decode":
            ctx = a["ctx"]
            return max(self.cell / self.layers * ctx / bw,
                       self.decode_attn / self.layers * ctx * a["verify"] / self.peak["bf16"])
        if name == "attention prefill":
            return self.prefill_attn / self.layers * a["pairs"] / self.attn_peak
        if name == "MoE":
            nbytes, secs = self._moe(a["tokens"])
            return max(nbytes / bw, secs) / max(self.moe_layers, 1)
        if name == "all-reduce":
            return self._allreduce_s(a["tokens"], a["n"])
        raise ValueError(name)

    # ---- pieces
    def _gemm_s(self, flops: float, rows: float, fmt: str, width: float = 0.0) -> float:
        """A GEMM of `rows` tokens; `width`: columns of its weight slice on this GPU, where that is narrow."""
        if flops <= 0:
            return 0.0
        ramp = rows / (rows + self.eff.gemm_m_half)
        if width:
            flops *= (width + self.eff.gemm_n_half) / width
        kind = self._compute.get(fmt) or self._compute.setdefault(fmt, formats.compute(fmt, self.arch))
        if kind in ("wna16", "w4a8"):  # unpacked in the kernel onto BF16 (FP8) cores, dearer as the GEMM fills up
            peak = self.peak["fp8" if kind == "w4a8" else "bf16"]
            return flops / (peak * ramp) * (1 + (self.eff.int4_dequant - 1) * ramp)
        return flops / (self.peak[kind] * ramp)

    def _allreduce_s(self, tokens: float, n: int) -> float:
        if n <= 1 or tokens <= 0:
            return 0.0
        return self.eff.allreduce_latency_us * 1e-6 + 2 * (n - 1) / n * tokens * self.hidden * 2 / self.link_bytes_per_s

    def _moe(self, tokens: float) -> tuple[float, float]:
        """(bytes read, seconds of expert GEMMs) of the routed experts for `tokens` tokens, on the slowest rank."""
        hit = expected_experts(self.experts, self.top_k, tokens)
        frac = hit / self.experts
        mem_f = comp_f = 1.0
        if self.ep > 1:
            z = _tail(self.ep) * self.eff.ep_skew
            per_rank = self.experts / self.ep * frac
            mem_f += z * math.sqrt(max(per_rank * (1 - frac), 0.0)) / max(per_rank, 1e-9)
            load = tokens * self.top_k / self.ep
            comp_f += z * math.sqrt(load * (1 - 1 / self.ep)) / max(load, 1e-9)
        rows = tokens * self.top_k / max(hit, 1e-9)
        gemm = self._gemm_s(tokens * self.expert_flops, rows, self.experts_fmt, self.expert_width)
        if formats.compute(self.experts_fmt, self.arch) in ("wna16", "w4a8"):  # unpacked once per tile of rows
            tiles = math.ceil(rows / self.eff.int4_moe_m_tile)
            gemm = max(gemm, self.expert_params * frac * mem_f * tiles / self.unpack_per_s)
        return self.expert_bytes * frac * mem_f, gemm * comp_f

    def parts(self, decode_batch: int, decode_ctx: int, prefill_tokens: int = 0, prefill_attn: float = 0.0,
              prefill_ctx: int = 0, verify: int | None = None, layers_share: float = 1.0,
              busiest: tuple[int, float] | None = None) -> dict[str, float]:
        """Seconds of each term of one step (see the module docstring). decode_ctx: sum of the decoding requests'
        contexts; prefill_attn: attention pairs of the prefill chunks; prefill_ctx: KV tokens they read or write;
        busiest: (tokens, attention pairs) of the step's largest prefill chunk (None: the prefill splits evenly)."""
        v = self.verify if verify is None else verify
        tokens = decode_batch * v + prefill_tokens
        if tokens <= 0:
            return dict.fromkeys(("memory", "compute", "fixed", "comm", "launch", "overhead"), 0.0)
        rank_prefill, rank_pairs = prefill_tokens / self.dp, prefill_attn / self.dp
        if busiest and self.dp > 1:  # DP attention: the largest chunk's group sets the pace
            rank_prefill, rank_pairs = max(rank_prefill, busiest[0]), max(rank_pairs, busiest[1])
        # DP attention: each request decodes on one group (round robin), so the busiest holds ceil(D / dp) of them
        rank_decode = math.ceil(decode_batch / self.dp) if self.dp > 1 else decode_batch
        rank_ctx = decode_ctx * rank_decode / decode_batch if decode_batch else 0.0
        group = rank_decode * v + rank_prefill
        samples = decode_batch * v + (1 if prefill_tokens else 0)
        eager = prefill_tokens > 0 or decode_batch > self.graph_bs
        gather = 0.0
        if self.dp > 1:  # gather before the MoE, scatter after it, and the attention group's all-reduce
            gather = 2 * (self.eff.dp_gather_latency_us * 1e-6 + tokens * self.hidden * 2 / self.link_bytes_per_s)
        if self.kstep is not None:  # the roofline's terms below are not computed: a cold plan prices ~1M steps
            k = self.kstep.step(rank_decode, rank_ctx, v, group, tokens, samples,
                                rank_prefill, rank_pairs, not eager)
            work = (k["attention"] + k["gemm"] + k["moe"]) * self.eff.kernel_scale
            return {"memory": 0.0, "compute": work * layers_share, "fixed": self.fixed_s * layers_share,
                    "comm": (k["comm"] * self.eff.kernel_scale + self.layers * gather) * layers_share,
                    "launch": self.launch_s * layers_share if eager else 0.0, "overhead": self.overhead_s}
        comm = gather + self._allreduce_s(group, self.attn_tp) if self.dp > 1 else 2 * self._allreduce_s(tokens,
                                                                                                          self.tp)
        expert_bytes, expert_s = self._moe(tokens)
        kv = self.cell * (rank_ctx + prefill_ctx / self.dp)
        mem = (expert_bytes + self.dense_bytes + self.lm_bytes + kv) / self.bytes_per_s
        compute = (expert_s + self._gemm_s(group * self.attn_proj_flops, group, self.rest_fmt)
                   + self._gemm_s(tokens * self.mlp_flops, tokens, self.rest_fmt)
                   + self._gemm_s(samples * self.lm_flops, samples, "bf16")
                   + self.decode_attn * rank_ctx * v / self.peak["bf16"]
                   + self.prefill_attn * rank_pairs / self.attn_peak)
        gpu = layers_share * self.eff.roofline_scale  # a GPU without tables: its own scale of the GPU time
        return {"memory": mem * gpu, "compute": compute * gpu, "fixed": self.fixed_s * gpu,
                "comm": self.layers * comm * gpu, "launch": self.launch_s * layers_share if eager else 0.0,
                "overhead": self.overhead_s}

    def _time(self, p: dict[str, float]) -> float:
        core = max(p["memory"], p["compute"]) + (1 - self.eff.overlap) * min(p["memory"], p["compute"])
        return max(core + p["fixed"] + p["comm"], p["launch"]) + p["overhead"]

    def step_time(self, decode_batch: int, decode_ctx: int, prefill_tokens: int = 0, prefill_attn: float = 0.0,
                  prefill_ctx: int = 0, busiest: tuple[int, float] | None = None) -> float:
        """One scheduler step; with MTP, its decode part drafts and verifies (accept_length tokens per request)."""
        if decode_batch <= 0 and prefill_tokens <= 0:
            return 0.0
        decode_only = not (prefill_tokens or prefill_attn or prefill_ctx) and (busiest is None or not any(busiest))
        if decode_only and self._last_decode[0] == (decode_batch, decode_ctx):
            return self._last_decode[1]  # the scheduler prices a decode step, then takes it alone: asked twice
        if decode_only and self.fast_decode and decode_batch > 0 and decode_ctx > 0 and not self.steps:
            t = self._decode_on_tables(decode_batch, decode_ctx)
            if t is not None:
                self._last_decode = ((decode_batch, decode_ctx), t)
                return t
        t = self._time(self.parts(decode_batch, decode_ctx, prefill_tokens, prefill_attn, prefill_ctx,
                                  busiest=busiest))
        if self.steps and decode_batch:
            t += self.draft_time(decode_batch, decode_ctx)
        # the serving processes stream every token on the CPU beside the GPU: with many streams they set the pace
        t = max(t, decode_batch * self.accept_length * self.stream_s)
        if decode_only:
            self._last_decode = ((decode_batch, decode_ctx), t)
        return t

    def _decode_on_tables(self, n: int, ctx: int) -> float | None:
        """step_time of a decode step of n requests (no MTP) on the kernel tables, None where they do not price its
        attention. Of parts()'s terms only attention changes with the context, so the others are taken once per
        batch size from parts()'s own code and the rest is parts() and _time()'s arithmetic in their order: the
        same floats (a long agentic simulation prices ~130,000 decode steps; it took 1.77 s, now 1.52 s)."""
        terms = self._decode_terms.get(n)
        if terms is None:
            said = self.kstep._said.get("decode") if self.kstep is not None else None
            if said is None:
                return None  # the first step says where its attention comes from; one without a table never comes
            rank = math.ceil(n / self.dp) if self.dp > 1 else n
            p, k = self.parts(n, ctx), self.kstep.last
            terms = self._decode_terms[n] = (said, rank, rank * self.verify, k["gemm"], k["moe"], p["fixed"],
                                             p["comm"], p["launch"], p["overhead"],
                                             n * self.accept_length * self.stream_s)
        said, rank, rows, gemm, moe, fixed, comm, launch, overhead, floor = terms
        attention = self.layers * said(max(rows, 1), max(ctx * rank / n / rank, 1))[0]
        compute = (attention + gemm + moe) * self.eff.kernel_scale
        core = max(0.0, compute) + (1 - self.eff.overlap) * min(0.0, compute)
        return max(max(core + fixed + comm, launch) + overhead, floor)

    def draft_time(self, decode_batch: int, decode_ctx: int) -> float:
        """MTP's draft work in one decode step, as SGLang 0.5.23's EAGLE worker runs it (eagle_worker_v2.py): steps - 1
        draft decodes of the one NextN layer over the batch, then the draft extend over every verified token
        (batch x draft tokens: `_draft_extend_for_decode`), each pass with the full lm_head over the batch."""
        one = 1 / self.layers
        decode = self._time(self.parts(decode_batch, decode_ctx, verify=1, layers_share=one)) - self.overhead_s
        extend = self._time(self.parts(decode_batch, decode_ctx, verify=self.verify, layers_share=one)) \
            - self.overhead_s
        head = self._roofline_op("lm_head", {"rows": decode_batch, "n": self.dep.model.vocab_size // self.tp,
                                             "k": self.hidden, "fmt": "bf16"})
        return (self.steps - 1) * decode + extend + self.steps * head

    def decode_step_time(self, ctx_lens: list[int]) -> float:
        """One decode step of a batch whose sequences have these context lengths."""
        return self.step_time(len(ctx_lens), sum(ctx_lens))

    def prefill_time(self, tokens: int, prefix: int = 0, chunk: int | None = None) -> float:
        """Prefill of `tokens` new tokens after `prefix` cached ones, in chunks of `chunk` run back to back."""
        chunk = chunk or tokens
        total, done = 0.0, 0
        while done < tokens:
            n = min(chunk, tokens - done)
            pairs = prefill_pairs(n, prefix + done)
            total += self.step_time(0, 0, n, pairs, prefix + done + n, busiest=(n, pairs))
            done += n
        return total

    def decode_throughput(self, batch: int, context: int) -> float:
        """Output tokens per second of the instance decoding `batch` sequences of `context` tokens each."""
        return batch * self.accept_length / self.step_time(batch, batch * context)


def attention_priced_by(dep: Deployment) -> list[str]:
    """What a deployment's attention backend changes in its step times: the measured surfaces its steps read (their
    sources), or the roofline's. Two backends that both lack a table are priced alike, so an answer cached for one
    answers for the other (the plan searches every backend that keeps FP8 scales)."""
    if os.environ.get("CAPBENCH_PERF") == "roofline":
        return ["roofline (CAPBENCH_PERF)"]
    if not kernels.versions(dep.gpu.id, "moe"):
        return ["roofline"]
    out = []
    for phase in ("decode", "prefill"):
        got = kernels.attention_surface(dep.model, dep.gpu.id, dep.attention or "triton", dep.kv_dtype, phase,
                                        dep.tp // dep.dp, _version(dep.sglang))
        out.append("roofline" if got is None else got[1])
    return out


def _version(v: str | None) -> str | None:
    """A stated SGLang version (a corpus case's, a deployment's); None (0.5.23's default) when not stated."""
    return v if v and v[:1].isdigit() else None


def usd_per_million(price_per_gpu_hour: float, gpus: int, output_tps: float) -> float | None:
    """$ per 1M output tokens of `gpus` GPUs delivering output_tps: the one formula every view uses."""
    if output_tps <= 0:
        return None
    return price_per_gpu_hour / 3600 * gpus / output_tps * 1e6


def cost_per_million_tokens(dep: Deployment, tokens_per_s: float) -> float:
    """$ per 1M output tokens: GPU $/s * GPUs / output tok/s * 1e6."""
    cost = usd_per_million(dep.gpu.price_per_gpu_hour, dep.tp, tokens_per_s)
    return float("inf") if cost is None else cost


def summary(dep: Deployment, context: int = 4096, eff: Efficiency | None = None) -> dict:
    """Headline figures: single-stream speed and the throughput at the largest batch that fits `context`."""
    pm, cap = PerfModel(dep, eff), capacity(dep, with_ratios=False)
    batch = max(1, min(cap.max_running_requests, cap.kv_pool_tokens_total // max(context, 1)))
    tput = pm.decode_throughput(batch, context)
    return {
        "single_stream_tok_s": pm.decode_throughput(1, context),
        "max_batch_at_context": batch,
        "decode_tok_s_at_max_batch": tput,
        "tpot_ms_at_max_batch": 1e3 * batch / tput,
        "prefill_tok_s": context / pm.prefill_time(context),
        "usd_per_million_output_tokens": cost_per_million_tokens(dep, tput),
    }
