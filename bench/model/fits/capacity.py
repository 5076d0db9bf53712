"""SGLang 0.5.23's memory arithmetic: how many KV-cache tokens, sequences and contexts fit.

Reproduced from the wheel (paths under sglang/srt/):
- cell size: model_executor/pool_configurator.py DefaultPoolConfigurator._compute_cell_size
  MHA/GQA: kv_heads_per_gpu * (head_dim + v_head_dim) * layers * elem_bytes, where
  kv_heads_per_gpu = max(1, kv_heads // attn_tp) (configs/model_config.py get_num_kv_heads);
  MLA: (kv_lora_rank + qk_rope_head_dim) * layers * elem_bytes, whole on every rank.
  EAGLE/MTP adds int(cell * draft_layers / layers) (DefaultPoolConfigurator.__init__).
- pool tokens: calculate_pool_sizes: available // cell // page_size * page_size, where available is
  mem_cache/kv_cache_configurator.py _profile_available_bytes: free memory after loading the weights minus
  pre_model_load_free * (1 - mem_fraction_static), i.e. pre_model_load_free * f - weights.
- max running requests: KVCacheConfigurator.resolve_max_num_reqs.
- default mem_fraction_static: arg_groups/memory_hook.py handle_gpu_memory_settings + reserve_for_graph_mb, then
  on ROCm with the aiter backend and a context over 8192 tokens, times 0.85 (attention_hook.py).

What is an estimate rather than SGLang's arithmetic: the memory held before the weights load (CUDA context,
NCCL buffers: `reserved_before_load_gib` in data/gpus.yaml) and the weight bytes, which are counted from the
architecture rather than read from a checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from bench.errors import BadInput
from bench.model.fits import backend, formats
from bench.model.fits.catalog import GPU, Model

KV_DTYPES = {"bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}
# native; the whole model in BF16 or FP8; else the routed experts in that format (data/expert_formats.yaml), the
# rest as shipped
WEIGHTS = ("native", "bf16", "fp8", "fp8-block128", "int4-g32", "int4-g128", "w4a8-g128", "nvfp4", "nvfp4-w4a16",
           "mxfp4", "mxfp4-w4a16", "nf4")
GIB = 1 << 30
MIB = 1 << 20


def bytes_per_weight(fmt: str) -> float:
    """Bytes per weight with its scales (data/expert_formats.yaml): bf16 = 2; fp8 block-128 = 1 + one fp32 scale per
    128x128 block; INT4 = 0.5 + one bf16 scale per group; NVFP4 = 0.5 + one fp8 scale per 16; MXFP4 = 0.5 + 1/32."""
    try:
        return formats.bytes_per_weight(fmt)
    except BadInput:
        raise BadInput(f"unknown weight format '{fmt}'") from None


def weight_formats(model: Model, weights: str) -> tuple[str, str]:
    """(routed experts, everything else linear) for a --weights choice. An expert format leaves the rest as shipped."""
    if weights == "native":
        return model.native_weights.experts, model.native_weights.rest
    if weights == "bf16":
        return "bf16", "bf16"
    if weights == "fp8":
        return "fp8-block128", "fp8-block128"
    if weights in WEIGHTS:
        return weights, model.native_weights.rest
    raise BadInput(f"unknown weights '{weights}'; valid: {', '.join(WEIGHTS)}")


def cell_bytes(model: Model, kv_dtype: str, attn_tp: int, mtp: bool = False) -> int:
    """KV bytes per token on one GPU (SGLang's cell_size)."""
    elem = KV_DTYPES[kv_dtype]
    if model.attention == "mla":
        cell = (model.kv_lora_rank + model.qk_rope_head_dim) * model.layers * elem
    else:
        heads = max(1, model.kv_heads // attn_tp)
        cell = heads * (model.head_dim + model.v_head_dim) * model.layers * elem
    if mtp:
        cell += int(cell * model.mtp_layers / model.layers)
    return cell


@dataclass(frozen=True)
class WeightBytes:
    """Weight bytes on one GPU, by part."""

    routed_experts: float
    shared_experts: float
    attention: float
    dense_mlp: float
    embeddings: float
    other: float

    @property
    def total(self) -> float:
        return (self.routed_experts + self.shared_experts + self.attention + self.dense_mlp
                + self.embeddings + self.other)


def weight_bytes(model: Model, weights: str, tp: int, dp: int = 1, mtp: bool = False) -> WeightBytes:
    """Per-GPU weight bytes. Experts, shared experts, dense MLPs and the vocab are split over tp (TP or EP gives
    the same bytes per GPU); attention over attn_tp = tp // dp, with MLA's q_a/kv_a projections replicated
    (ReplicatedLinear in SGLang's deepseek_v2.py) and GQA's KV heads replicated past tp == kv_heads."""
    experts_fmt, rest_fmt = weight_formats(model, weights)
    b_exp, b_rest = bytes_per_weight(experts_fmt), bytes_per_weight(rest_fmt)
    attn_tp = tp // dp
    h = model.hidden_size
    moe_layers = model.moe_layers + (model.mtp_layers if mtp else 0)
    attn_layers = model.layers + (model.mtp_layers if mtp else 0)
    expert_params = 3 * h * model.moe_intermediate_size
    if model.attention == "mla":
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        replicated = h * model.q_lora_rank + h * (model.kv_lora_rank + model.qk_rope_head_dim)
        split = (model.q_lora_rank * model.attention_heads * qk
                 + model.kv_lora_rank * model.attention_heads * (model.qk_nope_head_dim + model.v_head_dim)
                 + model.attention_heads * model.v_head_dim * h)
        attn_per_gpu = replicated + split / attn_tp
    else:
        kv_heads_per_gpu = max(1, model.kv_heads // attn_tp)
        q_and_o = 2 * h * model.attention_heads * model.head_dim / attn_tp
        attn_per_gpu = q_and_o + 2 * h * kv_heads_per_gpu * model.head_dim
    mtp_proj = 2 * h * h * model.mtp_layers if mtp else 0
    router = h * model.routed_experts * moe_layers
    norms = 4 * h * attn_layers
    return WeightBytes(
        routed_experts=moe_layers * model.routed_experts * expert_params / tp * b_exp,
        shared_experts=moe_layers * model.shared_experts * expert_params / tp * b_rest,
        attention=attn_layers * attn_per_gpu * b_rest,
        dense_mlp=model.first_dense_layers * expert_params * model.dense_intermediate_size
        / model.moe_intermediate_size / tp * b_rest,
        embeddings=2 * model.vocab_size * h / tp * 2.0,
        other=(router + norms + mtp_proj / tp) * 2.0,
    )


def total_params(model: Model) -> float:
    """Parameters of the checkpoint's main model (no MTP layers), for checking against the published total."""
    return weight_bytes(model, "bf16", tp=1).total / 2.0


def memory_tier(gpu: GPU, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode cuda-graph max_bs) by GPU memory, as handle_gpu_memory_settings sets them."""
    mem = gpu.memory_mib_reported
    if mem < 20 * 1024:
        return 2048, 8
    if mem < 35 * 1024:
        return 4096, 48 if tp < 4 else 160
    if mem < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if mem < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def _prefill_graph_sizes(max_bs: int) -> list[int]:
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512)))
    return [s for s in sizes if s <= max_bs]


def aiter_attention(model: Model, gpu: GPU, tp: int) -> bool:
    """Whether ROCm's default attention backend is aiter (arg_groups/model_override_base.py get_default_attn_backend):
    always for MHA/GQA; for MLA only with 16 or 128 KV heads per GPU (over the full tp), else triton."""
    if gpu.vendor != "amd":
        return False
    return model.attention != "mla" or max(1, model.kv_heads // tp) in (16, 128)


def mem_fraction_static(model: Model, gpu: GPU, tp: int, dp: int = 1, pp: int = 1,
                        context_len: int | None = None) -> float:
    """SGLang's default --mem-fraction-static: (gpu_mem - reserved) / gpu_mem, reserved in MiB; times 0.85 when the
    attention backend is aiter and the context (default: the model's maximum) is longer than 8192 tokens."""
    chunked_prefill, max_bs = memory_tier(gpu, tp)
    reserved = 512 + max(chunked_prefill, 2048) * 1.5 + tp * pp / 8 * 1024
    graph = max_bs * 2
    if dp > 1:  # DP attention pads the decode graph per dp rank
        graph += max_bs * dp * 3 + (max_bs * dp * 1.5 if max_bs > 300 else 0)
    if gpu.vendor == "nvidia":  # breakable prefill graphs are on by default on CUDA only
        if model.attention == "mla":
            graph += 1.5 * 1024
        else:
            graph += len(_prefill_graph_sizes(chunked_prefill)) * 8
    reserved += graph
    if gpu.memory_mib_reported > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    frac = round((gpu.memory_mib_reported - reserved) / gpu.memory_mib_reported, 3)
    if aiter_attention(model, gpu, tp) and (context_len or model.max_context) > 8192:
        frac *= 0.85  # arg_groups/attention_hook.py handle_attention_backend_compatibility; not re-rounded
    return frac


def max_running_requests(tokens: int, context_len: int, given: int | None = None, dp: int = 1) -> int:
    """Per DP rank, as KVCacheConfigurator.resolve_max_num_reqs: the given --max-running-requests split over the DP
    ranks, else SGLang's estimate from the pool; never more than half the pool's tokens."""
    estimated = max(1, given // dp) if given else max(min(int(tokens / context_len * 512), 4096), 2048)
    return min(estimated, tokens // 2)


@dataclass(frozen=True)
class Deployment:
    """One SGLang instance: a model on tp GPUs (dp > 1 means DP attention inside those tp GPUs)."""

    model: Model
    gpu: GPU
    tp: int
    dp: int = 1
    kv_dtype: str = "bf16"
    weights: str = "native"
    context: int | None = None
    mem_fraction: float | None = None
    page_size: int | None = None  # None: SGLang's default on this GPU
    mtp: bool = False  # speculative decoding with the model's MTP layer (EAGLE): its KV, its draft steps
    ep: int = 1  # expert-parallel size (SGLang --ep-size): experts split over ep groups of tp/ep GPUs
    mtp_steps: int = 3  # draft tokens per step (--speculative-num-steps, top-k 1)
    accept_length: float | None = None  # tokens kept per step on average; None: from the calibrated accept rate
    max_running: int | None = None  # SGLang --max-running-requests (default: SGLang's; 48 with MTP)
    attention: str | None = None  # --attention-backend; None: the one a launch line names (backend.launch_backend)
    sglang: str | None = None  # the SGLang version it runs (its kernel tables price it); None: 0.5.23, plans' own

    def __post_init__(self) -> None:
        if self.attention is None and self.kv_dtype in KV_DTYPES:
            object.__setattr__(self, "attention", backend.launch_backend(self.model, self.gpu, self.kv_dtype, self.tp))
        if self.page_size is None:
            forced = backend.backend(self.attention).page_size if self.attention else None
            object.__setattr__(self, "page_size", forced or self.gpu.default_page_size)
        # wide EP (DP attention and EP over every GPU, EPLB's redundant experts) runs on any GPU count, e.g. 72
        if self.tp < 1 or (self.tp & (self.tp - 1) and not self.dp == self.ep == self.tp):
            raise BadInput(f"--tp must be a power of two, got {self.tp}")
        if self.dp < 1 or self.tp % self.dp:
            raise BadInput(f"--dp must divide --tp ({self.tp}), got {self.dp}")
        if self.kv_dtype not in KV_DTYPES:
            raise BadInput(f"unknown --kv-dtype '{self.kv_dtype}'; valid: {', '.join(KV_DTYPES)}")
        weight_formats(self.model, self.weights)
        if self.context is not None and not 1 <= self.context <= self.model.max_context:
            raise BadInput(f"--context {self.context} is beyond {self.model.id}'s maximum of "
                           f"{self.model.max_context} tokens")
        if self.mem_fraction is not None and not 0 < self.mem_fraction < 1:
            raise BadInput(f"--mem-fraction must be between 0 and 1, got {self.mem_fraction}")
        if self.page_size < 1:
            raise BadInput(f"--page-size must be positive, got {self.page_size}")
        if self.mtp and not self.model.mtp_layers:
            raise BadInput(f"{self.model.id} has no MTP layers")
        if self.max_running is not None and self.max_running < 1:
            raise BadInput(f"--max-running-requests must be positive, got {self.max_running}")
        if self.ep < 1 or self.tp % self.ep:
            raise BadInput(f"--ep must divide --tp ({self.tp}), got {self.ep}")
        if self.mtp and not 1 <= self.mtp_steps <= 8:
            raise BadInput(f"MTP draft steps must be 1 to 8, got {self.mtp_steps}")
        if self.accept_length is not None and not 1 <= self.accept_length <= self.mtp_steps + 1:
            raise BadInput(f"accept length must be between 1 and steps + 1, got {self.accept_length}")

    @property
    def context_len(self) -> int:
        return self.context or self.model.max_context

    @property
    def nodes(self) -> int:
        return math.ceil(self.tp / self.gpu.gpus_per_node)


@dataclass
class Capacity:
    model: str
    gpu: str
    tp: int
    dp: int
    nodes: int
    kv_dtype: str
    weights: str
    context: int
    page_size: int
    mem_fraction_static: float
    kv_bytes_per_token_per_gpu: int
    weight_bytes_per_gpu: float
    weight_breakdown: dict
    kv_budget_bytes_per_gpu: float
    kv_pool_tokens: int
    kv_pool_tokens_total: int
    max_running_requests: int
    max_concurrent_sequences_at_context: int
    longest_context: int
    fits: bool
    short_by_bytes_per_gpu: float
    ratios: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def capacity(dep: Deployment, with_ratios: bool = True) -> Capacity:
    model, gpu = dep.model, dep.gpu
    attn_tp = dep.tp // dep.dp
    frac = dep.mem_fraction or mem_fraction_static(model, gpu, dep.tp, dep.dp, context_len=dep.context_len)
    pre_load_free = gpu.memory_mib_reported * MIB - gpu.reserved_before_load_gib * GIB
    wb = weight_bytes(model, dep.weights, dep.tp, dep.dp, dep.mtp)
    budget = pre_load_free * frac - wb.total
    cell = cell_bytes(model, dep.kv_dtype, attn_tp, dep.mtp)
    tokens = int(max(budget, 0) // cell) // dep.page_size * dep.page_size
    fits = tokens >= dep.page_size and tokens >= 2
    # speculative decoding resets the default to 48 (arg_groups/speculative_hook.py _handle_eagle_family)
    given = dep.max_running or (48 if dep.mtp else None)
    running = max_running_requests(tokens, dep.context_len, given, dep.dp) if fits else 0
    cap = Capacity(
        model=model.id, gpu=gpu.id, tp=dep.tp, dp=dep.dp, nodes=dep.nodes, kv_dtype=dep.kv_dtype,
        weights=dep.weights, context=dep.context_len, page_size=dep.page_size, mem_fraction_static=frac,
        kv_bytes_per_token_per_gpu=cell, weight_bytes_per_gpu=wb.total, weight_breakdown=asdict(wb),
        kv_budget_bytes_per_gpu=budget, kv_pool_tokens=tokens, kv_pool_tokens_total=tokens * dep.dp,
        max_running_requests=running * dep.dp,
        max_concurrent_sequences_at_context=min(running, tokens // dep.context_len) * dep.dp,
        longest_context=min(tokens, model.max_context), fits=fits,
        short_by_bytes_per_gpu=0.0 if fits else cell * max(dep.page_size, 2) - budget,
    )
    if with_ratios:
        base = capacity(replace(dep, kv_dtype="bf16", weights="native"), with_ratios=False)
        cap.ratios = {
            key: (getattr(cap, key) / getattr(base, key)) if getattr(base, key) else None
            for key in ("kv_pool_tokens", "max_concurrent_sequences_at_context", "longest_context",
                        "weight_bytes_per_gpu", "max_running_requests")
        }
    return cap


def compare(dep: Deployment) -> list[Capacity]:
    """The four-way matrix: BF16 vs FP8 KV, native vs INT4 experts (g32). A model that ships INT4 experts
    (Kimi K2 Thinking, K2.5) is compared with the FP8 block-128 format its sibling K2 Instruct ships."""
    if dep.model.native_weights.experts.startswith("int4"):
        pairs = ("fp8", "native")
    else:
        pairs = ("native", "int4-g32")
    return [capacity(replace(dep, kv_dtype=kv, weights=w)) for w in pairs for kv in ("bf16", "fp8_e4m3")]
