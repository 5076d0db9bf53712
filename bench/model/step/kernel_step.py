"""A scheduler step priced operator by operator from the measured kernel tables (bench/model/step/kernels.py), on one
GPU of the instance, for its SGLang version and attention backend:

  layers * (attention: decode batch at its mean context + the prefill chunk's pairs
            + the dense GEMMs of attention (projections) and of the shared expert
            + two all-reduces of the step's hidden states over attention TP)
  + MoE layers * routed experts (tokens, format, EP)  + dense layers * dense MLP GEMMs  + lm_head GEMM

An operator no table covers is priced by `fallback` (the roofline of perfmodel.py, the same arithmetic it uses for
the whole step) and named in `unmeasured`: "no kernel measurement for ...: roofline". The GPU time of the kernels
the tables do not time (norms, rope, router, activation quantisation) and the CPU terms stay with perfmodel.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bench.model.fits.capacity import Deployment, weight_formats
from bench.model.step import kernels

# Dense GEMMs are priced by the roofline, not by gemm.parquet: its small-batch latencies (DeepGEMM FP8 block-128
# 13-18 us a call at m = 1 on Blackwell, 3.5-4 us on Hopper) add up to more than the published end-to-end TPOT
# of DeepSeek-R1 on B200 (InferenceX, c1), so the collector's GEMM timings are not what SGLang's decode graph runs;
# leave one source out, pricing them from the table took output tok/s from 23 % to 31 % median error (46 cases
# beyond 1.5x against 32): docs/planning.md. kernels.gemm_time() stays for what reads them.
TABLE_GEMMS = False
# Kernels a layer runs that an operator term prices (attention, 2 all-reduces and the MoE's 4 from the tables; the
# projections' and shared expert's GEMMs by the roofline): MLA 12 of its 22, GQA 11 of 18. The others (norms, rope,
# router, quantisation) cost kernel_us each. Counting kernel_us for the GEMMs too took TPOT from 29 % to 35 % median
# error out of sample (docs/planning.md).
TIMED = {"mla": 12, "gqa": 11}


@dataclass
class Gemm:
    name: str
    n: int
    k: int
    fmt: str
    per: str  # rows: "group" (this DP group's tokens), "tokens" (all the step's), "samples" (lm_head)


@dataclass
class KernelStep:
    dep: Deployment
    version: str | None
    fallback: Callable[[str, dict], float]  # (operator, its arguments) -> roofline seconds
    unmeasured: dict[str, str] = field(default_factory=dict)  # operator -> the sentence said
    sources: dict[str, str] = field(default_factory=dict)  # operator -> the table it came from

    def __post_init__(self) -> None:
        d, m = self.dep, self.dep.model
        self.gpu, self.tp, self.dp, self.ep = d.gpu.id, d.tp, d.dp, d.ep
        self.attn_tp = d.tp // d.dp
        self.backend = d.attention or "triton"
        self.experts_fmt, self.rest_fmt = weight_formats(m, d.weights)
        heads = m.attention_heads // self.attn_tp
        h, rest = m.hidden_size, self.rest_fmt
        if m.attention == "mla":
            self.attn = [Gemm("q_a/kv_a projection", m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim, h, rest,
                              "group"),
                         Gemm("q_b projection", heads * (m.qk_nope_head_dim + m.qk_rope_head_dim), m.q_lora_rank,
                              rest, "group"),
                         Gemm("o_proj", h, heads * m.v_head_dim, rest, "group")]
        else:
            kv = max(1, m.kv_heads // self.attn_tp)
            self.attn = [Gemm("qkv projection", (heads + 2 * kv) * m.head_dim, h, rest, "group"),
                         Gemm("o_proj", h, heads * m.head_dim, rest, "group")]
        shared = m.moe_intermediate_size * m.shared_experts // d.tp
        self.shared = [Gemm("shared expert gate-up", 2 * shared, h, rest, "tokens"),
                       Gemm("shared expert down", h, shared, rest, "tokens")] if shared else []
        dense = m.dense_intermediate_size // d.tp
        self.dense = [Gemm("dense MLP gate-up", 2 * dense, h, rest, "tokens"),
                      Gemm("dense MLP down", h, dense, rest, "tokens")] if m.first_dense_layers else []
        self.lm_head = Gemm("lm_head", m.vocab_size // d.tp, h, "bf16", "samples")
        self.layers, self.dense_layers = m.layers, m.first_dense_layers
        self.moe_layers = m.layers - m.first_dense_layers
        self._memo: dict[tuple, float] = {}  # a GEMM's or the MoE's seconds by rows: decode steps repeat them
        self._surfaces: dict[str, tuple | None] = {}  # attention's measured surface by phase
        self._rest: dict[tuple, tuple[float, float, float]] = {}  # a step's GEMM, MoE and all-reduce seconds
        self._said: dict[str, kernels.Surface] = {}  # those whose source is said: a step asks for them every time

    # ---- one operator: the table, else the roofline (said once per operator)
    def _op(self, name: str, got: tuple[float, str] | None, what: str, args: dict) -> float:
        if got is not None:
            self.sources.setdefault(name, got[1])
            return got[0]
        self.unmeasured.setdefault(name, kernels.no_table(what))
        return self.fallback(name, args)

    def gemm(self, g: Gemm, rows: float) -> float:
        if rows <= 0:
            return 0.0
        key = (g.name, round(rows, 1))
        if key not in self._memo:
            self._memo[key] = self._gemm(g, rows)
        return self._memo[key]

    def gemms(self, part: str, rows: float) -> float:
        """The sum of one part's GEMMs (attn, shared, dense) at `rows`: each GEMM is memoised by its rounded rows
        and called from this part only, so the sum is too (one lookup a step instead of one a GEMM)."""
        key = ("sum", part, round(rows, 1))
        if key not in self._memo:
            self._memo[key] = sum(self.gemm(g, rows) for g in getattr(self, part))
        return self._memo[key]

    def _gemm(self, g: Gemm, rows: float) -> float:
        if not TABLE_GEMMS:
            return self.fallback(g.name, {"rows": rows, "n": g.n, "k": g.k, "fmt": g.fmt})
        got = kernels.gemm_time(self.gpu, g.fmt, rows, g.n, g.k, self.version)
        return self._op(g.name, got, f"{g.fmt} GEMM on {self.gpu}", {"rows": rows, "n": g.n, "k": g.k, "fmt": g.fmt})

    def attention(self, phase: str, batch: float, length: float, args: dict) -> float:
        if batch <= 0 or length <= 0:
            return 0.0
        said = self._said.get(phase)
        if said is not None:  # measured and said already: only the time is new
            return said(max(batch, 1), max(length, 1))[0]
        m, name = self.dep.model, f"attention {phase}"
        if phase not in self._surfaces:  # looked up once: a step asks for it every time
            self._surfaces[phase] = kernels.attention_surface(m, self.gpu, self.backend, self.dep.kv_dtype, phase,
                                                              self.attn_tp, self.version)
        surface = self._surfaces[phase]
        if surface is not None and name in self.sources:
            self._said[phase] = surface[0]
            return surface[0](max(batch, 1), max(length, 1))[0]
        got = kernels.attention_time(m, self.gpu, self.backend, self.dep.kv_dtype, phase, batch, length, self.attn_tp,
                                     self.version)
        what = f"{self.backend} {m.attention.upper()} {phase} with {self.dep.kv_dtype} KV on {self.gpu}"
        return self._op(f"attention {phase}", got, what, args)

    def moe(self, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        key = ("MoE", round(tokens, 1))
        if key not in self._memo:
            self._memo[key] = self._moe(tokens)
        return self._memo[key]

    def _moe(self, tokens: float) -> float:
        got = kernels.moe_time(self.dep.model, self.gpu, self.experts_fmt, tokens, self.ep, self.tp, self.version)
        if got is None and kernels.moe_time(self.dep.model, self.gpu, self.experts_fmt, 1, self.ep, self.tp,
                                            self.version):
            self.unmeasured.setdefault("MoE beyond", f"MoE steps past {kernels.BEYOND:g}x the table's largest "
                                                     f"token count on {self.gpu}: roofline")
            return self.fallback("MoE", {"tokens": tokens})
        return self._op("MoE", got, f"{self.experts_fmt} MoE on {self.gpu} at EP {self.ep}", {"tokens": tokens})

    def allreduce(self, tokens: float, graph: bool) -> float:
        if self.attn_tp <= 1 or tokens <= 0:
            return 0.0
        key = ("all-reduce", tokens, graph)  # exact: decode steps of one batch size repeat it
        if key not in self._memo:
            self._memo[key] = self._allreduce(tokens, graph)
        return self._memo[key]

    def _allreduce(self, tokens: float, graph: bool) -> float:
        nbytes = tokens * self.dep.model.hidden_size * 2
        got = kernels.allreduce_time(self.gpu, self.attn_tp, nbytes, graph, self.version)
        return self._op("all-reduce", got, f"all-reduce over {self.attn_tp} on {self.gpu}",
                        {"tokens": tokens, "n": self.attn_tp})

    # ---- a step
    def step(self, decode_batch: float, decode_ctx: float, verify: int, group: float, tokens: float,
             samples: float, rank_prefill: float, rank_pairs: float, graph: bool) -> dict[str, float]:
        """Seconds of a step's table-priced operators on one GPU, by kind. decode_batch / decode_ctx: this DP
        group's decoding requests and their summed contexts; group: its tokens; tokens: the step's tokens over all
        groups; rank_prefill / rank_pairs: its prefill tokens and attention pairs."""
        attn = 0.0
        if decode_batch > 0:
            mean_ctx = decode_ctx / decode_batch
            attn += self.attention("decode", decode_batch * verify, mean_ctx,
                                   {"batch": decode_batch, "ctx": decode_ctx, "verify": verify})
        if rank_prefill > 0:
            equal = max(rank_prefill, (2 * rank_pairs) ** 0.5)  # one prompt of as many causal pairs
            attn += self.attention("prefill", 1, equal, {"pairs": rank_pairs}) * rank_pairs / (equal * equal / 2)
        key = (group, tokens, samples, graph)
        rest = self._rest.get(key)
        if rest is None:  # exact: every step of one batch size (and no prefill) repeats it
            proj, shared, dense = self.gemms("attn", group), self.gemms("shared", tokens), self.gemms("dense", tokens)
            rest = self._rest[key] = (self.layers * proj + self.moe_layers * shared + self.dense_layers * dense
                                      + self.gemm(self.lm_head, samples), self.moe_layers * self.moe(tokens),
                                      self.layers * 2 * self.allreduce(group, graph))
        self.last = {"attention": self.layers * attn, "gemm": rest[0], "moe": rest[1], "comm": rest[2]}
        return self.last
